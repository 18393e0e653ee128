"""The shared secret between the frontend and its agents: agents answer only the frontend.

Every request to an agent carries ``X-Mark-Agent-Token``; an agent answers any
other with 401 (compared in constant time). The security group already admits
only the controller on AWS, but on a laptop any local process can reach an
agent's loopback port, and one layer is not enough for a port that runs a
model.

The daemon and its agents learn the token from ``MARK_AGENT_TOKEN`` in their
environment, never from a command line (``ps`` shows every argument to every
user). On AWS the stack generates it in Secrets Manager and each machine's
bootstrap writes it to a root-only environment file (``infra/README.md``). In
the local world nothing sets it, so the daemon makes a random one when first
asked, and hands it to each agent it spawns in that agent's environment.
"""

from __future__ import annotations

import hmac
import os
import secrets

TOKEN_HEADER = "X-Mark-Agent-Token"
TOKEN_ENV = "MARK_AGENT_TOKEN"

_made: str | None = None


def daemon_token() -> str:
    """This process's agent token: ``$MARK_AGENT_TOKEN``, else one made at random once
    (256 bits), the same for every later call."""
    global _made
    given = os.environ.get(TOKEN_ENV, "")
    if given:
        return given
    if _made is None:
        _made = secrets.token_urlsafe(32)
    return _made


def token_headers() -> dict[str, str]:
    """The header every request to an agent carries."""
    return {TOKEN_HEADER: daemon_token()}


def token_matches(given: str | None, expected: str) -> bool:
    """Whether a request's token is ``expected``, in time independent of where they differ."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
