"""The HTTP API's errors as JSON ``{"detail": "..."}`` with the CLI's messages: 404 unknown
pack, 422 a bad request, 409 a pack that cannot answer, 400 a body that is not JSON, 500
anything else (logged with its traceback on the server, never sent to the client)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from kpack.packs import PackError
from retrieval.query import QuestionError
from serving.responses import error_response

log = logging.getLogger("kpack.serve")


def install_error_handlers(app: FastAPI) -> None:
    async def question_error(request: Request, exc: Exception) -> Response:
        return error_response(422, str(exc))

    async def pack_error(request: Request, exc: Exception) -> Response:
        # Unknown packs are 404 before retrieval runs; what retrieval raises is about the
        # pack's state: never built, damaged, or a kg_config.json it cannot use.
        return error_response(409, str(exc))

    async def validation_error(request: Request, exc: Exception) -> Response:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        messages = [
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in errors
        ]
        return error_response(422, "; ".join(messages) or "invalid request")

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal error; see the server log")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        # FastAPI answers any body it cannot parse with "There was an error parsing the body";
        # the two causes a client can fix get their own message.
        if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
            return error_response(400, "the request body is not UTF-8 text (send JSON in UTF-8)")
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
            return error_response(400, "the request body's JSON is nested too deeply")
        return await http_exception_handler(request, exc)

    # Starlette's class: FastAPI raises it for a body it cannot parse (and for 404s, 405s).
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(QuestionError, question_error)
    app.add_exception_handler(PackError, pack_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)
