"""The spill function as deployed on AWS: its model named by ``MARK_MODEL_SOURCE=s3://...``.

Runs under the real runtime contract (awslambdaric against the local Runtime API),
with nothing in the event but the model name and the batch, as the aws world sends
it. The runtime's boto3 reaches the moto server through ``AWS_ENDPOINT_URL_S3``,
the standard variable, so the handler has no test-only code path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
import torch

from lambda_handlers import spill
from mark.cloud.local import LocalLambda
from mark.demo import DigitsCNN, save_torchscript
from mark.errors import SpillRejected

pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning"
)

BUCKET = "mark-spill-models"
KEY = "models/digits.pt"


def _s3(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _runtime_env(endpoint: str, source: str, tmp: Path) -> dict[str, str]:
    """What Lambda gives a function (credentials, region) plus what the stack sets."""
    return {
        spill.SOURCE_ENV: source,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "TMPDIR": str(tmp),  # Lambda's /tmp
    }


async def test_model_from_s3_is_fetched_once_per_runtime_and_predicts(
    aws_env: str, project_root: Path, tmp_path: Path
) -> None:
    torch.manual_seed(11)
    model = DigitsCNN().eval()
    path = save_torchscript(model, tmp_path / "digits.pt")
    s3 = _s3(aws_env)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=path.read_bytes())
    lambda_tmp = tmp_path / "lambda-tmp"
    lambda_tmp.mkdir()
    source = f"s3://{BUCKET}/{KEY}"
    gen = torch.Generator().manual_seed(5)
    batch = torch.rand(3, 1, 8, 8, generator=gen)

    lam = LocalLambda(
        cwd=project_root, env=_runtime_env(aws_env, source, lambda_tmp), max_concurrency=1
    )
    async with lam:
        first = await lam.invoke("digits", batch.tolist())
        fetched = list((lambda_tmp / "mark-models").iterdir())
        # The object is gone; the warm runtime still serves: it did not read S3 again.
        s3.delete_object(Bucket=BUCKET, Key=KEY)
        second = await lam.invoke("digits", batch[:1].tolist())

    with torch.inference_mode():
        want = model(batch)
    assert first.cold_start and not second.cold_start
    assert torch.allclose(torch.tensor(first.outputs), want, atol=1e-5)
    assert torch.allclose(torch.tensor(second.outputs), want[:1], atol=1e-5)
    # Downloaded into /tmp, no partial left.
    files = [f for d in fetched for f in d.iterdir()]
    assert [f.suffix for f in files] == [".pt"]
    assert files[0].read_bytes() == path.read_bytes()


async def test_a_missing_model_object_is_an_error_reply(
    aws_env: str, project_root: Path, tmp_path: Path
) -> None:
    _s3(aws_env).create_bucket(Bucket=f"{BUCKET}-empty")
    source = f"s3://{BUCKET}-empty/{KEY}"
    lam = LocalLambda(cwd=project_root, env=_runtime_env(aws_env, source, tmp_path))
    async with lam:
        with pytest.raises(SpillRejected) as err:
            await lam.invoke("digits", [[[[0.0] * 8] * 8]])
    assert f"cannot read {source}" in str(err.value)
    assert "404" in str(err.value)


@pytest.mark.parametrize("source", ["s3://bucket-only", "s3://b/", "s3:///key.pt"])
def test_an_s3_source_without_bucket_and_key_is_an_error_reply(source: str) -> None:
    reply = spill.handler({"model": "m", "instances": [[1.0]], "source": source}, None)
    assert reply == {"error": f"model 'm': {source!r} is not s3://bucket/key"}
