"""infra/mark.yaml read as text, no stack: lint-clean, no unjustified IAM wildcard, and
every parameter that reaches a bootstrap shell pattern-checked.

A wildcard (an action ``*``, ``svc:*`` or any ``*`` in an action name, ``NotAction``,
``NotResource``, or ``Resource: "*"``) fails the build unless ``JUSTIFIED`` names the
statement (resource and ``Sid``), its exact actions, and the reason. A reviewer reads
the reason here; the template carries the same reason as a comment on the statement.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mark.deploy import template as tpl

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "infra" / "mark.yaml"


@dataclass(frozen=True)
class Justified:
    actions: frozenset[str]
    why: str


NO_RESOURCE_LEVEL = "IAM has no resource-level permission for these actions: '*' is all they take"

JUSTIFIED: dict[tuple[str, str], Justified] = {
    ("ControllerRole", "ReadFleetAndPrices"): Justified(
        frozenset(
            {
                "ec2:DescribeInstances",
                "ec2:DescribeInstanceStatus",
                "ec2:DescribeSpotPriceHistory",
                "ec2:DescribeVolumes",
            }
        ),
        NO_RESOURCE_LEVEL + " (reads only).",
    ),
    ("ControllerRole", "PublishMarkMetrics"): Justified(
        frozenset({"cloudwatch:PutMetricData"}),
        NO_RESOURCE_LEVEL + "; the cloudwatch:namespace condition keeps it to mark's own.",
    ),
}
"""Statements allowed a wildcard: (logical id, Sid) -> the exact actions, and why."""


def _template() -> dict[str, Any]:
    return tpl.load(TEMPLATE.read_text())


def _branches(value: Any) -> Iterator[Any]:
    """Every value a template expression may take: both sides of each ``Fn::If``."""
    if isinstance(value, Mapping) and set(value) == {"Fn::If"}:
        _, yes, no = value["Fn::If"]
        yield from _branches(yes)
        yield from _branches(no)
    elif isinstance(value, Mapping) and value == {"Ref": "AWS::NoValue"}:
        return
    else:
        yield value


def _listed(value: Any) -> list[Any]:
    out: list[Any] = []
    for v in _branches(value):
        out.extend(x for item in (v if isinstance(v, list) else [v]) for x in _branches(item))
    return out


def _documents(resource: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    props = resource.get("Properties", {})
    if resource["Type"] == "AWS::IAM::Role":
        yield props["AssumeRolePolicyDocument"]
        for policy in props.get("Policies", []):
            yield policy["PolicyDocument"]
    elif "PolicyDocument" in props:  # AWS::IAM::Policy, ManagedPolicy, queue and bucket policies
        yield props["PolicyDocument"]


def statements(template: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every policy statement in the template, with the logical id that holds it."""
    for logical, resource in template["Resources"].items():
        for doc in _documents(resource):
            for st in _listed(doc["Statement"]):
                yield logical, st


def wildcards(st: Mapping[str, Any]) -> list[str]:
    """What in a statement is a wildcard grant, said in words; empty if nothing is."""
    found = [f"{key} (grants all but a list)" for key in ("NotAction", "NotResource") if key in st]
    found += [f"action {a!r}" for a in _listed(st.get("Action", [])) if "*" in str(a)]
    if "*" in _listed(st.get("Resource", [])):
        found.append('Resource "*"')
    return found


def test_no_iam_wildcard_without_a_reason_here() -> None:
    template = _template()
    seen: set[tuple[str, str]] = set()
    unjustified = []
    for logical, st in statements(template):
        found = wildcards(st)
        if not found:
            continue
        key = (logical, str(st.get("Sid", "")))
        allowed = JUSTIFIED.get(key)
        actions = frozenset(str(a) for a in _listed(st.get("Action", [])))
        if allowed is None or allowed.actions != actions or "NotAction" in st:
            unjustified.append(f"{logical} {st.get('Sid', '(no Sid)')}: {', '.join(found)}")
        seen.add(key)
    assert not unjustified, "unjustified IAM wildcards:\n" + "\n".join(unjustified)
    assert seen == set(JUSTIFIED), "JUSTIFIED names statements that no longer need it"


