"""infra/mark.yaml read as text, no stack: lint-clean, no unjustified IAM wildcard, and
every parameter that reaches a bootstrap shell pattern-checked.

A wildcard (an action ``*``, ``svc:*`` or any ``*`` in an action name, ``NotAction``,
``NotResource``, or ``Resource: "*"``) fails the build unless ``JUSTIFIED`` names the
statement (resource and ``Sid``), its exact actions, and the reason. A reviewer reads
the reason here; the template carries the same reason as a comment on the statement.
"""

from __future__ import annotations

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


# -- cfn-lint ------------------------------------------------------------------------------------


def test_cfn_lint_is_clean() -> None:
    pytest.importorskip("cfnlint")
    lint = Path(sys.executable).parent / "cfn-lint"
    out = subprocess.run(
        [str(lint), str(TEMPLATE)], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
