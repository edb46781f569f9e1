"""aiohttp plumbing of the hf engine server: JSON errors as SGLang's servers give them, JSON bodies, and
quiet logs for the router's HTTP/2 probes."""

from __future__ import annotations

import json
import logging

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from slime.engine.hf.generator import GenerationError

logger = logging.getLogger("slime.engine.hf.server")


class DropMalformedRequestErrors(logging.Filter):
    """sglang-router probes each worker with an HTTP/2 (h2c) preface first; aiohttp speaks HTTP/1
    only and would log every probe as an error with a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], BadHttpMessage))


def error_response(message: str, status: int = 400) -> web.Response:
    """`{"error": {"message": ...}}` with `status` (400: the request was wrong)."""
    return web.json_response({"error": {"message": message}}, status=status)


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """ValueError (bad request: GenerationError, SamplingParamsError, ...) → 400; anything else → 500."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except ValueError as exc:
        return error_response(str(exc))
    except Exception as exc:  # noqa: BLE001 - report and keep serving
        logger.exception("%s %s failed", request.method, request.path)
        return error_response(f"internal error: {exc!r}", status=500)


async def json_body(request: web.Request) -> dict:
    """The request's JSON object ({} without a body); GenerationError (400) for anything else."""
    if not request.body_exists:  # (not can_read_body: a middleware may have read it, aiohttp caches it)
        return {}
    try:
        body = await request.json()
    except json.JSONDecodeError as exc:
        raise GenerationError(f"request body is not valid JSON: {exc}") from exc
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise GenerationError("request body must be a JSON object")
    return body