def test_the_check_catches_each_kind_of_wildcard() -> None:
    ok = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/k"}
    assert wildcards(ok) == []
    assert wildcards(ok | {"Action": "*"}) == ["action '*'"]
    assert wildcards(ok | {"Action": ["s3:GetObject", "ec2:*"]}) == ["action 'ec2:*'"]
    assert wildcards(ok | {"Action": "ec2:Describe*"}) == ["action 'ec2:Describe*'"]
    assert wildcards(ok | {"Resource": ["arn:aws:s3:::b/k", "*"]}) == ['Resource "*"']
    hidden = {"Fn::If": ["C", "*", {"Ref": "AWS::NoValue"}]}
    assert wildcards(ok | {"Resource": hidden}) == ['Resource "*"']
    not_action = {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}
    assert wildcards(not_action)[0].startswith("NotAction")
    template = {
        "Resources": {
            "R": {
                "Type": "AWS::IAM::Role",
                "Properties": {
                    "AssumeRolePolicyDocument": {"Statement": []},
                    "Policies": [
                        {"PolicyDocument": {"Statement": [{"Fn::If": ["C", ok, ok | hidden]}]}}
                    ],
                },
            }
        }
    }
    assert [wildcards(st) for _, st in statements(template)] == [[], []]


# -- parameters that reach a shell --------------------------------------------------------------

INJECTIONS = ["a'b", 'a"b', "$(reboot)", "`reboot`", "a;b", "a b", "a\nb", "a|b", "a&b", "${X}"]


