"""API keys on the endpoint: who may call it, for what, and how fast.

A key is ``mark_<id>_<secret>``: the id is public (it names the key in ``mark
keys list`` and in logs), the secret is 256 bits from ``secrets``. The store
keeps only the secret's SHA-256. A plain hash is right here, where a password
would need a slow salted one: the secret is random and high-entropy, so there is
no dictionary to try and nothing a salt or key stretching would add; a fast
hash keeps the check per request cheap. The comparison is constant-time
(``hmac.compare_digest``).

Scopes: ``inference`` (the model routes, metadata, readiness, the OpenAPI
document), ``metrics`` (``/metrics``) and ``admin``, which implies ``metrics``
and lets a caller see internals (which instance served a request). The load
balancer's health checks need no key and say nothing but live/ready.

The endpoint reads keys from an in-memory cache (``KeyCache``) refreshed from
the store every ``api.key_refresh_s``: a revoke takes effect within that, and a
store outage keeps the last good set, so serving goes on. Each key may have a
rate (a token bucket; ``take`` is the pure rule) and a cap on requests in
flight; over either the answer is 429 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import os
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from bouncer.wire import dump_json
from mark.config import ApiSpec
from mark.ports import Store
from mark.state.records import ApiKeyRecord

log = logging.getLogger("mark.api.auth")

INFERENCE = "inference"
METRICS = "metrics"
ADMIN = "admin"
SCOPES = (INFERENCE, METRICS, ADMIN)
IMPLIED = {ADMIN: (METRICS,)}
"""What a scope brings with it: admin may read the metrics."""

PREFIX = "mark"
ID_BYTES = 6
SECRET_BYTES = 32  # 256 bits
KEY_FILE = "api-key"
"""The token ``mark up`` created, in the data dir (mode 0600), for curl and the load generator."""
FIRST_KEY_SCOPES = (INFERENCE, METRICS)
"""The key ``mark up`` makes on a store with none: it serves, and the load generator may
read its spill count from /metrics; internals stay for admin keys."""
API_KEY_HEADER = "X-Api-Key"
"""Accepted beside ``Authorization: Bearer``: API-gateway-style clients and SDKs send it
(AWS API Gateway's header), tritonclient and curl users pass it as one plain header,
and it passes proxies that use or strip ``Authorization`` for their own login."""


# -- keys ------------------------------------------------------------------------


def parse_scopes(text: str | Iterable[str]) -> tuple[str, ...]:
    """``inference,metrics`` as scopes, in the canonical order; unknown or none: ValueError."""
    items = text.split(",") if isinstance(text, str) else list(text)
    wanted = {s.strip() for s in items if s.strip()}
    unknown = sorted(wanted - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scope {', '.join(unknown)}; allowed: {', '.join(SCOPES)}")
    if not wanted:
        raise ValueError(f"a key needs at least one scope; allowed: {', '.join(SCOPES)}")
    return tuple(s for s in SCOPES if s in wanted)


def grants(scopes: Iterable[str], needed: str) -> bool:
    """Whether a key with ``scopes`` may do what ``needed`` allows (admin implies metrics)."""
    return any(s == needed or needed in IMPLIED.get(s, ()) for s in scopes)


def hash_secret(secret: str) -> str:
    """SHA-256 of a secret, hex: enough for 256 random bits (see the module's docstring)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def split_token(token: str) -> tuple[str, str] | None:
    """(id, secret) of ``mark_<id>_<secret>``, or None when it is not shaped like one."""
    parts = token.strip().split("_", 2)
    if len(parts) != 3 or parts[0] != PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def secret_matches(secret: str, key: ApiKeyRecord) -> bool:
    """Whether ``secret`` is the key's, compared in constant time."""
    return hmac.compare_digest(hash_secret(secret), key.hash)


def issue(
    name: str,
    scopes: Iterable[str],
    now: float,
    *,
    rate_rps: float | None = None,
    max_concurrency: int | None = None,
) -> tuple[ApiKeyRecord, str]:
    """A new key: the record to store and the token to hand out (once)."""
    key_id = secrets.token_hex(ID_BYTES)
    secret = secrets.token_hex(SECRET_BYTES)
    rec = ApiKeyRecord(
        key_id,
        name,
        parse_scopes(scopes),
        hash_secret(secret),
        now,
        rate_rps=rate_rps,
        max_concurrency=max_concurrency,
    )
    return rec, f"{PREFIX}_{key_id}_{secret}"


async def create_key(
    store: Store,
    name: str,
    scopes: Iterable[str],
    now: float,
    *,
    rate_rps: float | None = None,
    max_concurrency: int | None = None,
) -> tuple[ApiKeyRecord, str]:
    """Issue a key and record it; the token is returned here and nowhere else."""
    rec, token = issue(name, scopes, now, rate_rps=rate_rps, max_concurrency=max_concurrency)
    await store.add_api_key(rec)
    return rec, token


# -- the key file ``mark up`` writes ----------------------------------------------


def read_key_file(path: Path) -> str | None:
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return token or None


def write_key_file(path: Path, token: str) -> None:
    """Write the token readable by its owner only (0600), replacing any earlier one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)


async def first_key(store: Store, data_dir: Path, now: float) -> str | None:
    """The token of the daemon's own key, kept in ``<data_dir>/api-key``.

    The saved token while it is one of the store's active keys. On a store with no
    active key: the saved token, recorded in this store (a fresh store beside the same
    data dir, e.g. the ramp demo's, keeps the key curl lines and the load generator
    already use), unless this store revoked it; else a new key, saved. On a store with
    keys of its own (``mark keys create``) and none of them saved here: None.
    """
    path = data_dir / KEY_FILE
    known = await store.api_keys()
    active = [k for k in known if k.active]
    saved = read_key_file(path)
    parts = split_token(saved) if saved is not None else None
    if parts is not None and any(k.id == parts[0] and secret_matches(parts[1], k) for k in active):
        return saved
    if active:
        log.info(
            "the store has %d API key(s) and %s holds none of them; `mark keys create` makes one",
            len(active),
            path,
        )
        return None
    adopt = parts is not None and _well_made(parts[1]) and all(k.id != parts[0] for k in known)
    if saved is not None and parts is not None and adopt:
        rec = ApiKeyRecord(parts[0], "mark up", FIRST_KEY_SCOPES, hash_secret(parts[1]), now)
        await store.add_api_key(rec)
        log.info("API key %s from %s recorded in this store", rec.id, path)
        return saved
    rec, token = await create_key(store, "mark up", FIRST_KEY_SCOPES, now)
    write_key_file(path, token)
    log.info("created API key %s (%s); its token is in %s", rec.id, ",".join(rec.scopes), path)
    return token


def _well_made(secret: str) -> bool:
    """A secret as ``issue`` makes them (256 random bits, hex): the only kind adopted."""
    try:
        return len(bytes.fromhex(secret)) == SECRET_BYTES
    except ValueError:
        return False


# -- the cache the endpoint reads ---------------------------------------------------


class KeyCache:
    """The active keys by id, as last read from the store; a failed read keeps the last."""

    def __init__(self, load: Callable[[], Awaitable[Sequence[ApiKeyRecord]]] | None = None):
        self._load = load
        self._keys: dict[str, ApiKeyRecord] = {}
        self._failing = False

    @classmethod
    def of_store(cls, store: Store) -> KeyCache:
        return cls(lambda: store.api_keys(active_only=True))

    @classmethod
    def fixed(cls, keys: Iterable[ApiKeyRecord]) -> KeyCache:
        """A cache that never reads a store (tests, benchmarks)."""
        cache = cls()
        cache.replace(keys)
        return cache

    def replace(self, keys: Iterable[ApiKeyRecord]) -> None:
        self._keys = {k.id: k for k in keys if k.active}

    def get(self, key_id: str) -> ApiKeyRecord | None:
        return self._keys.get(key_id)

    def __len__(self) -> int:
        return len(self._keys)

    async def refresh(self) -> None:
        """Re-read the store; on failure keep serving with the keys already known."""
        if self._load is None:
            return
        try:
            keys = await self._load()
        except Exception as exc:
            if not self._failing:
                log.warning("cannot re-read the API keys (%s); keeping the last %d", exc, len(self))
            self._failing = True
            return
        if self._failing:
            log.info("API keys re-read from the store again")
        self._failing = False
        self.replace(keys)

    async def run(self, every_s: float) -> None:
        """Refresh every ``every_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            await self.refresh()


# -- limits ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket: ``tokens`` as of ``at`` (seconds on a monotonic clock)."""

    tokens: float
    at: float


def take(bucket: Bucket | None, rate: float, capacity: float, now: float) -> tuple[Bucket, float]:
    """Take one request's token: (the bucket after, 0.0) when one is there; otherwise
    (the bucket refilled to ``now``, none taken, seconds until a token is there).

    Tokens refill at ``rate`` per second up to ``capacity`` (at least 1); a new bucket
    is full.
    """
    cap = max(1.0, capacity)
    tokens = cap if bucket is None else min(cap, bucket.tokens + max(0.0, now - bucket.at) * rate)
    if tokens >= 1.0:
        return Bucket(tokens - 1.0, now), 0.0
    return Bucket(tokens, now), (1.0 - tokens) / rate


def retry_after(wait_s: float) -> str:
    """``Retry-After`` in whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))


@dataclass
class Limiter:
    """Per key: its token bucket and how many of its requests are in flight.

    A key's limits are the cluster's: with ``share`` frontends live, each enforces its
    share, rate / N and ⌈cap / N⌉ (``cap`` at least 1), as the load balancer spreads a
    key's requests over them. Shared counters in the database would be exact but put a
    round trip on every request's path; a share errs by how unevenly the balancer
    spreads one key's requests, and a frontend that dies takes its share with it until
    the next beat (``mark.state.frontend_store``) counts one fewer."""

    api: ApiSpec
    buckets: dict[str, Bucket] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    share: int = 1
    """How many frontends the limits are shared by (live ones, as last counted)."""

    def limits(self, key: ApiKeyRecord) -> tuple[float | None, int | None]:
        rate = key.rate_rps if key.rate_rps is not None else self.api.default_rate_rps
        cap = (
            key.max_concurrency
            if key.max_concurrency is not None
            else self.api.default_max_concurrency
        )
        n = max(1, self.share)
        return (
            rate / n if rate is not None else None,
            max(1, math.ceil(cap / n)) if cap is not None else None,
        )

    def admit(self, key: ApiKeyRecord, now: float) -> tuple[str, float] | None:
        """None when the request may go (it is then in flight until ``done``); else
        (why not, seconds to wait)."""
        rate, cap = self.limits(key)
        if cap is not None and self.in_flight.get(key.id, 0) >= cap:
            return f"this key may have {cap} request(s) in flight", 1.0
        if rate is not None:
            bucket, wait = take(self.buckets.get(key.id), rate, rate * self.api.burst_s, now)
            self.buckets[key.id] = bucket
            if wait > 0:
                return f"this key may send {rate:g} request(s) per second", wait
        self.in_flight[key.id] = self.in_flight.get(key.id, 0) + 1
        return None

    def done(self, key: ApiKeyRecord) -> None:
        left = self.in_flight.get(key.id, 0) - 1
        if left > 0:
            self.in_flight[key.id] = left
        else:
            self.in_flight.pop(key.id, None)


# -- the middleware -----------------------------------------------------------------


@dataclass
class Auth:
    """What the middleware needs: the keys, the limits, and the scope each route needs."""

    keys: KeyCache
    api: ApiSpec
    needs: Callable[[web.Request], str | None]
    """The scope a request's route needs; None: open (health checks)."""
    clock: Callable[[], float] = time.monotonic
    limiter: Limiter = field(init=False)
    refused: Counter[tuple[int, str]] = field(default_factory=Counter)
    """Requests refused, by (status, key id; "" when no valid key)."""

    def __post_init__(self) -> None:
        self.limiter = Limiter(self.api)

    def prometheus(self) -> str:
        """Refusals as Prometheus text: who is knocking without a key, or over a limit."""
        return "".join(
            f'mark_api_refused_total{{status="{status}",key="{key_id}"}} {n}\n'
            for (status, key_id), n in sorted(self.refused.items())
        )


AUTH: web.AppKey[Auth] = web.AppKey("mark_auth", Auth)
CALLER: web.RequestKey[ApiKeyRecord] = web.RequestKey("mark_caller", ApiKeyRecord)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _deny(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=dump_json({"error": message}),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _unauthorized(message: str, invalid: bool) -> web.Response:
    challenge = 'Bearer realm="mark"' + (', error="invalid_token"' if invalid else "")
    return _deny(401, message, {"WWW-Authenticate": challenge})


def presented_token(request: web.Request) -> str | None:
    """The key a request carries: ``Authorization: Bearer <key>``, else ``X-Api-Key``."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    alt = request.headers.get(API_KEY_HEADER, "").strip()
    return alt or None


def sees_internals(request: web.Request) -> bool:
    """Whether the caller may see which instance served it: an admin key, or no auth."""
    if AUTH not in request.app:
        return True
    caller = request.get(CALLER)
    return caller is not None and ADMIN in caller.scopes


@web.middleware
async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
    """401 without a valid key, 403 without the route's scope, 429 over the key's limits."""
    auth = request.app.get(AUTH)
    if auth is None:
        return await handler(request)
    needed = auth.needs(request)
    if needed is None:
        return await handler(request)
    token = presented_token(request)
    if token is None:
        auth.refused[(401, "")] += 1
        return _unauthorized(
            f"an API key is required: send 'Authorization: Bearer <key>' or '{API_KEY_HEADER}'",
            invalid=False,
        )
    parts = split_token(token)
    key = auth.keys.get(parts[0]) if parts is not None else None
    if parts is None or key is None or not secret_matches(parts[1], key):
        auth.refused[(401, "")] += 1
        return _unauthorized("the API key is not valid (unknown, revoked or mistyped)", True)
    if not grants(key.scopes, needed):
        auth.refused[(403, key.id)] += 1
        return _deny(403, f"API key {key.id} lacks the {needed!r} scope")
    refused = auth.limiter.admit(key, auth.clock())
    if refused is not None:
        why, wait = refused
        auth.refused[(429, key.id)] += 1
        return _deny(429, f"too many requests: {why}", {"Retry-After": retry_after(wait)})
    request[CALLER] = key
    try:
        return await handler(request)
    finally:
        auth.limiter.done(key)
