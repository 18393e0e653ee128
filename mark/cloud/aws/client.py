"""The lifecycle every aiobotocore-backed adapter shares, written once.

An adapter opens its client on ``open()`` (or ``async with``) and closes it on
``close()``; a client handed in (a unit test's stand-in) is used as is and
never closed by the adapter.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session


class OwnedClient:
    service: str = ""
    region: str
    endpoint_url: str | None
    _client: Any
    _client_cm: Any

    def _client_config(self) -> AioConfig | None:
        return None

    async def open(self) -> None:
        """Create the client (idempotent)."""
        if self._client is not None:
            return
        self._client_cm = get_session().create_client(
            self.service,
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            config=self._client_config(),
        )
        self._client = await self._client_cm.__aenter__()

    async def close(self) -> None:
        """Close the client if this adapter created it."""
        if self._client_cm is not None:
            cm, self._client_cm, self._client = self._client_cm, None, None
            await cm.__aexit__(None, None, None)

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
