"""The load generator: profiles, the Poisson schedule, and a run against a tiny real server."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from bouncer.wire import SERVED_BY_HEADER
from mark.demo.load_results import RequestResult, summarize
from mark.demo.loadgen import ModelInput, run_load
from mark.demo.rate_profile import LoadgenError, RateProfile, arrival_times


def test_profile_parses_and_interpolates() -> None:
    p = RateProfile.parse("0:5, 60:40,180:40,240:5")
    assert p.points == ((0, 5), (60, 40), (180, 40), (240, 5))
    assert p.duration == 240 and p.peak == 40
    assert p.rate(30.0) == pytest.approx(22.5)
    assert list(p.rate(np.array([-1.0, 0.0, 120.0, 240.0, 241.0]))) == [0, 5, 40, 5, 0]
    assert p.expected_requests() == pytest.approx(60 * 22.5 + 120 * 40 + 60 * 22.5)
    assert str(p) == "0:5,60:40,180:40,240:5"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0:5", "at least two points"),
        ("5:1,10:2", "must start at 0 s"),
        ("0:1,10:2,10:3", "must increase"),
        ("0:1,10", "is not SECONDS:RATE"),
        ("0:1,ten:2", "must be numbers"),
        ("0:1,10:-2", "finite and >= 0"),
        ("0:0,10:0", "nothing would be sent"),
    ],
)
def test_bad_profiles_fail_with_one_line(text: str, needle: str) -> None:
    with pytest.raises(LoadgenError, match=needle) as err:
        RateProfile.parse(text)
    assert "\n" not in str(err.value)


def test_trace_profile_is_time_compressed(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.gz"
    rows = ["second,requests"] + [f"{s},{1 if s < 120 else 3}" for s in range(240)]
    path.write_bytes(gzip.compress("\n".join(rows).encode()))
    p = RateProfile.from_trace(path, speedup=60.0, scale=2.0)
    # 4 minutes -> 4 points one second apart; 5 s max rate 1 then 3, scaled by 2
    assert p.points == ((0, 2), (1, 2), (2, 6), (3, 6))
    with pytest.raises(LoadgenError, match="trace file not found"):
        RateProfile.from_trace(tmp_path / "missing.csv")
    with pytest.raises(LoadgenError, match="fewer than 2 minutes"):
        RateProfile.from_trace(path, start_minute=3)


def test_poisson_schedule_statistics() -> None:
    flat = RateProfile.parse("0:50,200:50")
    t = arrival_times(flat, np.random.default_rng(1))
    assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] <= 200
    assert abs(t.size - 10_000) < 4 * 100  # Poisson: sd = sqrt(10000)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV 1
    # A ramp: counts per 20 s bin follow the integral of the rate.
    ramp = RateProfile.parse("0:0,100:100")
    t = arrival_times(ramp, np.random.default_rng(2))
    counts, _ = np.histogram(t, bins=5, range=(0, 100))
    expected = np.array([200, 600, 1000, 1400, 1800])
    assert np.all(np.abs(counts - expected) < 4 * np.sqrt(expected))
    # Same seed, same schedule.
    assert np.array_equal(
        arrival_times(ramp, np.random.default_rng(3)), arrival_times(ramp, np.random.default_rng(3))
    )


def test_model_input_from_v2_metadata_and_bodies() -> None:
    meta: dict[str, Any] = {
        "name": "digits",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}],
        "slo": {"rt_max_ms": 100, "sl_min": 0.98},
    }
    inp = ModelInput.from_metadata(meta)
    assert inp.shape == (1, 8, 8) and inp.dtype == "float32" and inp.rt_max_ms == 100
    row = inp.random_row(np.random.default_rng(0))
    assert row.shape == (1, 8, 8) and row.min() >= 0 and row.max() < 1
    import orjson

    v2 = orjson.loads(inp.body(row, "v2"))["inputs"][0]
    assert v2["shape"] == [1, 1, 8, 8] and len(v2["data"]) == 64
    assert np.asarray(orjson.loads(inp.body(row, "v1"))["instances"]).shape == (1, 1, 8, 8)
    with pytest.raises(LoadgenError, match="not supported"):
        ModelInput.from_metadata({**meta, "inputs": [{**meta["inputs"][0], "datatype": "BYTES"}]})
    with pytest.raises(LoadgenError, match="lacks inputs"):
        ModelInput.from_metadata({"name": "x"})


def test_summary_counts_errors_and_rt_max() -> None:
    outs = [
        RequestResult(0, 0, 0.05, 200),
        RequestResult(1, 1, 0.2, 200),
        RequestResult(2, 2.1, 0.01, 503, None, "x"),
    ]
    s = summarize(outs, rt_max_ms=100)
    assert (s.sent, s.ok, s.errors) == (3, 2, 1)
    assert s.within_rt_max == pytest.approx(1 / 3)
    assert s.max_send_lag_ms == pytest.approx(100)
    assert s.spilled is None and "spilled to Lambda unknown" in s.lines()[0]
    assert s.error_kinds == {"503": 1} and "errors: 503 x1" in s.lines()


async def _server(delay_s: float) -> tuple[web.AppRunner, str, list[dict[str, Any]]]:
    """A tiny V2 server: metadata, infer (answers after ``delay_s``), /metrics."""
    seen: list[dict[str, Any]] = []
    state = {"spilled": 0}

    async def meta(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": "m",
                "inputs": [{"name": "input", "datatype": "INT64", "shape": [-1, 3]}],
                "slo": {"rt_max_ms": 1000},
            }
        )

    async def infer(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        await asyncio.sleep(delay_s)
        lam = len(seen) % 2 == 0
        state["spilled"] += lam
        return web.json_response(
            {"outputs": []}, headers={SERVED_BY_HEADER: "lambda" if lam else "i-1"}
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            text=f'mark_requests_total{{model="m",outcome="spilled"}} {state["spilled"]}\n'
        )

    app = web.Application()
    app.add_routes(
        [
            web.get("/v2/models/m", meta),
            web.post("/v2/models/m/infer", infer),
            web.get("/metrics", metrics),
        ]
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}", seen


async def test_open_loop_run_against_a_real_server() -> None:
    # Answers take 0.3 s; at 40 r/s a closed loop of one would send ~7, open loop sends ~40.
    runner, url, seen = await _server(0.3)
    try:
        ticks: list[int] = []
        res = await run_load(
            url,
            "m",
            RateProfile.parse("0:40,1:40"),
            seed=4,
            progress=lambda _t, sent, _ok, _err: ticks.append(sent),
        )
    finally:
        await runner.cleanup()
    s = res.summary
    assert s is not None
    assert s.sent == len(seen) == len(res.outcomes) and s.sent > 20
    assert s.errors == 0 and s.ok == s.sent
    assert s.p50_ms >= 300 and s.within_rt_max == 1.0
    assert s.spilled == s.served_by["lambda"] and s.served_by["i-1"] > 0
    assert max(o.sent_s - o.due_s for o in res.outcomes) < 0.2  # nobody waited for answers
    assert seen[0]["inputs"][0]["shape"] == [1, 3] and seen[0]["inputs"][0]["datatype"] == "INT64"
    assert ticks and ticks[-1] == s.sent


async def test_unknown_model_and_unreachable_server_are_one_line_errors() -> None:
    runner, url, _ = await _server(0.0)
    try:
        with pytest.raises(LoadgenError, match="answered 404"):
            await run_load(url, "nope", RateProfile.parse("0:1,1:1"))
    finally:
        await runner.cleanup()
    with pytest.raises(LoadgenError, match="cannot reach"):
        await run_load(url, "m", RateProfile.parse("0:1,1:1"))


def test_the_key_comes_from_the_env_else_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mark.demo.loadgen import find_api_key
    from mark.serve.auth import write_key_file

    assert find_api_key() is None  # MARK_DATA_DIR (tmp_path / "data") holds no key yet
    write_key_file(tmp_path / "data" / "api-key", "mark_a_saved")
    assert find_api_key() == "mark_a_saved"  # the data dir of the settings (MARK_DATA_DIR)
    assert find_api_key(tmp_path / "elsewhere") is None
    monkeypatch.setenv("MARK_API_KEY", "mark_b_env")
    assert find_api_key() == find_api_key(tmp_path / "elsewhere") == "mark_b_env"


async def test_every_request_carries_the_key_and_a_refusal_says_how_to_give_one(
    tmp_path: Path,
) -> None:
    from mark.serve.auth import write_key_file

    keys: list[str | None] = []

    async def guarded(request: web.Request) -> web.Response:
        keys.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer mark_k_s":
            return web.json_response({"error": "an API key is required"}, status=401)
        if request.path == "/v2/models/m":
            return web.json_response(
                {"name": "m", "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 2]}]}
            )
        if request.path == "/metrics":
            return web.Response(status=403)  # a key without the metrics scope
        return web.json_response({"outputs": []})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", guarded)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    try:
        res = await run_load(url, "m", RateProfile.parse("0:20,1:20"), api_key="mark_k_s")
        assert res.summary is not None and res.summary.errors == 0 and res.summary.sent > 5
        assert res.summary.spilled is None  # no metrics scope, no served-by: unknown
        assert set(keys) == {"Bearer mark_k_s"}
        write_key_file(tmp_path / "data" / "api-key", "mark_k_s")  # what `mark up` saves
        found = await run_load(url, "m", RateProfile.parse("0:5,1:5"))
        assert found.summary is not None and found.summary.errors == 0
        (tmp_path / "data" / "api-key").unlink()
        with pytest.raises(LoadgenError, match=r"answered 401.*pass --api-key, set MARK_API_KEY"):
            await run_load(url, "m", RateProfile.parse("0:1,1:1"))
    finally:
        await runner.cleanup()
