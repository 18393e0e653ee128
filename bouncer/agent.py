"""The instance agent: an HTTP server on each instance hosting the model runner and the Bouncer.

``POST /v1/batch`` takes ``{"instances": [...], "dtype": "float32", "deadlines": [...]}``
(the instances of the model's input tensor; the model is the ``bouncer.contract`` it was
started with)
(deadlines are absolute Unix times) and answers with two JSON lines, streamed
(the protocol is ``bouncer.wire``'s, which the dispatcher speaks too):

1. at once, the admission: ``{"admitted": [i, ...], "rejected": [j, ...], "finish": t}`` —
   so the frontend can spill the rejected requests to Lambda while they still
   have time;
2. when the batch has run, ``{"outputs": [...]}`` for the admitted ones, in order
   (or ``{"error": "..."}``).

``GET /health`` reports readiness, queue and the batch latencies; with
``--imds-url`` it also carries ``spot_action`` once the instance metadata
service announces a spot reclaim (polled every few seconds, IMDSv2), so the
frontend, which polls every agent anyway, learns of it even if the
EventBridge → SQS notice is late or lost.

Batches run one at a time on a single worker thread, as on a real instance.
``slowdown`` emulates a slower instance type in the local world: a batch of b
takes the *profiled* T_b × slowdown (the agent sleeps out the rest of it), or
its real time if that is longer. Stretching the measured time instead would
multiply every hiccup of a shared machine by the slowdown, and the instance
would run slower than the profile the Bouncer and the planner reason with.
1.0 means this machine's speed.

The Bouncer's ``busy_until`` is a prediction (``bouncer.admission.Backlog``,
the queue state the simulator keeps too). Each time a batch ends it is set
again to that moment plus the profiled time of the batches still queued, so a
batch that overran (a machine busier than its profile) pushes back the queue
behind it and later offers are judged against when the instance will really be
free, instead of being admitted into a backlog that misses RT_max.

Every route needs the frontend's token (``bouncer.agent_token``; 401 without it),
``/health`` and ``/live`` too: health tells the queue, the served counts and a
coming spot reclaim, and ``/live`` runs an inference, so neither is harmless to
answer to anyone. ``mark-agent`` takes the token from ``MARK_AGENT_TOKEN`` and
refuses to start without one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from bouncer import event_loop
from bouncer.admission import Admission, Backlog
from bouncer.agent_token import TOKEN_ENV, TOKEN_HEADER, token_matches
from bouncer.contract import ModelContract, legacy_contract
from bouncer.device import DeviceChoice, DeviceUnavailable, Requested, probe, select_device
from bouncer.latency import BatchLatency
from bouncer.parent_watch import watch_parent_from_env
from bouncer.runner import ModelLoadError, ModelRunner
from bouncer.wire import (
    BATCH_PATH,
    DTYPES,
    FALLBACK_HEADER,
    NDJSON_TYPE,
    VARIANT_HEADER,
    Batch,
    batch_size,
    decode_batch,
    encode_error,
    encode_outputs,
    encode_verdict,
    take,
)

log = logging.getLogger("mark.agent")


@dataclass
class AgentStats:
    served: int = 0
    rejected: int = 0
    batches: int = 0
    errors: int = 0


@dataclass
class ImdsPoller:
    """Reads ``spot/instance-action`` from the instance metadata service (IMDSv2).

    The path answers 404 until AWS decides to reclaim the spot instance, then
    ``{"action": "terminate"|"stop"|"hibernate", "time": "...Z"}``. A session
    token (PUT ``/latest/api/token``) is fetched once and renewed before it
    expires or when the service answers 401.
    """

    url: str  # http://169.254.169.254 on EC2
    interval_s: float = 5.0
    token_ttl_s: int = 21600
    action: dict[str, str] | None = None
    _token: str | None = None
    _token_expires: float = 0.0

    async def _fetch_token(self, session: aiohttp.ClientSession) -> str:
        async with session.put(
            f"{self.url}/latest/api/token",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)},
        ) as r:
            r.raise_for_status()
            self._token = await r.text()
        self._token_expires = time.monotonic() + self.token_ttl_s - 60.0
        return self._token

    async def poll_once(self, session: aiohttp.ClientSession) -> dict[str, str] | None:
        """One read; the action once announced (and from then on), else ``None``."""
        for _ in range(2):
            token = self._token
            if token is None or time.monotonic() >= self._token_expires:
                token = await self._fetch_token(session)
            async with session.get(
                f"{self.url}/latest/meta-data/spot/instance-action",
                headers={"X-aws-ec2-metadata-token": token},
            ) as r:
                if r.status == 401:  # expired or the service restarted: a new token, once
                    self._token = None
                    continue
                if r.status == 404:
                    return self.action
                r.raise_for_status()
                body = json.loads(await r.text())  # IMDS sends text/plain
            if isinstance(body, dict) and "action" in body:
                self.action = {"action": str(body["action"]), "time": str(body.get("time", ""))}
            return self.action
        return self.action

    async def run(self) -> None:
        """Poll until cancelled; a failed poll is logged and retried at the next interval."""
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    before = self.action
                    if await self.poll_once(session) != before:
                        log.warning("IMDS announces a spot %s", self.action)
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    log.info("IMDS poll failed: %s", exc)
                await asyncio.sleep(self.interval_s)


@dataclass
class Agent:
    """The Bouncer's state on one instance: what is queued, and until when it is busy."""

    runner: ModelRunner
    latency: BatchLatency
    slowdown: float = 1.0
    clock: Callable[[], float] = time.time
    timer: Callable[[], float] = time.perf_counter  # times a batch
    pause: Callable[[float], None] = time.sleep  # sleeps out the emulated rest of a batch
    imds: ImdsPoller | None = None
    backlog: Backlog = field(default_factory=Backlog)
    stats: AgentStats = field(default_factory=AgentStats)
    _executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner")
    )
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    example: np.ndarray[Any, Any] | dict[str, np.ndarray[Any, Any]] | None = None
    """The liveness probe's inference: one instance of the one input (no batch dimension),
    or a batch of one of every named input."""
    probe_timeout_s: float = 5.0
    token: str | None = None
    """The frontend's token every request must carry; None checks nothing (agents built
    in-process by tests; ``main`` always sets one)."""
    _probe: asyncio.Future[Any] | None = None
    _probe_started: float = 0.0  # perf_counter when the probe in flight began
    variants: dict[str, tuple[ModelRunner, BatchLatency]] = field(default_factory=dict)
    """The model's other variants, loaded beside its own: name to runner and T_b here. A
    batch names the one it runs on (``VARIANT_HEADER``); none: the model's own."""

    @property
    def busy_until(self) -> float:
        return self.backlog.busy_until

    @property
    def queue_depth(self) -> int:
        return self.backlog.depth

    @property
    def primary(self) -> str | None:
        """The name of the variant the model's own artifact is, where it has variants."""
        variants = self.runner.contract.variants
        return variants[0].name if variants else None

    def expected_latency(self, batch: int, variant: str | None = None) -> float:
        latency = self.latency if variant is None else self.variants[variant][1]
        return latency(batch) * self.slowdown

    def infer(self, batch: Batch, variant: str | None = None) -> Any:
        """One batch through the runner (of ``variant``, else the model's own). Named
        inputs give each row's outputs by name; the one input's array (a caller of the
        original protocol) its one output's array."""
        runner = self.runner if variant is None else self.variants[variant][0]
        contract = runner.contract
        if isinstance(batch, dict):
            out = runner.run(batch)
            return [{n: a[i] for n, a in out.items()} for i in range(batch_size(batch))]
        outputs = runner.run({contract.inputs[0].name: batch})
        return outputs[contract.outputs[0].name]

    def _run_timed(self, batch: Batch, variant: str | None = None) -> Any:
        t0 = self.timer()
        out = self.infer(batch, variant)
        if self.slowdown > 1.0:  # emulate a slower instance type (local world only)
            rest = self.expected_latency(batch_size(batch), variant) - (self.timer() - t0)
            if rest > 0:
                self.pause(rest)
        return out

    def _misses(self, deadlines: list[float], variant: str | None) -> bool:
        """Whether the whole batch on ``variant`` would end past its earliest deadline."""
        start = max(self.clock(), self.backlog.busy_until)
        return start + self.expected_latency(len(deadlines), variant) > min(deadlines)

    def offer(self, deadlines: list[float], variant: str | None = None) -> Admission:
        """The Bouncer's verdict on a batch offered now; what it admits joins the queue."""
        decision = self.backlog.offer(
            self.clock(), deadlines, lambda b: self.expected_latency(b, variant)
        )
        self.stats.rejected += len(decision.rejected)
        return decision

    def done(self, decision: Admission) -> None:
        """An admitted batch has ended: the queue behind it is as late (or early) as it was."""
        self.backlog.done(self.clock(), decision)

    async def handle_batch(self, request: web.Request) -> web.StreamResponse:
        variant = request.headers.get(VARIANT_HEADER) or None
        if variant is not None and variant not in self.variants:
            if variant != self.primary:
                known = ", ".join([self.primary or "(the model's own)", *self.variants])
                return web.json_response(
                    {"error": f"no variant {variant!r} loaded here (loaded: {known})"}, status=400
                )
            variant = None
        try:
            dtypes = {t.name: t.dtype for t in self.runner.contract.inputs}
            batch, deadlines = decode_batch(await request.read(), dtypes)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSONDecodeError too
            return web.json_response({"error": f"bad batch: {exc}"}, status=400)

        fallback = request.headers.get(FALLBACK_HEADER)
        if fallback in self.variants and deadlines and self._misses(deadlines, variant):
            variant = fallback  # the named variant would finish it late; this one may not
        decision = self.offer(deadlines, variant)

        resp = web.StreamResponse(headers={"Content-Type": NDJSON_TYPE})
        ran = variant if variant is not None else self.primary
        head = encode_verdict(decision.admitted, decision.rejected, decision.finish, ran)
        try:
            await resp.prepare(request)
            await resp.write(head)
        except BaseException:  # the caller went away: its batch will not run
            if decision.size:
                self.done(decision)
            raise
        if not decision.size:
            await resp.write_eof()
            return resp
        out: Any = None
        error: str | None = None
        try:
            async with self._lock:  # one batch at a time, in arrival order
                loop = asyncio.get_running_loop()
                out = await loop.run_in_executor(
                    self._executor, self._run_timed, take(batch, decision.admitted), variant
                )
            self.stats.served += decision.size
            self.stats.batches += 1
        except Exception as exc:  # a model failure is reported, never crashes the agent
            log.exception("batch failed")
            self.stats.errors += decision.size
            error = f"inference failed: {type(exc).__name__}: {exc}"
        finally:
            self.done(decision)
        await resp.write(encode_outputs(out) if error is None else encode_error(error))
        await resp.write_eof()
        return resp

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "ready": True,
                "queue_depth": self.queue_depth,
                "busy_until": self.busy_until,
                "served": self.stats.served,
                "rejected": self.stats.rejected,
                "batches": self.stats.batches,
                "errors": self.stats.errors,
                "batch_latency_s": [[b, t * self.slowdown] for b, t in self.latency.points],
                "variants": {
                    name: [[b, t * self.slowdown] for b, t in lat.points]
                    for name, (_, lat) in self.variants.items()
                },
                "spot_action": self.imds.action if self.imds is not None else None,
            }
        )

    async def live(self, _: web.Request) -> web.Response:
        """The liveness probe: one tiny inference through the runner's own thread, bounded.

        ``/health`` answers from the event loop even while the model is stuck in its
        thread; this goes where the batches go, so a hung model fails it (503) and
        the daemon drains and replaces the instance. Several frontends probe one agent:
        a probe that arrives while another's inference is in flight shares it (and its
        deadline) rather than starting a second, so two healthy probes never fail each
        other; only an inference older than the timeout is a stuck model.
        """
        if self.example is None:
            return web.json_response({"live": True, "probe": "none"})
        t0 = time.perf_counter()
        if self._probe is None or self._probe.done():
            loop = asyncio.get_running_loop()
            # One instance of the one input, or a batch of one of every named input.
            probe = self.example if isinstance(self.example, dict) else self.example[None]
            self._probe = loop.run_in_executor(self._executor, self.infer, probe)
            self._probe_started = t0
        left = self.probe_timeout_s - (t0 - self._probe_started)
        try:
            await asyncio.wait_for(asyncio.shield(self._probe), max(left, 0.0))
        except TimeoutError:
            why = f"one inference took over {self.probe_timeout_s:g} s: the model is stuck"
            return web.json_response({"live": False, "reason": why}, status=503)
        except Exception as exc:  # the model itself fails: not live either
            return web.json_response({"live": False, "reason": str(exc)}, status=503)
        return web.json_response({"live": True, "probe_s": time.perf_counter() - t0})

    @web.middleware
    async def _only_the_frontend(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        if self.token is not None and not token_matches(
            request.headers.get(TOKEN_HEADER), self.token
        ):
            # Before the body is read: a stranger's batch costs nothing to refuse.
            return web.json_response({"error": f"missing or wrong {TOKEN_HEADER}"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=64 * 1024 * 1024, middlewares=[self._only_the_frontend]
        )
        app.add_routes(
            [
                web.post(BATCH_PATH, self.handle_batch),
                web.get("/health", self.health),
                web.get("/live", self.live),
            ]
        )
        # On cleanup, not shutdown: aiohttp still answers requests in flight (and ones
        # arriving on kept-alive connections) between the two, and they need the runner.
        app.on_cleanup.append(self._shutdown)
        return app

    async def _shutdown(self, _: web.Application) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)


def build_agent(
    contract: ModelContract,
    slowdown: float,
    latency: BatchLatency | None = None,
    choice: DeviceChoice | None = None,
) -> Agent:
    """Load the model on ``choice``'s device (the CPU, one thread, if none), warm it up,
    and profile it here unless the profile to emulate is given.

    The local world gives every agent the one profile it measured at start: an
    agent profiling itself while other agents start and serve on the same
    machine measures their load, and would emulate an instance many times
    slower than the one the planner bought.
    """
    runner = ModelRunner(contract, choice=choice, warm=True)  # the first call is the slowest
    if latency is None:
        latency = runner.profile()
    example = contract.example(1)
    variants: dict[str, tuple[ModelRunner, BatchLatency]] = {}
    for v in contract.variants[1:]:  # the first is the model's own artifact
        other = ModelRunner(contract.variant(v.name), choice=choice, warm=True)
        # Each variant is profiled here: its speed relative to the model's own is what
        # the frontend chooses by (bouncer.variants).
        variants[v.name] = (other, other.profile())
    return Agent(
        runner=runner, latency=latency, slowdown=slowdown, example=example, variants=variants
    )


def choose_device(
    requested: Requested, threads: int | None, neuron_artifact: str | None
) -> DeviceChoice:
    """This machine's device for the agent; ``OMP_NUM_THREADS`` (the local world sets 1)
    stands in for ``--threads`` when that is not given."""
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if threads is None and omp.isdigit() and int(omp) > 0:
        threads = int(omp)
    return select_device(
        probe(), neuron_artifact=neuron_artifact, requested=requested, threads=threads
    )


async def _serve(agent: Agent, host: str, port: int) -> None:
    # No access log: a line per request costs more than the request on a small model;
    # the frontend's telemetry records every request's outcome and latency.
    runner = web.AppRunner(agent.app(), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    poller = asyncio.create_task(agent.imds.run()) if agent.imds is not None else None
    print(f"READY {bound}", flush=True)  # the supervisor reads the port from this line
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if poller is not None:
        poller.cancel()
    await runner.cleanup()


def repository_contract(repository: str, model: str, version: str | None) -> ModelContract:
    """The contract of ``model`` in a model repository, its files on this machine (from S3:
    fetched under ``$MARK_DATA_DIR/models``). The manifest is read as the controller
    reads it (``mark.config``), so both agree on every tensor."""
    import tempfile
    from pathlib import Path

    from pydantic import ValidationError

    from mark.config import ModelSpec
    from mark.config.manifest import fetch_model_dir

    cache = Path(os.environ.get("MARK_DATA_DIR") or tempfile.gettempdir()) / "models"
    directory = fetch_model_dir(repository, model, version, cache)
    entry: dict[str, Any] = {"path": str(directory)}
    if version:
        entry["version"] = version
    try:
        spec = ModelSpec.model_validate(entry)
    except ValidationError as exc:
        raise ValueError(f"model {model!r} in {repository}: {exc}") from None
    return spec.contract(spec.source)


def _contract(args: argparse.Namespace) -> ModelContract:
    """The contract given as JSON, or one built from a source, a shape and a dtype."""
    if args.model_contract:
        return ModelContract.from_json(args.model_contract)
    if args.repository:
        if not args.model:
            raise ValueError("--repository needs --model")
        return repository_contract(args.repository, args.model, args.version)
    if not args.input_shape:
        raise ValueError("--model-source needs --input-shape")
    shape = tuple(int(d) for d in args.input_shape.split(","))
    return legacy_contract("model", args.model_source, shape, args.dtype)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="mark-agent", description="mark's instance agent: model runner + Bouncer"
    )
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--model-contract",
        help="the model's contract as JSON (bouncer.contract: format, artifact, tensors)",
    )
    given.add_argument(
        "--repository",
        help="a model repository (a directory or s3://bucket/prefix): serve --model from it, "
        "fetched at start (the aws world's workers, by their mark:model and mark:version tags)",
    )
    p.add_argument("--model", help="with --repository: the model's name")
    p.add_argument("--version", help="with --repository: the version (default: the manifest's)")
    given.add_argument(
        "--model-source",
        help="a TorchScript path or module:factory with one input (--input-shape, --dtype) "
        "and one output",
    )
    p.add_argument("--input-shape", help="with --model-source: one instance's shape, e.g. 1,8,8")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--slowdown", type=float, default=1.0, help="emulate a slower instance")
    p.add_argument(
        "--latency",
        default=None,
        help="T_b on this machine to emulate, b:seconds,... (default: profile at start)",
    )
    p.add_argument(
        "--imds-url",
        default=None,
        help="poll the metadata service for spot reclaims (on EC2: http://169.254.169.254)",
    )
    p.add_argument("--imds-interval", type=float, default=5.0, help="seconds between polls")
    p.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="auto: CUDA if torch sees a GPU, else Neuron with --neuron-artifact, else the CPU",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: $OMP_NUM_THREADS if set, else one per vCPU "
        "on the CPU and 2 beside an accelerator)",
    )
    p.add_argument(
        "--neuron-artifact",
        default=None,
        help="the model compiled for Neuron (TorchScript from torch_neuronx/torch_neuron.trace)",
    )
    args = p.parse_args(argv)
    from mark import logs  # every mark process logs alike (JSON off a terminal)

    watch_parent_from_env()  # the local world's agents end with the daemon that started them

    logs.configure(logs.choose_format(os.environ.get("MARK_LOG_FORMAT", "auto"), "any"))
    try:
        token = os.environ.get(TOKEN_ENV, "")
        if not token:
            raise ValueError(f"{TOKEN_ENV} is not set: the agent would serve anyone who asks")
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        contract = _contract(args)
        latency = BatchLatency.parse(args.latency) if args.latency else None
        # An empty artifact (the stack's default) means none.
        choice = choose_device(args.device, args.threads, args.neuron_artifact or None)
        log.log(
            logging.WARNING if choice.warning else logging.INFO, "device: %s", choice.describe()
        )
        agent = build_agent(contract, max(args.slowdown, 1.0), latency, choice)
        agent.token = token
        if args.imds_url:
            agent.imds = ImdsPoller(args.imds_url.rstrip("/"), max(args.imds_interval, 0.1))
    except (ModelLoadError, DeviceUnavailable, ValueError) as exc:  # ContractError too
        print(f"error: {exc}", file=sys.stderr)
        return 2
    event_loop.run(_serve(agent, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
