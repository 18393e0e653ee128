"""Model directories: a manifest (``model.yaml``) beside the artifact, versions as subdirectories.

The layout is Triton's model repository's, with YAML for its ``config.pbtxt``::

    models/                      # a repository (``repository:``), or one model's ``path``
      ranker/
        model.yaml               # name, format, inputs, outputs, slo, profile, ...
        1/model.onnx
        2/model.onnx             # the highest numbered version is served unless one is named
      classifier/
        model.yaml
        model.pt                 # no version directories: version 1, the artifact beside it

``artifact`` (or ``source``) defaults to ``model.onnx``, ``model.pt`` or
``model.py`` by format, or whichever of them the version directory holds.
Relative paths (the artifact, a profile, a Neuron artifact) are the model
directory's (the artifact's: the version directory's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from bouncer.fetch import FetchError, fetch_dir, fetch_file, is_s3, list_dirs

MANIFEST = "model.yaml"
ARTIFACTS = {"onnx": "model.onnx", "torchscript": "model.pt", "python": "model.py"}


def versions(directory: Path) -> list[str]:
    """The numbered version subdirectories, lowest first."""
    found = [p.name for p in directory.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=int)


def _artifact(base: Path, fmt: str | None) -> str:
    if fmt in ARTIFACTS:
        return str(base / ARTIFACTS[fmt])
    present = [name for name in ARTIFACTS.values() if (base / name).is_file()]
    if len(present) != 1:
        what = (
            f"{' and '.join(present)} both"
            if present
            else "none of " + ", ".join(ARTIFACTS.values())
        )
        raise ValueError(
            f"{base} holds {what}: name the file with 'artifact:' (or 'format:') in {MANIFEST}"
        )
    return str(base / present[0])


def merged_with_manifest(data: dict[str, Any]) -> dict[str, Any]:
    """A model entry with ``path``: its manifest's fields under the entry's own, paths
    resolved. ``ValueError`` names the directory or file and what is missing."""
    directory = Path(str(data["path"])).expanduser().resolve()
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise ValueError(
            f"model directory {directory} has no {MANIFEST}: write one with the model's "
            "name, format, inputs, outputs and slo (README: Serve your own model)"
        )
    try:
        doc = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{manifest}: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{manifest} must be a mapping of the model's fields")
    if "path" in doc:
        raise ValueError(f"{manifest}: 'path' belongs in the configuration, not the manifest")
    merged: dict[str, Any] = {**doc, **data, "path": directory}
    if "artifact" in merged:
        if "source" in merged:
            raise ValueError(f"{manifest}: give 'artifact' or 'source', not both")
        merged["source"] = merged.pop("artifact")
    merged.setdefault("name", directory.name)
    numbered = versions(directory)
    version = str(merged.get("version") or (numbered[-1] if numbered else "1"))
    merged["version"] = version
    base = directory / version if version in numbered else directory
    if numbered and version not in numbered:
        raise ValueError(
            f"model directory {directory} has versions {', '.join(numbered)}, not {version}"
        )
    if merged.get("variants"):
        merged["variants"] = [_variant(v, base, directory, manifest) for v in merged["variants"]]
        return merged  # its artifact is its most accurate variant's (mark.config.variants)
    source = merged.get("source")
    fmt = merged.get("format")
    if source is None:
        merged["source"] = _artifact(base, fmt)
    elif fmt != "pytorch" and not Path(str(source)).is_absolute():
        merged["source"] = str(base / str(source))
    for key in ("profile", "neuron_artifact"):
        value = merged.get(key)
        if value is not None and not Path(str(value)).is_absolute():
            merged[key] = str(directory / str(value))
    return merged


def _variant(v: Any, base: Path, directory: Path, manifest: Path) -> Any:
    """One variant of a manifest: ``artifact`` as its source, relative to the version
    directory (a factory as it is), its profile relative to the model directory."""
    if not isinstance(v, dict):
        return v  # the spec says what is wrong with it
    v = dict(v)
    if "artifact" in v:
        if "source" in v:
            raise ValueError(f"{manifest}: variant {v.get('name')!r}: 'artifact' or 'source'")
        v["source"] = v.pop("artifact")
    src = v.get("source")
    if src is None:
        raise ValueError(f"{manifest}: variant {v.get('name')!r} needs its 'artifact'")
    if v.get("format") != "pytorch" and not Path(str(src)).is_absolute():
        v["source"] = str(base / str(src))
    prof = v.get("profile")
    if prof is not None and not Path(str(prof)).is_absolute():
        v["profile"] = str(directory / str(prof))
    return v


def fetch_model_dir(repository: str, model: str, version: str | None, cache: Path) -> Path:
    """Model ``model`` of the repository at ``repository`` on this machine: the directory
    itself when it is local; from S3, the model directory but its other versions (the
    manifest, a profile, the version served: ``version``, else the manifest's, else the
    highest numbered) fetched under ``cache``."""
    if not is_s3(repository):
        return Path(repository).expanduser() / model
    base = f"{repository.rstrip('/')}/{model}"
    local = cache / model
    try:
        fetch_file(f"{base}/{MANIFEST}", local / MANIFEST)
        numbered = sorted((d for d in list_dirs(base) if d.isdigit()), key=int)
        if not numbered:
            fetch_dir(base, local)  # no version directories: the artifact beside the manifest
            return local
        declared = yaml.safe_load((local / MANIFEST).read_text(encoding="utf-8")) or {}
        chosen = str(version or declared.get("version") or numbered[-1])
        fetch_dir(base, local, skip=frozenset(numbered) - {chosen})
    except FetchError as exc:
        raise ValueError(f"model {model!r} in {repository}: {exc}") from None
    return local


def repository_entries(root: str, cache: Path) -> list[dict[str, Any]]:
    """A model entry (``{"path": dir}``, and ``"location"``: where it lives in S3) for each
    directory of ``root`` (a path, or ``s3://bucket/prefix``) with a manifest, by name;
    ``ValueError`` if it holds none. From S3, each model is fetched under ``cache``."""
    if is_s3(root):
        try:
            names = list_dirs(root)
        except FetchError as exc:
            raise ValueError(f"model repository {root}: {exc}") from None
        if not names:
            raise ValueError(f"model repository {root} has no model directory")
        return [
            {
                "path": str(fetch_model_dir(root, name, None, cache)),
                "location": f"{root.rstrip('/')}/{name}",
            }
            for name in names
        ]
    return _local_entries(Path(root))


def _local_entries(root: Path) -> list[dict[str, Any]]:
    root = root.expanduser()
    if not root.is_dir():
        raise ValueError(f"model repository {root} is not a directory")
    found = sorted(p for p in root.iterdir() if (p / MANIFEST).is_file())
    if not found:
        raise ValueError(
            f"model repository {root} has no model directory (a subdirectory with {MANIFEST})"
        )
    return [{"path": str(p)} for p in found]
