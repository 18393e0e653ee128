"""Stand-in for one instance's metadata service (IMDSv2), for the spot interruption path.

On EC2 the agent polls ``http://169.254.169.254/latest/meta-data/spot/instance-action``
with an IMDSv2 session token; the path answers 404 until AWS decides to reclaim
the spot instance, then ``{"action": "terminate", "time": "2026-01-01T00:02:00Z"}``
(about two minutes ahead). moto has no IMDS, so this server answers the same
way for one instance, and ``arm`` plays AWS's decision:

* ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1..21600)
  returns a token (400 without a valid TTL);
* ``GET /latest/meta-data/...`` without a live token is 401, as with
  ``HttpTokens=required``;
* ``GET /latest/meta-data/instance-id`` is the instance id;
* ``GET /latest/meta-data/spot/instance-action`` is 404 until armed, then the JSON.

Not emulated: the rest of the metadata tree, the hop limit, IMDSv1.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime, timedelta

from aiohttp import web

TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"


class ImdsStandin:
    def __init__(self, instance_id: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.instance_id = instance_id
        self.host = host
        self.port = port
        self.url = ""
        self.action: dict[str, str] | None = None
        self.polls = 0  # spot/instance-action reads, for tests
        self._tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        self._runner: web.AppRunner | None = None

    def arm(self, action: str = "terminate", in_s: float = 120.0) -> dict[str, str]:
        """AWS decided to reclaim the instance ``in_s`` from now: answer the notice from now on."""
        at = datetime.now(UTC) + timedelta(seconds=in_s)
        self.action = {"action": action, "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return self.action

    async def start(self) -> str:
        app = web.Application()
        app.router.add_put("/latest/api/token", self._token)
        app.router.add_get("/latest/meta-data/instance-id", self._instance_id)
        app.router.add_get("/latest/meta-data/spot/instance-action", self._instance_action)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{self.port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _token(self, request: web.Request) -> web.Response:
        try:
            ttl = int(request.headers[TTL_HEADER])
        except (KeyError, ValueError):
            ttl = 0
        if not 1 <= ttl <= 21600:
            return web.Response(status=400, text="Bad Request")
        token = secrets.token_urlsafe(32)
        self._tokens[token] = time.monotonic() + ttl
        return web.Response(text=token, headers={TTL_HEADER: str(ttl)})

    def _authorised(self, request: web.Request) -> bool:
        expiry = self._tokens.get(request.headers.get(TOKEN_HEADER, ""))
        return expiry is not None and time.monotonic() < expiry

    async def _instance_id(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.Response(status=401, text="Unauthorized")
        return web.Response(text=self.instance_id)

    async def _instance_action(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.Response(status=401, text="Unauthorized")
        self.polls += 1
        if self.action is None:
            return web.Response(status=404, text="Not Found")
        return web.json_response(self.action)
