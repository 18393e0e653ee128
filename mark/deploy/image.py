"""The spill function's container image: the Docker context ``mark deploy package`` writes.

Why an image: the handler runs torch, whose CPU build unpacks to about 750 MB,
three times what Lambda allows a zip and its layers (250 MB); an image may be
10 GB. The context holds a Dockerfile on AWS's Python 3.11 Lambda base image,
mark's wheel, ``constraints.txt`` and a ``requirements.txt`` naming, at the
pins of ``constraints.txt``, exactly the third-party packages the handler
imports plus those of the default model's module (``mark.demo.model``, behind
the default source ``mark.demo:digits_model``, so the stack's defaults work).
mark itself goes in without its dependencies: the handler needs none of the
daemon's (moto, statsmodels & co.), which would only make every cold start
slower.

The context is reproducible (the wheel is built with ``SOURCE_DATE_EPOCH``), so
its content hash is the image tag: an unchanged tree gives the same tag, a
changed one a new tag, and so a new ``SpillImageUri`` that makes CloudFormation
update the function.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mark.deploy.package import copy_source_tree, import_closure, project_root
from mark.errors import ConfigError

BASE_IMAGE = "public.ecr.aws/lambda/python:3.11"
HANDLER = "lambda_handlers.spill.handler"
#: PyTorch's CPU wheels; PyPI's torch pulls the CUDA libraries (gigabytes Lambda cannot use).
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
IMAGE_DIR = "spill-image"
REPOSITORY = "mark-spill"
#: Modules whose imports the image serves besides the handler's: the default ModelSource's.
MODEL_MODULES = ("mark.demo.model",)
_BUILD = "/tmp/mark-build"  # where the Dockerfile copies the context before installing it
_EPOCH = "315532800"  # 1980-01-01, the earliest time a wheel (zip) entry can carry


@dataclass(frozen=True, slots=True)
class SpillImage:
    """A written context: where it is, what it installs, and the tag to build it as."""

    context: Path
    wheel: Path
    requirements: tuple[str, ...]  # "name==version", as in constraints.txt
    tag: str


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """``constraints.txt`` as canonical name -> its ``name==version`` line."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        name, sep, version = line.partition("==")
        if sep and name and version:
            pins[canonical(name)] = f"{name}=={version}"
    return pins


def distributions(imports: Iterable[str]) -> set[str]:
    """The installed distributions providing these top-level imports (``sklearn`` is
    ``scikit-learn``), or ``ConfigError`` naming an import nothing installed provides."""
    provides = importlib.metadata.packages_distributions()
    out: set[str] = set()
    for name in sorted(imports):
        if name not in provides:
            raise ConfigError(f"no installed distribution provides {name!r}, which the image needs")
        out.update(provides[name])
    return out


def requirements(imports: Iterable[str], pins: Mapping[str, str]) -> tuple[str, ...]:
    """The pinned requirement of each distribution behind ``imports``, sorted."""
    lines = []
    for dist in sorted(distributions(imports), key=canonical):
        pin = pins.get(canonical(dist))
        if pin is None:
            raise ConfigError(f"{dist} is not pinned in constraints.txt; the image needs a pin")
        lines.append(pin)
    return tuple(lines)


def build_wheel(out_dir: Path, root: Path | None = None) -> Path:
    """mark's wheel, built from a copy of the source tree (the checkout stays clean)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mark-wheel-") as tmp:
        src = copy_source_tree(Path(tmp) / "src", root)
        built = Path(tmp) / "wheel"
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        cmd += ["--disable-pip-version-check", "-w", str(built), str(src)]
        env = dict(os.environ, SOURCE_DATE_EPOCH=_EPOCH)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise ConfigError(f"building mark's wheel failed: {done.stderr.strip()[-2000:]}")
        (wheel,) = built.glob("mark-*.whl")
        for old in out_dir.glob("mark-*.whl"):
            old.unlink()
        return Path(shutil.copy2(wheel, out_dir / wheel.name))


def dockerfile(wheel: str) -> str:
    """The Dockerfile for a context holding ``wheel``, constraints.txt and requirements.txt."""
    return f"""\
# mark's spill function ({HANDLER}) as a Lambda container image, written by
# `mark deploy package`. Build for x86_64, the architecture the stack deploys:
#   docker build --platform linux/amd64 --provenance=false -t REPO:TAG .
FROM {BASE_IMAGE}
COPY constraints.txt requirements.txt {wheel} {_BUILD}/
# Into LAMBDA_TASK_ROOT, first on the runtime's path, as AWS documents: the pinned
# versions win over anything the base image carries. torch from the CPU index.
RUN pip install --no-cache-dir --target "${{LAMBDA_TASK_ROOT}}" \\
        -c {_BUILD}/constraints.txt --extra-index-url {CPU_INDEX} \\
        -r {_BUILD}/requirements.txt \\
 && pip install --no-cache-dir --no-deps --target "${{LAMBDA_TASK_ROOT}}" {_BUILD}/{wheel} \\
 && rm -rf {_BUILD}
CMD ["{HANDLER}"]
"""


def _content_tag(context: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in context.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def build_spill_image(out_dir: Path, root: Path | None = None) -> SpillImage:
    """``out_dir/spill-image/``: a ready-to-build Docker context for the spill function."""
    root = root if root is not None else project_root()
    context = out_dir / IMAGE_DIR
    context.mkdir(parents=True, exist_ok=True)
    handler_module = HANDLER.rpartition(".")[0]
    _, imports = import_closure([handler_module.partition(".")[0], *MODEL_MODULES])
    constraints = (root / "constraints.txt").read_text(encoding="utf-8")
    reqs = requirements(imports, read_pins(constraints))
    wheel = build_wheel(context, root)
    (context / "constraints.txt").write_text(constraints, encoding="utf-8")
    (context / "requirements.txt").write_text("\n".join(reqs) + "\n", encoding="utf-8")
    (context / "Dockerfile").write_text(dockerfile(wheel.name), encoding="utf-8")
    return SpillImage(context, wheel, reqs, _content_tag(context))


def push_commands(image: SpillImage, repository: str = REPOSITORY) -> list[str]:
    """Shell lines that build the image and push it to ECR; the last sets ``SPILL_IMAGE``,
    the stack's ``SpillImageUri``. ``REGION`` must be the stack's region."""
    return [
        "ACCOUNT=$(aws sts get-caller-identity --query Account --output text)",
        f"REPO=$ACCOUNT.dkr.ecr.$REGION.amazonaws.com/{repository}",
        f"aws ecr describe-repositories --region $REGION --repository-names {repository} "
        f">/dev/null || aws ecr create-repository --region $REGION --repository-name {repository}",
        "aws ecr get-login-password --region $REGION "
        "| docker login --username AWS --password-stdin ${REPO%%/*}",
        f"docker build --platform linux/amd64 --provenance=false -t $REPO:{image.tag} "
        f"{image.context}",
        f"docker push $REPO:{image.tag}",
        f"SPILL_IMAGE=$REPO:{image.tag}",
    ]
