"""The house rules that keep one home for each decision, checked on the source.

Pure policy code (``provisioner/``, the Bouncer's admission and routing rules)
has no ``await``, no clock and no I/O; the project's modules import each other
without cycles; only the CLI starts the daemon; the daemon never asks which
world it runs in; the simulator's engine calls the dispatcher's routing rule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mark", "predictor", "provisioner", "bouncer", "lambda_handlers")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            if "migrations" in p.parts:
                continue
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = p
    return mods


def _top_level_imports(path: Path, mods: dict[str, Path]) -> set[str]:
    """Project modules imported at module level (imports inside functions are lazy)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [s for s in subs if s in mods]
            if len(names) < len(subs):
                names.append(node.module)
        for n in names:
            while n and n not in mods:
                n = n.rpartition(".")[0]
            if n:
                out.add(n)
    return out


def test_no_import_cycles_among_the_projects_modules() -> None:
    mods = _modules()
    graph = {m: _top_level_imports(p, mods) - {m} for m, p in mods.items()}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            cycle = [*path[path.index(m) :], m]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if m in done:
            return
        for dep in sorted(graph[m]):
            visit(dep, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_pure_decision_code_has_no_await_clock_or_io() -> None:
    pure = [*(ROOT / "provisioner").glob("*.py"), ROOT / "bouncer" / "admission.py"]
    pure.append(ROOT / "bouncer" / "routing.py")
    clocks = {"time", "datetime", "asyncio", "os", "socket", "subprocess"}  # time.time(), ...
    bare = {"open", "sleep", "monotonic", "perf_counter", "input"}
    io_modules = ("asyncio", "aiohttp", "aiobotocore", "boto3", "sqlalchemy", "mark", "socket")
    found: dict[str, list[str]] = {}
    for p in pure:
        bad = []
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Await | ast.AsyncFunctionDef | ast.AsyncWith | ast.AsyncFor):
                bad.append(f"line {node.lineno}: async")
            elif isinstance(node, ast.Call):
                f = node.func
                owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if owner in clocks or (not owner and name in bare):
                    bad.append(f"line {node.lineno}: {owner}.{name}()")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if mod and mod.split(".")[0] in io_modules:
                    bad.append(f"line {node.lineno}: import {mod}")
        if bad:
            found[str(p.relative_to(ROOT))] = bad
    assert found == {}


def test_only_the_cli_imports_the_daemon() -> None:
    users = sorted(
        str(p.relative_to(ROOT))
        for name, p in _modules().items()
        if "mark.daemon" in _all_imports(p) and not name.startswith("mark.cli.")
    )
    assert users == []


def _all_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_one_definition_of_each_shared_rule() -> None:
    sources = {p: p.read_text() for p in _modules().values()}
    profile = [p for p, s in sources.items() if re.search(r"^PROFILE_BATCHES\s*=", s, re.M)]
    assert [str(p.relative_to(ROOT)) for p in profile] == ["provisioner/batching.py"]
    daemon = (ROOT / "mark" / "daemon.py").read_text()
    assert not re.search(r"isinstance\([^)]*World", daemon)
    assert "bouncer.routing" in _all_imports(ROOT / "mark" / "sim" / "engine.py")
    served_by = [p for p, s in sources.items() if '"X-Mark-Served-By"' in s]
    assert [str(p.relative_to(ROOT)) for p in served_by] == ["bouncer/wire.py"]
