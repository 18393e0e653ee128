"""A profile rates only the hardware it was measured on: a file labelled ``local`` (what
`mark profile` writes off EC2) rates no type, and loading it says so and what to do; on
EC2 the metadata service names the type the profile rates."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import pytest

from bouncer.latency import BatchLatency
from mark.catalog import Catalog, load_catalog
from mark.config import ModelSpec, load_settings
from mark.control.profiles import rate_options
from mark.profile_files import (
    ec2_instance_type,
    load_profile_file,
    spill_batches,
    this_hardware,
    unrated_entries,
)
from mark.state import open_store
from mark.world import World


class _AwsRules:
    """The aws world as ``rate_options`` reads it: no emulated speed for any type."""

    boot_s = 10.0

    async def emulated_latency(
        self, spec: ModelSpec, source: str, catalog: Catalog, types: object
    ) -> dict[str, BatchLatency]:
        return {}


async def test_a_local_profile_rates_nothing_and_says_how_to_get_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    laptop = tmp_path / "digits.json"
    laptop.write_text(  # an older file: no hardware recorded; it loads as before
        json.dumps({"model": "digits", "instance_type": "local", "batch_latency_s": {"1": 0.01}})
    )
    assert set(load_profile_file(laptop, "digits")) == {"local"}
    settings = load_settings(overrides={"offerings": {"types": ["c5.large"]}})
    spec = settings.models[0].model_copy(update={"profile": laptop})
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        with caplog.at_level("WARNING", logger="mark.control"):
            rated = await rate_options(
                settings, spec, cast(World, _AwsRules()), store, "unused", load_catalog()
            )
    finally:
        await store.close()
    assert rated.options == [] and rated.sources == {}
    (said,) = [r.getMessage() for r in caplog.records if str(laptop) in r.getMessage()]
    assert "'local'" in said and "rates no offering" in said
    assert "mark profile --type T" in said and "explore_unprofiled" in said


class _Imds(BaseHTTPRequestHandler):
    """IMDSv2 as EC2 answers it: a token first, then the metadata with it."""

    def do_PUT(self) -> None:
        self._answer(200, b"tok" if self.path == "/latest/api/token" else b"")

    def do_GET(self) -> None:
        ok = self.headers.get("X-aws-ec2-metadata-token") == "tok"
        if self.path == "/latest/meta-data/instance-type" and ok:
            self._answer(200, b"g4dn.xlarge")
        else:
            self._answer(401 if not ok else 404, b"")

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def imds() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_on_ec2_the_metadata_service_names_the_type(imds: str) -> None:
    assert ec2_instance_type(imds) == "g4dn.xlarge"


def test_off_ec2_no_type(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    port = server.server_address[1]
    server.server_close()  # nothing listens there: refused at once, as off EC2
    assert ec2_instance_type(f"http://127.0.0.1:{port}", timeout_s=0.2) is None


def test_the_hardware_recorded() -> None:
    hw = this_hardware("cpu, 1 intra-op thread")
    assert hw["vcpus"] >= 1 and hw["cpu"] and hw["device"] == "cpu, 1 intra-op thread"
    assert hw["gpu"] is None


def test_a_spill_entry_sizes_spill_at_its_memory_and_rates_no_type(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    entries = [
        {"model": "m", "instance_type": "c5.large", "batch_latency_s": {"1": 0.01}},
        {"model": "m", "instance_type": "lambda-2048mb", "batch_latency_s": {"1": 0.05, "8": 0.1}},
    ]
    path.write_text(json.dumps({"profiles": entries}))
    assert spill_batches(path, "m", 2048) == BatchLatency(((1, 0.05), (8, 0.1)))
    assert spill_batches(path, "m", 3008) is None  # measured at another memory size
    assert spill_batches(None, "m", 2048) is None
    rates = load_profile_file(path, "m")
    # Not an instance type, and not a stray label either: nothing to warn about.
    assert unrated_entries(rates, load_catalog().types) == []
    assert unrated_entries({"local": BatchLatency(((1, 0.1),))}, load_catalog().types) == ["local"]


async def test_a_model_with_variants_is_planned_at_the_mix_its_floor_allows(
    tmp_path: Path,
) -> None:
    large, small, mix = (tmp_path / f"{n}.json" for n in ("large", "small", "mix"))
    for path, t in ((large, 0.2), (small, 0.04), (mix, 0.12)):
        path.write_text(json.dumps({"instance_type": "c5.large", "batch_latency_s": {"1": t}}))
    settings = load_settings(overrides={"offerings": {"types": ["c5.large"]}})
    base = settings.models[0]
    variants = [
        {"name": "large", "source": base.source, "accuracy": 0.8, "metric": "m"},
        {"name": "small", "source": base.source, "accuracy": 0.7, "metric": "m", "profile": small},
    ]
    rated = {}
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        for floor, own in ((0.8, large), (0.75, large), (0.8, mix)):
            spec = ModelSpec.model_validate(
                {
                    "name": "pair",
                    "input": {"shape": [1, 8, 8]},
                    "slo": {"rt_max_ms": 500, "sl_min": 0.98, "accuracy_floor": floor},
                    "profile": own,
                    "variants": variants,
                }
            )
            got = await rate_options(
                settings, spec, cast(World, _AwsRules()), store, "unused", load_catalog()
            )
            rated[floor, own.stem] = {
                (o.instance_type, o.market): o.capacity_rps for o in got.options
            }
    finally:
        await store.close()
    # At 0.75 half the requests may run on the small variant: rated as a model of 0.12 s
    # a request (half of 0.2 s and half of 0.04 s), above the accurate variant alone.
    key = ("c5.large", "on-demand")
    assert rated[0.75, "large"][key] == pytest.approx(rated[0.8, "mix"][key])
    assert rated[0.75, "large"][key] > rated[0.8, "large"][key]


async def test_a_type_the_model_cannot_run_on_is_not_also_said_to_await_a_profile(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """inf1 without a Neuron artifact is not planned for that reason alone: telling the
    user to measure it (exploration, `mark profile --type`) would send them nowhere."""
    settings = load_settings(overrides={"offerings": {"types": ["c5.large", "inf1.xlarge"]}})
    spec = settings.models[0]
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        with caplog.at_level("INFO", logger="mark.control"):
            await rate_options(
                settings, spec, cast(World, _AwsRules()), store, "unused", load_catalog()
            )
    finally:
        await store.close()
    said = [r.getMessage() for r in caplog.records]
    assert any("inf1.xlarge not planned" in m and "Neuron" in m for m in said), said
    (awaiting,) = [m for m in said if "no measured or shipped profile" in m]
    assert "c5.large" in awaiting and "inf1.xlarge" not in awaiting
