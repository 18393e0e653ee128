"""API keys: their public ids, the hashes of their secrets, scopes and limits.

Made and revoked by operators (`mark keys`), read into the daemon's key cache; never
through the outbox: a key's change must land, or fail, where it is made.
"""

from __future__ import annotations

from sqlalchemy import select

from mark.errors import StoreError
from mark.state.engine import StoreBase
from mark.state.records import ApiKeyRecord
from mark.state.schema import ApiKeyRow


class ApiKeyStore(StoreBase):
    """The API keys of ``SqlStore``."""

    async def add_api_key(self, key: ApiKeyRecord) -> None:
        """Record a new key (its secret's hash, never the secret); an id in use is an error."""
        async with self._session.begin() as s:
            if await s.get(ApiKeyRow, key.id) is not None:
                raise StoreError(f"API key id {key.id!r} is already in use")
            s.add(
                ApiKeyRow(
                    id=key.id,
                    name=key.name,
                    scopes=",".join(key.scopes),
                    hash=key.hash,
                    created_at=key.created_at,
                    revoked_at=key.revoked_at,
                    rate_rps=key.rate_rps,
                    max_concurrency=key.max_concurrency,
                )
            )

    async def api_keys(self, *, active_only: bool = False) -> list[ApiKeyRecord]:
        """Keys, oldest first; with ``active_only``, those not revoked."""
        q = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
        if active_only:
            q = q.where(ApiKeyRow.revoked_at.is_(None))
        async with self._session() as s:
            rows = (await s.scalars(q)).all()
        return [_api_key(r) for r in rows]

    async def revoke_api_key(self, key_id: str, at: float) -> ApiKeyRecord:
        """Revoke a key from ``at`` on; one revoked already keeps its first revocation time."""
        async with self._session.begin() as s:
            row = await s.get(ApiKeyRow, key_id)
            if row is None:
                raise StoreError(f"unknown API key id {key_id!r}")
            if row.revoked_at is None:
                row.revoked_at = at
            return _api_key(row)


def _api_key(r: ApiKeyRow) -> ApiKeyRecord:
    return ApiKeyRecord(
        r.id,
        r.name,
        tuple(x for x in r.scopes.split(",") if x),
        r.hash,
        r.created_at,
        r.revoked_at,
        r.rate_rps,
        r.max_concurrency,
    )
