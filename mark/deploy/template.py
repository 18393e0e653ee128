"""The CloudFormation template: read it, list its parameters, fill in a user's defaults.

The template is YAML with CloudFormation's short tags (``!Ref``, ``!Sub``, ...),
which a plain YAML loader rejects, so it is read with a loader that turns each
tag into its long form (``{"Ref": x}``, ``{"Fn::Sub": x}``). Defaults are
written into the YAML *text* at the exact spans the parser reports, so the
printed template keeps its comments and short tags; JSON output is the parsed
long form. Values are checked against each parameter's own constraints
(AllowedValues, AllowedPattern, Number and its bounds) so a typo fails here, in
one line, rather than minutes into a stack creation.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import yaml

from mark.errors import ConfigError

Format = Literal["yaml", "json"]


def template_text() -> str:
    """The shipped template (``infra/mark.yaml``; packaged as ``mark/deploy/data/mark.yaml``)."""
    return (resources.files("mark.deploy") / "data" / "mark.yaml").read_text(encoding="utf-8")


class _CfnLoader(yaml.SafeLoader):
    """SafeLoader that reads CloudFormation's short-form intrinsic tags."""


def _construct_intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode)
        value = loader.construct_mapping(node, deep=True)
    if suffix in ("Ref", "Condition"):
        return {suffix: value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _construct_intrinsic)


def load(text: str) -> dict[str, Any]:
    """The template as plain data, intrinsics in long form."""
    data = yaml.load(text, Loader=_CfnLoader)  # a SafeLoader, plus CloudFormation's tags
    if not isinstance(data, dict) or "Resources" not in data:
        raise ConfigError("the CloudFormation template has no Resources section")
    return data


@dataclass(frozen=True, slots=True)
class Parameter:
    """One template parameter and the constraints CloudFormation checks it against."""

    name: str
    type: str
    default: str | None
    description: str
    allowed_values: tuple[str, ...] = ()
    allowed_pattern: str | None = None
    min_value: float | None = None
    max_value: float | None = None

    def check(self, value: str) -> str:
        """``value`` normalised for the template, or ``ConfigError`` saying what is allowed."""
        if self.allowed_values and value not in self.allowed_values:
            raise ConfigError(
                f"parameter {self.name}={value!r}: allowed: {', '.join(self.allowed_values)}"
            )
        if self.type == "Number":
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if not math.isfinite(number):
                raise ConfigError(f"parameter {self.name}={value!r}: must be a number")
            if self.min_value is not None and number < self.min_value:
                raise ConfigError(f"parameter {self.name}={value}: must be >= {self.min_value:g}")
            if self.max_value is not None and number > self.max_value:
                raise ConfigError(f"parameter {self.name}={value}: must be <= {self.max_value:g}")
        elif self.allowed_pattern is not None:
            # As CloudFormation does: a list's pattern is each item's.
            items = value.split(",") if self.type == "CommaDelimitedList" else [value]
            if not all(re.fullmatch(self.allowed_pattern, item) for item in items):
                raise ConfigError(
                    f"parameter {self.name}={value!r}: must match {self.allowed_pattern} "
                    f"({self.description})"
                )
        return value


def _bound(value: Any) -> float | None:
    return None if value is None else float(value)


def parameters(template: Mapping[str, Any]) -> dict[str, Parameter]:
    """The template's parameters by name, in template order."""
    out: dict[str, Parameter] = {}
    for name, spec in (template.get("Parameters") or {}).items():
        default = spec.get("Default")
        out[name] = Parameter(
            name=name,
            type=str(spec.get("Type", "String")),
            default=None if default is None else _scalar_text(default),
            description=str(spec.get("Description", "")).strip(),
            allowed_values=tuple(_scalar_text(v) for v in spec.get("AllowedValues", [])),
            allowed_pattern=spec.get("AllowedPattern"),
            min_value=_bound(spec.get("MinValue")),
            max_value=_bound(spec.get("MaxValue")),
        )
    return out


def _scalar_text(value: Any) -> str:
    """How CloudFormation sees a parameter value: always a string (lists comma-joined)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(_scalar_text(v) for v in value)
    return str(value)


def parse_params(items: Sequence[str]) -> dict[str, str]:
    """``["ApiPort=9000", "VpcId="]`` as a dict; a malformed item is a ``ConfigError``."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param {item!r} is not KEY=VALUE (e.g. ArtifactBucket=my-bucket)")
        out[key.strip()] = value
    return out


def checked(template: Mapping[str, Any], params: Mapping[str, str]) -> dict[str, str]:
    """``params`` validated against the template: known names, allowed values."""
    known = parameters(template)
    unknown = [k for k in params if k not in known]
    if unknown:
        raise ConfigError(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"valid: {', '.join(known)}"
        )
    return {k: known[k].check(v) for k, v in params.items()}


def _yaml_scalar(value: str) -> str:
    """The value as a double-quoted YAML scalar: a string whatever it looks like
    (``010`` stays ``010``, not YAML 1.1's octal 8); CloudFormation reads a
    Number parameter's default from a string too."""
    return json.dumps(value)  # a JSON string is a valid double-quoted YAML scalar


def _key_node(mapping: yaml.MappingNode, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    for k, v in mapping.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return k, v
    return None


def fill_yaml(text: str, params: Mapping[str, str]) -> str:
    """The template text with each parameter's ``Default`` set, comments and tags kept."""
    values = checked(load(text), params)
    root = yaml.compose(text, Loader=yaml.SafeLoader)  # composing needs no tag constructors
    assert isinstance(root, yaml.MappingNode)
    found = _key_node(root, "Parameters")
    if found is None or not isinstance(found[1], yaml.MappingNode):
        raise ConfigError("the CloudFormation template has no Parameters section")
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) in the text
    for name, value in values.items():
        entry = _key_node(found[1], name)
        assert entry is not None and isinstance(entry[1], yaml.MappingNode)
        spec = entry[1]
        scalar = _yaml_scalar(value)
        default = _key_node(spec, "Default")
        if default is not None:
            edits.append((default[1].start_mark.index, default[1].end_mark.index, scalar))
            continue
        if spec.flow_style:
            raise ConfigError(f"parameter {name} is a flow mapping; give it a Default to fill")
        type_entry = _key_node(spec, "Type")
        anchor = type_entry if type_entry is not None else spec.value[0]
        indent = " " * anchor[0].start_mark.column
        at = anchor[1].end_mark.index
        edits.append((at, at, f"\n{indent}Default: {scalar}"))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    filled = parameters(load(text))
    for name, value in values.items():  # the edit is checked, not trusted
        if filled[name].default != value:
            raise AssertionError(f"filling {name} produced {filled[name].default!r}")
    return text


def render(text: str, params: Mapping[str, str], fmt: Format = "yaml") -> str:
    """The template with ``params`` as defaults, as YAML (short tags kept) or JSON."""
    filled = fill_yaml(text, params)
    if fmt == "yaml":
        return filled
    return json.dumps(load(filled), indent=2) + "\n"
