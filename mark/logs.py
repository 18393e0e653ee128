"""How mark's processes log: one JSON object per line, or text for a person at a terminal.

JSON is for a log collector (CloudWatch, journald, Loki): each line carries ``ts``,
``level``, ``logger``, ``msg`` and every ``extra=`` field (``model``,
``instance_id``, ...), and the ``request_id`` of the request it is about, taken
from a context variable that the endpoint's middleware sets per request, so a
line written anywhere below a handler (tasks it starts included) names it.
Text is the same line for a terminal. ``auto`` (the default) picks JSON in the
aws world or when stderr is not a terminal, text otherwise.

Whatever the format, a line never shows a secret: an API key's secret half, the
password in a URL (a PostgreSQL ``database_url``) and a bearer token are masked
in the formatted line, arguments and tracebacks included. Payloads (tensors) are
not logged at all: no call site passes one.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any, Literal

from aiohttp import web

LogFormat = Literal["auto", "json", "text"]

REQUEST_ID: ContextVar[str | None] = ContextVar("mark_request_id", default=None)
"""The id of the request being handled, if any (set by ``request_ids``)."""

REQUEST_ID_HEADER = "X-Request-Id"
_GOOD_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")

_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}
"""Attributes every record has: what is not one of them came in through ``extra=``."""

_SECRETS = (
    # mark_<id>_<secret>: the id is public (it names the key in `mark keys list`).
    (re.compile(r"\bmark_([0-9a-f]{4,})_[0-9a-f]{8,}\b"), r"mark_\1_***"),
    # scheme://user:password@host
    (re.compile(r"\b([a-z][a-z0-9+.-]*://[^:/@\s]*):[^@\s]*@"), r"\1:***@"),
    (re.compile(r"(?i)\b(bearer\s+)[^\s\"',]+"), r"\1***"),
)


CHATTY = ("botocore.credentials", "aiobotocore.credentials")
"""Loggers whose INFO lines say nothing an operator needs ("Found credentials in
environment variables.", once per client)."""


def redact(text: str) -> str:
    """``text`` with API key secrets, URL passwords and bearer tokens masked."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    out = {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS}
    rid = REQUEST_ID.get()
    if rid is not None:
        out.setdefault("request_id", rid)
    return out


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC ISO 8601), level, logger, msg, extras, exc."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in _extras(record).items():
            line.setdefault(key, redact(v) if isinstance(v := _plain(value), str) else v)
        if record.exc_info:
            line["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time level logger: msg key=value ...`` for a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={_plain(v)}" for k, v in _extras(record).items())
        if fields:
            head, _, tail = line.partition("\n")  # fields before a traceback, not after
            line = f"{head} {fields}" + (f"\n{tail}" if tail else "")
        return redact(line)


def choose_format(setting: str, world: str, stream: IO[str] | None = None) -> str:
    """``json`` or ``text``: as set, else JSON in the aws world or off a terminal."""
    if setting != "auto":
        return setting
    out = stream if stream is not None else sys.stderr
    on_tty = hasattr(out, "isatty") and out.isatty()
    return "json" if world == "aws" or not on_tty else "text"


def configure(
    fmt: str, level: int | str = logging.INFO, stream: IO[str] | None = None
) -> logging.Handler:
    """Send the root logger's records to ``stream`` (stderr) in ``fmt``; replaces any
    handler an earlier call (or ``basicConfig``) put there. Returns the handler."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    quiet_access_logs()
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    return handler


def quiet_access_logs() -> None:
    """Request-by-request access logs (werkzeug's, of the embedded moto server; aiohttp's)
    go to DEBUG: a daemon making two EC2 calls a second must not fill the terminal.
    Their warnings and errors still show."""
    for name in ("werkzeug", "aiohttp.access"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give each request an id (the client's ``X-Request-Id`` when it is a sane token),
    set it for the log lines written while handling it, and echo it in the response."""
    given = request.headers.get(REQUEST_ID_HEADER, "")
    rid = given if _GOOD_ID.fullmatch(given) else new_request_id()
    token = REQUEST_ID.set(rid)
    try:
        response = await handler(request)
    finally:
        REQUEST_ID.reset(token)
    if not response.prepared:
        response.headers[REQUEST_ID_HEADER] = rid
    return response
