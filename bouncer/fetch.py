"""Model artifacts in S3, fetched where they run: an instance's agent, the spill function,
the controller.

A model's version directory (``s3://bucket/models/ranker/2/``) is fetched whole, so an
ONNX model's external weights or a Python handler's files come with it. Each file is
written beside its place and renamed into it, so a crash mid-download never leaves a
half file where a runner would load it. boto3 takes its region, credentials and
endpoint (``AWS_ENDPOINT_URL_S3``) from the environment, as on an instance or in Lambda.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

S3_SCHEME = "s3://"


class FetchError(Exception):
    """The location names nothing readable; the message says which and why."""


def is_s3(location: str) -> bool:
    return location.startswith(S3_SCHEME)


def s3_parts(location: str) -> tuple[str, str]:
    """(bucket, key or prefix) of an ``s3://`` location, or ``FetchError``."""
    bucket, _, key = location.removeprefix(S3_SCHEME).partition("/")
    if not bucket or not key:
        raise FetchError(f"{location!r} is not s3://bucket/key")
    return bucket, key


def _client() -> Any:
    import boto3  # only a fetch needs it: a process that loads local files never imports it

    return boto3.client("s3")


def _download(client: Any, bucket: str, key: str, target: Path) -> None:
    from botocore.exceptions import ClientError

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        client.download_file(bucket, key, str(partial))
    except ClientError as exc:
        raise FetchError(f"cannot read s3://{bucket}/{key}: {exc}") from None
    os.replace(partial, target)


def fetch_file(location: str, target: Path) -> Path:
    """``s3://bucket/key`` to ``target``; the local path."""
    bucket, key = s3_parts(location)
    _download(_client(), bucket, key, target)
    return target


def fetch_dir(location: str, target: Path, skip: frozenset[str] = frozenset()) -> Path:
    """Every object under the prefix ``location`` to the same relative paths under
    ``target``, but those under a first-level "directory" named in ``skip``;
    ``FetchError`` if there is none."""
    bucket, prefix = s3_parts(location.rstrip("/") + "/")
    client = _client()
    from botocore.exceptions import ClientError

    objects: list[dict[str, Any]] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            objects += [o for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    except ClientError as exc:
        raise FetchError(f"cannot list s3://{bucket}/{prefix}: {exc}") from None
    if not objects:
        raise FetchError(f"s3://{bucket}/{prefix} holds no file")
    for obj in objects:
        key = obj["Key"]
        rel = PurePosixPath(key).relative_to(prefix)
        if len(rel.parts) > 1 and rel.parts[0] in skip:
            continue
        if ".." in rel.parts:
            raise FetchError(f"s3://{bucket}/{key} escapes its prefix")
        local = target.joinpath(*rel.parts)
        if not _current(local, obj):
            _download(client, bucket, key, local)
    return target


def _current(local: Path, obj: Mapping[str, Any]) -> bool:
    """Whether ``local`` is already the object: its size, written since the object was
    (a directory read again, as a repository poll does, fetches only what changed)."""
    try:
        st = local.stat()
    except OSError:
        return False
    modified = obj.get("LastModified")
    newer = modified is None or st.st_mtime >= modified.timestamp()
    return bool(st.st_size == obj.get("Size") and newer)


def list_dirs(location: str) -> list[str]:
    """The names of the "directories" right under the prefix ``location``."""
    bucket, prefix = s3_parts(location.rstrip("/") + "/")
    client = _client()
    names: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix, Delimiter="/"
    ):
        names += [p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
    return sorted(names)
