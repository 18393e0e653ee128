"""Build what the stack boots from: the agent bundle, and what the spill image needs to know.

``import_closure`` reads the imports of this project's modules to find every
module a root needs and the third-party packages those import; the spill
function's image (``mark.deploy.image``) installs exactly those, so a new
import of the handler cannot be forgotten.

The agent bundle is mark's source tree as pip installs it (``pyproject.toml``,
the five packages, ``README.md``) plus ``constraints.txt``, under one top
directory ``mark-src/``: the instances' user data runs
``pip install -c mark-src/constraints.txt mark-src`` so every machine gets the
versions the test suite ran with.

The bundle is byte-for-byte reproducible (sorted entries, fixed timestamps and
owners), so an unchanged tree uploads an unchanged object.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import io
import os
import sys
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from mark.errors import ConfigError

#: The packages this distribution installs (pyproject's ``packages.find``).
PROJECT_PACKAGES = ("mark", "predictor", "provisioner", "bouncer", "lambda_handlers")
#: Top-level files pip needs to build the project from source.
PROJECT_FILES = ("pyproject.toml", "README.md", "constraints.txt")
BUNDLE_TOP = "mark-src"
AGENT_BUNDLE = "agent-bundle.tar.gz"

_SKIP_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


def project_root() -> Path:
    """mark's source tree (where ``pyproject.toml`` sits beside ``mark/``), or ``ConfigError``."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or 'name = "mark"' not in pyproject.read_text(encoding="utf-8"):
        raise ConfigError(
            f"`mark deploy package` needs mark's source tree (pyproject.toml beside mark/), "
            f"not an installed copy; {root} is not one: run it from a checkout"
        )
    return root


def _source_files(directory: Path) -> Iterator[Path]:
    """Files under ``directory`` worth shipping, sorted; caches and bytecode left out."""
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if Path(name).suffix not in _SKIP_SUFFIXES:
                yield Path(dirpath) / name


def _imports(path: Path, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            # `from pkg import mod` may name a submodule: try both, keep what exists.
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _module_file(name: str) -> tuple[Path, bool] | None:
    """(file, is_package) of one of this project's modules, or None if it is not one."""
    if name.split(".")[0] not in PROJECT_PACKAGES:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin), spec.submodule_search_locations is not None


def import_closure(roots: Iterable[str]) -> tuple[dict[str, Path], set[str]]:
    """Every module of this project that ``roots`` need (a package brings all its modules;
    parent packages included), and the third-party top-level packages they import
    (stdlib excluded)."""
    pending: list[str] = []
    for root in roots:
        located = _module_file(root)
        if located is None:
            raise ConfigError(f"cannot find this project's module {root!r}")
        pending.append(root)
        path, is_package = located
        if is_package:
            pending.extend(f"{root}.{p.stem}" for p in path.parent.glob("*.py"))
    found: dict[str, Path] = {}
    external: set[str] = set()
    while pending:
        name = pending.pop()
        if name in found:
            continue
        located = _module_file(name)
        if located is None:
            top = name.split(".")[0]
            if top and top not in PROJECT_PACKAGES and top not in sys.stdlib_module_names:
                external.add(top)
            continue
        path, is_package = located
        found[name] = path
        parent = name.rpartition(".")[0]
        if parent:
            pending.append(parent)  # importing a.b.c runs a/__init__ and a/b/__init__
        pending.extend(_imports(path, name, is_package))
    return found, external


def copy_source_tree(dest: Path, root: Path | None = None) -> Path:
    """The files pip builds mark from (the bundle's members), copied under ``dest``."""
    root = root if root is not None else project_root()
    for arcname, path in _bundle_members(root):
        target = dest / arcname
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())  # follows links: the packaged template is one
    return dest


def _bundle_members(root: Path) -> Iterable[tuple[str, Path]]:
    for name in PROJECT_FILES:
        path = root / name
        if not path.is_file():
            raise ConfigError(f"{path} is missing; the agent bundle needs it")
        yield name, path
    for package in PROJECT_PACKAGES:
        for path in _source_files(root / package):
            yield path.relative_to(root).as_posix(), path


def build_agent_bundle(out_dir: Path, root: Path | None = None) -> Path:
    """``out_dir/agent-bundle.tar.gz``: the source tree pip installs on each instance."""
    root = root if root is not None else project_root()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / AGENT_BUNDLE
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arcname, path in _bundle_members(root):
            data = path.read_bytes()  # follows links: the packaged template is a link
            info = tarfile.TarInfo(f"{BUNDLE_TOP}/{arcname}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    with target.open("wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return target
