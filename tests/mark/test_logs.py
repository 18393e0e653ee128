"""Log lines: JSON or text, the request id of the request they are about, no secrets;
and the embedded moto server's access log kept off the terminal."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from mark import logs
from mark.cli.main import main

KEY = "mark_0123abcd_" + "f" * 32
DB_URL = "postgresql+asyncpg://mark:hunter2pass@db.internal:5432/mark"


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    """A logger writing to a string through a handler whose formatter a test picks."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("mark.test-logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, out, handler
    logger.removeHandler(handler)


def test_a_json_line_has_its_fields_and_extras(
    lines: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, out, handler = lines
    handler.setFormatter(logs.JsonFormatter())
    logger.warning("%s: %d launched", "digits", 2, extra={"model": "digits", "count": 2})
    (line,) = out.getvalue().splitlines()
    obj = json.loads(line)
    assert obj["level"] == "warning" and obj["logger"] == "mark.test-logs"
    assert obj["msg"] == "digits: 2 launched"
    assert obj["model"] == "digits" and obj["count"] == 2
    assert obj["ts"].endswith("+00:00") and "request_id" not in obj


@pytest.mark.parametrize("formatter", [logs.JsonFormatter(), logs.TextFormatter()])
def test_secrets_never_reach_a_line(
    lines: tuple[logging.Logger, io.StringIO, logging.Handler], formatter: logging.Formatter
) -> None:
    logger, out, handler = lines
    handler.setFormatter(formatter)
    logger.info("store at %s", DB_URL)
    logger.info("key %s made", KEY, extra={"url": DB_URL})
    logger.info("got header Authorization: Bearer %s", KEY)
    try:
        raise RuntimeError(f"cannot connect to {DB_URL}")
    except RuntimeError:
        logger.exception("failed")
    text = out.getvalue()
    assert "hunter2pass" not in text and "f" * 32 not in text
    assert "mark:***@db.internal" in text  # still says which store
    assert "mark_0123abcd_***" in text  # the key's public id stays


def test_metric_names_and_plain_words_are_not_mistaken_for_secrets() -> None:
    text = "mark_store_available mark_api_refused_total http://host:8080/path"
    assert logs.redact(text) == text


def test_the_request_id_is_on_every_line_written_while_handling_it(
    lines: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, out, handler = lines
    handler.setFormatter(logs.JsonFormatter())
    token = logs.REQUEST_ID.set("req-42")
    try:
        logger.info("inside")
    finally:
        logs.REQUEST_ID.reset(token)
    logger.info("outside")
    inside, outside = (json.loads(x) for x in out.getvalue().splitlines())
    assert inside["request_id"] == "req-42" and "request_id" not in outside


async def test_the_middleware_names_each_request_and_echoes_the_id(
    lines: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, out, handler = lines
    handler.setFormatter(logs.JsonFormatter())

    async def hello(_: web.Request) -> web.Response:
        logger.info("handling")
        return web.Response(text="hi")

    application = web.Application(middlewares=[logs.request_ids])
    application.router.add_get("/", hello)
    async with TestClient(TestServer(application)) as client:
        given = await client.get("/", headers={"X-Request-Id": "abc-123"})
        made = await client.get("/")
        insane = await client.get("/", headers={"X-Request-Id": "a b\tc" * 30})
    assert given.headers["X-Request-Id"] == "abc-123"
    made_id, insane_id = made.headers["X-Request-Id"], insane.headers["X-Request-Id"]
    assert len(made_id) == 16 and made_id != insane_id and " " not in insane_id
    ids = [json.loads(x)["request_id"] for x in out.getvalue().splitlines()]
    assert ids == ["abc-123", made_id, insane_id]


def test_auto_is_json_off_a_terminal_or_on_aws_and_text_on_one() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert logs.choose_format("auto", "local", io.StringIO()) == "json"
    assert logs.choose_format("auto", "aws", Tty()) == "json"
    assert logs.choose_format("auto", "local", Tty()) == "text"
    assert logs.choose_format("text", "aws", io.StringIO()) == "text"


def test_configure_replaces_the_root_handler_and_quiets_access_logs() -> None:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    out = io.StringIO()
    try:
        logs.configure("json", "INFO", out)
        logging.getLogger("mark.daemon").info("up", extra={"model": "m"})
        logging.getLogger("werkzeug").info('127.0.0.1 - - "POST / HTTP/1.1" 200 -')
        logging.getLogger("werkzeug").error("Error on request")
        got = [json.loads(x) for x in out.getvalue().splitlines()]
        assert [(g["logger"], g["msg"]) for g in got] == [
            ("mark.daemon", "up"),
            ("werkzeug", "Error on request"),
        ]
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)


def test_the_log_format_flag_is_a_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--log-format", "json", "config", "show"])
    assert done.value.code == 0
    assert "log_format: json" in capsys.readouterr().out.splitlines()
    with pytest.raises(SystemExit) as exc:
        main(["--log-format", "xml", "config", "show"])
    assert exc.value.code == 2 and "log_format" in capsys.readouterr().err


def test_the_embedded_moto_server_logs_no_access_line(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    import werkzeug._internal

    from mark.cloud.local import world

    # As in a fresh process: werkzeug has not yet set itself up to print every request.
    monkeypatch.setattr(werkzeug._internal, "_logger", None)
    wz = logging.getLogger("werkzeug")
    monkeypatch.setattr(wz, "level", logging.NOTSET)
    monkeypatch.setattr(wz, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # no handler but werkzeug's own
    server, endpoint = world._start_moto()
    try:
        sqs = boto3.client(
            "sqs",
            region_name="us-east-1",
            endpoint_url=endpoint,
            aws_access_key_id="mark-local",
            aws_secret_access_key="mark-local",
        )
        for _ in range(3):
            assert sqs.list_queues()["ResponseMetadata"]["HTTPStatusCode"] == 200
    finally:
        server.stop()  # type: ignore[attr-defined]
    err = capfd.readouterr().err
    assert "HTTP/1.1" not in err and "POST /" not in err
    assert wz.isEnabledFor(logging.ERROR)  # its errors still show


async def test_the_daemons_endpoint_gives_every_response_a_request_id() -> None:
    from mark.config import load_settings
    from mark.daemon import start_api

    settings = load_settings(overrides={"api": {"port": 0, "host": "127.0.0.1"}})
    runner, (host, port) = await start_api(settings, {})
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{host}:{port}/v2/health/live") as ok:
                assert len(ok.headers["X-Request-Id"]) == 16
            async with session.get(f"http://{host}:{port}/metrics") as refused:  # no key: 401
                assert refused.status == 401 and refused.headers["X-Request-Id"]
    finally:
        await runner.cleanup()


async def test_every_answer_of_the_endpoint_names_its_request_even_a_refusal() -> None:
    from mark.config import load_settings
    from mark.serve.endpoint import build_app

    app = build_app(load_settings())  # keys on, none valid: inference is refused
    async with TestClient(TestServer(app)) as client:
        live = await client.get("/v2/health/live", headers={"X-Request-Id": "probe-1"})
        refused = await client.post("/v1/models/digits:predict", json={"instances": []})
    assert live.headers["X-Request-Id"] == "probe-1"
    assert refused.status == 401 and len(refused.headers["X-Request-Id"]) == 16
