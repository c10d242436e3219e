"""The HTTP API's bearer token: every route but /healthz and the docs needs it when set."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

# Module level: annotations are strings here (postponed), and FastAPI resolves them from the
# module's globals, never from a function's locals.
BEARER = HTTPBearer(auto_error=False, description="the server's --token / KPACK_API_TOKEN")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


def bearer_check(token: str) -> Callable[..., Awaitable[None]]:
    """A dependency answering 401 unless the request carries ``Authorization: Bearer token``."""

    async def check(credentials: Credentials) -> None:
        # compare_digest: the time taken must not tell how much of a guess was right.
        if credentials is None or not hmac.compare_digest(
            credentials.credentials.encode(), token.encode()
        ):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    return check
