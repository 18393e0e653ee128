"""Deploying mark to AWS: the CloudFormation template and the artifacts it boots from.

``template`` reads ``infra/mark.yaml`` (shipped as ``mark/deploy/data/mark.yaml``,
a link to that one file) and fills in parameter defaults; ``package`` builds the
Lambda zip and the agent bundle the stack's instances and function start from.
"""