def _user_data_subs(template: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each bootstrap script (``UserData``'s ``Fn::Sub`` text) and its variables."""
    for resource in template["Resources"].values():
        data = resource.get("Properties", {}).get("LaunchTemplateData", {})
        if "UserData" not in data:
            continue
        sub = data["UserData"]["Fn::Base64"]["Fn::Sub"]
        text, variables = (sub, {}) if isinstance(sub, str) else (sub[0], sub[1])
        yield text, variables


def _refs(value: Any) -> Iterator[str]:
    """Names a Sub variable's value refers to: ``Ref``s, and ``${...}`` in a nested ``Fn::Sub``."""
    if isinstance(value, Mapping):
        if "Ref" in value:
            yield str(value["Ref"])
        if "Fn::Sub" in value:
            sub = value["Fn::Sub"]
            yield from re.findall(r"\$\{([A-Za-z0-9:]+)\}", sub if isinstance(sub, str) else sub[0])
        for v in value.values():
            yield from _refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _refs(v)


def shell_parameters(template: Mapping[str, Any]) -> set[str]:
    """The parameters a bootstrap script pastes in, directly or through a Sub variable."""
    params = set(template["Parameters"])
    found: set[str] = set()
    for text, variables in _user_data_subs(template):
        for name in re.findall(r"\$\{([A-Za-z0-9:]+)\}", text):
            if name in params:
                found.add(name)
            elif name in variables:
                found.update(r for r in _refs(variables[name]) if r in params)
    return found


def test_every_parameter_that_reaches_a_shell_is_pattern_checked() -> None:
    template = _template()
    reaching = shell_parameters(template)
    # ModelName and ModelRepositoryPrefix reach it only through a Sub nested in a variable.
    assert {
        "ModelSource",
        "ModelKey",
        "ModelName",
        "ModelRepositoryPrefix",
        "DatabaseSecretArn",
        "SubnetIds",
    } <= reaching
    for name in sorted(reaching):
        spec = template["Parameters"][name]
        if spec["Type"] == "Number" or "AllowedValues" in spec:
            continue  # CloudFormation takes only a number, or one of the listed values
        pattern = spec.get("AllowedPattern")
        assert pattern, f"{name} reaches a shell with no AllowedPattern"
        if "Default" in spec:  # CloudFormation checks a default against the pattern too
            assert re.fullmatch(pattern, str(spec["Default"])), f"{name}: its default fails"
        for bad in INJECTIONS:
            assert not re.fullmatch(pattern, bad), f"{name} accepts {bad!r}"


@pytest.mark.parametrize(
    ("good", "bad"),
    [
        ("203.0.113.0/24", "203.0.113.0"),
        ("0.0.0.0/0", "256.1.1.1/8"),
        ("10.0.0.0/8", "10.0.0.0/33"),
        ("192.168.1.7/32", "1.2.3.4/8; curl x"),
    ],
)
def test_allowed_cidr_is_required_and_a_cidr(good: str, bad: str) -> None:
    spec = _template()["Parameters"]["AllowedCidr"]
    assert "Default" not in spec  # required: no open default
    assert re.fullmatch(spec["AllowedPattern"], good)
    assert not re.fullmatch(spec["AllowedPattern"], bad)


# -- the frontends: N behind the ALB, PostgreSQL when N > 1 --------------------------------------


def _params(given: Mapping[str, str]) -> dict[str, Any]:
    """Every parameter's value as CloudFormation sees it: the given one, else its default
    (a CommaDelimitedList as a list)."""
    out: dict[str, Any] = {}
    for name, p in tpl.parameters(_template()).items():
        value = given.get(name, p.default)
        out[name] = value.split(",") if p.type == "CommaDelimitedList" and value else value
    return out


def _eval(expr: Any, params: Mapping[str, Any], conds: Mapping[str, bool]) -> Any:
    """A condition or rule expression, in the forms the template uses."""
    if not isinstance(expr, Mapping):
        return expr
    ((op, arg),) = expr.items()
    if op == "Ref":
        return params[arg]
    if op == "Condition":
        return conds[arg]
    if op == "Fn::Equals":
        left, right = (_eval(a, params, conds) for a in arg)
        return str(left) == str(right)
    if op == "Fn::Not":
        return not _eval(arg[0], params, conds)
    if op == "Fn::And":
        return all(_eval(a, params, conds) for a in arg)
    if op == "Fn::Or":
        return any(_eval(a, params, conds) for a in arg)
    if op == "Fn::EachMemberEquals":
        members, value = (_eval(a, params, conds) for a in arg)
        return all(m == value for m in (members or [""]))
    raise AssertionError(f"expression form {op} is not modelled here")


def _conditions(params: Mapping[str, Any]) -> dict[str, bool]:
    conds: dict[str, bool] = {}
    for name, expr in _template()["Conditions"].items():
        conds[name] = bool(_eval(expr, params, conds))
    return conds


def _resolve(value: Any, params: Mapping[str, Any], conds: Mapping[str, bool]) -> Any:
    """``Ref`` to a parameter and ``Fn::If`` resolved; anything else left as written."""
    if isinstance(value, list):
        return [_resolve(v, params, conds) for v in value]
    if not isinstance(value, Mapping):
        return value
    if set(value) == {"Fn::If"}:
        name, yes, no = value["Fn::If"]
        return _resolve(yes if conds[name] else no, params, conds)
    if set(value) == {"Ref"} and value["Ref"] in params:
        return params[value["Ref"]]
    return {k: _resolve(v, params, conds) for k, v in value.items()}


def failed_rules(given: Mapping[str, str]) -> dict[str, str]:
    """The template's Rules CloudFormation would fail for these parameters: name -> what
    its AssertDescription tells the user."""
    params = _params(given)
    failed: dict[str, str] = {}
    for name, rule in _template()["Rules"].items():
        if "RuleCondition" in rule and not _eval(rule["RuleCondition"], params, {}):
            continue
        for assertion in rule["Assertions"]:
            if not _eval(assertion["Assert"], params, {}):
                failed[name] = " ".join(assertion["AssertDescription"].split())
    return failed


SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:mark-db-AbCdEf"
OWN_VPC = {"VpcId": "vpc-0123456789abcdef0", "SubnetIds": "subnet-0123abcd,subnet-4567ef01"}


def test_frontend_count_is_a_bounded_number_defaulting_to_two() -> None:
    spec = _template()["Parameters"]["FrontendCount"]
    assert (spec["Type"], spec["Default"], spec["MinValue"]) == ("Number", 2, 1)
    assert spec["MaxValue"] >= 2


@pytest.mark.parametrize(
    ("given", "failed"),
    [
        ({}, {"DatabaseForSeveralFrontends"}),  # the default 2 frontends ask for a database
        ({"FrontendCount": "2"}, {"DatabaseForSeveralFrontends"}),
        ({"FrontendCount": "10"}, {"DatabaseForSeveralFrontends"}),
        ({"FrontendCount": "2", "CreateDatabase": "true"}, set()),
        ({"FrontendCount": "2", "DatabaseSecretArn": SECRET}, set()),
        ({"FrontendCount": "1"}, set()),  # one frontend may keep SQLite
        ({"FrontendCount": "1", "CreateDatabase": "true"}, set()),
        ({"CreateDatabase": "true", "DatabaseSecretArn": SECRET}, {"OneDatabase"}),
        # SQLite in one's own VPC needs the volume's AZ; a database does not.
        ({"FrontendCount": "1"} | OWN_VPC, {"AzForSqliteInOwnVpc"}),
        ({"FrontendCount": "1", "AvailabilityZone": "us-east-1a"} | OWN_VPC, set()),
        ({"CreateDatabase": "true"} | OWN_VPC, set()),
        ({"VpcId": "vpc-0123456789abcdef0", "CreateDatabase": "true"}, {"SubnetsWithVpc"}),
    ],
)
def test_rules_refuse_several_frontends_without_postgresql(
    given: dict[str, str], failed: set[str]
) -> None:
    found = failed_rules(given)
    assert set(found) == failed
    if "DatabaseForSeveralFrontends" in found:  # the message says what to set
        message = found["DatabaseForSeveralFrontends"]
        for what in ("CreateDatabase=true", "DatabaseSecretArn", "FrontendCount=1"):
            assert what in message, message


def _group(given: Mapping[str, str]) -> dict[str, Any]:
    params = _params(given)
    conds = _conditions(params)
    group: dict[str, Any] = _resolve(_template()["Resources"]["ControllerGroup"], params, conds)
    return group


@pytest.mark.parametrize("database", [{"CreateDatabase": "true"}, {"DatabaseSecretArn": SECRET}])
@pytest.mark.parametrize("count", [2, 3, 10])
def test_several_frontends_roll_one_at_a_time_with_the_others_serving(
    count: int, database: dict[str, str]
) -> None:
    given = {"FrontendCount": str(count)} | database
    assert not failed_rules(given)
    group = _group(given)
    props = group["Properties"]
    assert {props[k] for k in ("MinSize", "MaxSize", "DesiredCapacity")} == {str(count)}
    rolling = group["UpdatePolicy"]["AutoScalingRollingUpdate"]
    assert (rolling["MinInstancesInService"], rolling["MaxBatchSize"]) == (1, 1)
    assert rolling["MinInstancesInService"] < count  # CloudFormation: below MaxSize
    # "In service" only once a frontend answers ready: the update waits for its signal.
    assert rolling["WaitOnResourceSignals"] is True
    assert group["CreationPolicy"]["ResourceSignal"]["Count"] == str(count)
    # PostgreSQL: the frontends spread over both subnets (AZs), in the ALB's target group.
    assert props["VPCZoneIdentifier"] == [{"Ref": "SubnetA"}, {"Ref": "SubnetB"}]
    assert props["TargetGroupARNs"] == [{"Ref": "ApiTargetGroup"}]
    assert props["HealthCheckType"] == "ELB"


def test_one_frontend_on_sqlite_keeps_the_volume_hand_over() -> None:
    given = {"FrontendCount": "1"}
    assert not failed_rules(given)
    group = _group(given)
    props = group["Properties"]
    assert {props[k] for k in ("MinSize", "MaxSize", "DesiredCapacity")} == {"1"}
    rolling = group["UpdatePolicy"]["AutoScalingRollingUpdate"]
    # The old frontend goes first, letting go of the volume the new one attaches.
    assert (rolling["MinInstancesInService"], rolling["MaxBatchSize"]) == (0, 1)
    assert props["VPCZoneIdentifier"] == [{"Ref": "SubnetA"}]  # the volume's AZ only
    assert _conditions(_params(given))["UseSqlite"]
    # In one's own VPC: the first of its subnets, the one AvailabilityZone names.
    own = _group(given | OWN_VPC | {"AvailabilityZone": "us-east-1a"})["Properties"]
    assert own["VPCZoneIdentifier"] == [{"Fn::Select": [0, ["subnet-0123abcd", "subnet-4567ef01"]]}]


DATABASE_RESOURCES = {
    "DatabaseSecret": "AWS::SecretsManager::Secret",
    "DatabaseSubnetGroup": "AWS::RDS::DBSubnetGroup",
    "Database": "AWS::RDS::DBInstance",
    "DatabaseSecurityGroup": "AWS::EC2::SecurityGroup",
    "DatabaseFromFrontends": "AWS::EC2::SecurityGroupIngress",
}


def test_the_rds_instance_exists_only_with_create_database() -> None:
    resources = _template()["Resources"]
    for name, kind in DATABASE_RESOURCES.items():
        assert (resources[name]["Type"], resources[name].get("Condition")) == (kind, "CreateDb")
    on = _conditions(_params({"CreateDatabase": "true"}))
    off = _conditions(_params({"CreateDatabase": "false", "FrontendCount": "1"}))
    url = _conditions(_params({"DatabaseSecretArn": SECRET}))
    assert on["CreateDb"] and not on["UseSqlite"] and not on["UseDatabaseUrl"]
    assert not off["CreateDb"] and off["UseSqlite"]
    assert not url["CreateDb"] and not url["UseSqlite"] and url["UseDatabaseUrl"]
    # Nothing else is made only for the database (a resource added later gets a test).
    made = {k for k, r in resources.items() if r.get("Condition") == "CreateDb"}
    assert made == set(DATABASE_RESOURCES)


def test_the_rds_instance_is_encrypted_private_postgres_kept_as_a_snapshot() -> None:
    resources = _template()["Resources"]
    db = resources["Database"]
    assert (db["DeletionPolicy"], db["UpdateReplacePolicy"]) == ("Snapshot", "Snapshot")
    props = db["Properties"]
    assert props["Engine"] == "postgres"
    assert props["StorageEncrypted"] is True
    assert props["PubliclyAccessible"] is False
    assert props["DBInstanceClass"] == {"Ref": "DatabaseInstanceClass"}
    assert _template()["Parameters"]["DatabaseInstanceClass"]["Default"] == "db.t4g.micro"
    assert str(props["Port"]) == "5432"
    assert props["DBSubnetGroupName"] == {"Ref": "DatabaseSubnetGroup"}
    assert props["VPCSecurityGroups"] == [{"Ref": "DatabaseSecurityGroup"}]  # that one only
    subnets = resources["DatabaseSubnetGroup"]["Properties"]["SubnetIds"]
    assert subnets == {
        "Fn::If": ["CreateVpc", [{"Ref": "SubnetA"}, {"Ref": "SubnetB"}], {"Ref": "SubnetIds"}]
    }
    # The password: generated into the secret, resolved by CloudFormation, never a value here.
    assert props["MasterUserPassword"] == {
        "Fn::Sub": "{{resolve:secretsmanager:${DatabaseSecret}:SecretString:password}}"
    }
    generate = resources["DatabaseSecret"]["Properties"]["GenerateSecretString"]
    assert json.loads(generate["SecretStringTemplate"]) == {"username": props["MasterUsername"]}
    assert generate["GenerateStringKey"] == "password"
    assert generate["PasswordLength"] >= 32 and generate["ExcludePunctuation"] is True


def test_the_database_admits_postgres_from_the_frontends_group_only() -> None:
    resources = _template()["Resources"]
    group = resources["DatabaseSecurityGroup"]["Properties"]
    assert "SecurityGroupIngress" not in group  # every rule is a resource, found below
    rules = {
        name: r["Properties"]
        for name, r in resources.items()
        if r["Type"] == "AWS::EC2::SecurityGroupIngress"
        and r["Properties"]["GroupId"] == {"Ref": "DatabaseSecurityGroup"}
    }
    assert list(rules) == ["DatabaseFromFrontends"]
    (rule,) = rules.values()
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 5432, 5432)
    assert rule["SourceSecurityGroupId"] == {"Ref": "ControllerSecurityGroup"}
    assert not {"CidrIp", "CidrIpv6", "SourcePrefixListId"} & set(rule)
    # ... and the frontends' group is what the ASG's instances wear.
    lt = resources["ControllerLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert lt["SecurityGroupIds"] == [{"Ref": "ControllerSecurityGroup"}]


def test_only_the_frontends_may_read_the_database_secret() -> None:
    readers = [
        (logical, st)
        for logical, st in statements(_template())
        if {"Ref": "DatabaseSecret"} in _listed(st.get("Resource", []))
    ]
    assert [(logical, st["Sid"], st["Action"]) for logical, st in readers] == [
        ("ControllerRole", "ReadDatabaseCredentials", "secretsmanager:GetSecretValue")
    ]
    policy = _template()["Resources"]["ControllerRole"]["Properties"]["Policies"][0]
    conditional = [
        s["Fn::If"][0]
        for s in policy["PolicyDocument"]["Statement"]
        if isinstance(s, Mapping) and "Fn::If" in s and "ReadDatabaseCredentials" in str(s)
    ]
    assert conditional == ["CreateDb"]  # no grant at all without the stack's database


def test_frontends_may_signal_this_stack_only() -> None:
    (signal,) = [st for _, st in statements(_template()) if st.get("Sid") == "SignalReady"]
    assert signal["Action"] == "cloudformation:SignalResource"
    assert signal["Resource"] == {"Ref": "AWS::StackId"}


# -- cfn-lint ------------------------------------------------------------------------------------


def test_cfn_lint_is_clean() -> None:
    pytest.importorskip("cfnlint")
    lint = Path(sys.executable).parent / "cfn-lint"
    out = subprocess.run(
        [str(lint), str(TEMPLATE)], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
