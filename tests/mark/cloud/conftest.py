"""Fixtures the aws-adapter tests share: one stock AMI, a fresh cluster name per test."""

from __future__ import annotations

import uuid

import boto3
import pytest

REGION = "us-east-1"


@pytest.fixture(scope="session")
def ami(moto_endpoint: str) -> str:
    """One of moto's stock AMIs (looked up once: moto renders all ~1,300 every call)."""
    ec2 = boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=moto_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    images = ec2.describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-*"]}]
    )
    return str(images["Images"][0]["ImageId"])


@pytest.fixture
def cluster() -> str:
    """Each test its own cluster, so tests sharing the moto server never see each other."""
    return f"t-{uuid.uuid4().hex[:10]}"
