"""vLLM 0.32.0's own server code, for a process that imports vllm (the fake vLLM server): its command line,
the routes its app mounts, each route's parameters bound as FastAPI binds them, and its error bodies.

- `parse_cli(argv)`: what `python -m vllm.entrypoints.launchers.api_server.entry` does with its argv
  (`entry.main`: `make_arg_parser` on a `FlexibleArgumentParser`, then `validate_parsed_serve_args`);
  a bad flag exits 2 with argparse's message.
- `route_table(args)`: (method, path) -> the `APIRoute` that `vllm.entrypoints.launchers.app.build_app`
  mounts for these arguments and this environment (VLLM_SERVER_DEV_MODE mounts the dev and RL routers;
  without --enable-scale-out the generate route is vLLM's 403 stand-in, `register_scale_out_api_routers`).
- `bind(route, ...)`: the route's query, body and header-checking dependencies resolved by FastAPI's own
  binding functions into the handler's parameter values (vLLM's request types: `GenerateRequest` with its
  `SamplingParams`, the RL routes' `init_info` / `update_info`, ...), or vLLM's 400 for what it refuses.
- `error(...)`, `http_error(...)`: vLLM's `ErrorResponse` bodies (`create_error_response`, the app's handlers).

Importing vllm takes seconds: the functions import it when called, so call them only in such a process;
the pytest process calls `parsed_by_vllm`, which runs the parser in a subprocess
(`python -m tests.helpers.vllm_real ARGV...` prints the namespace as JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import subprocess
import sys
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
PINNED_VERSION = "0.32.0"
Reply = tuple[int, dict]  # (HTTP status, JSON body)
# What a vLLM server on this CPU machine takes (validation refuses the rest): disk syncs, a head size its
# attention kernel has.
CPU_VLLM = ["rollout=vllm", "rollout.weight_sync.mode=disk", "model=tiny_qwen3_vllm"]


class VLLMVersionError(RuntimeError):
    """The installed vllm is not the pinned version these imitations were read from."""


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed and checked as vLLM's server entry point does (exit 2 on a bad flag)."""
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if vllm.__version__ != PINNED_VERSION:
        raise VLLMVersionError(f"vllm {vllm.__version__} is installed; the fake follows vLLM {PINNED_VERSION}")
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    return args


def parsed_by_vllm(argv: list[str], timeout_s: float = 120.0) -> dict:
    """`argv` as vLLM's server parser reads it, parsed in a subprocess: {dest: value}, vLLM's config objects
    (`--kv-transfer-config`, `--weight-transfer-config`, ...) as dicts. ValueError with argparse's message when
    vLLM rejects it."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.vllm_real", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise ValueError(f"vLLM's parser exited {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def _as_data(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else str(value)


def route_table(args: argparse.Namespace) -> dict[tuple[str, str], Any]:
    """(method, path) -> APIRoute of the app vLLM builds for `args` (a generate-task model, as a causal LM)."""
    from fastapi.routing import APIRoute
    from vllm.entrypoints.launchers.app import build_app

    app = build_app(args, ("generate",), None)
    table = {}
    for route in _api_routes(app.routes, APIRoute):
        for method in route.methods:
            table.setdefault((method, route.path), route)  # Starlette serves the first match
    return table


def _api_routes(routes, api_route: type):
    """The app's APIRoutes, those of included routers too (FastAPI >= 0.16x keeps an included router as one
    entry holding `original_router`)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _api_routes(included.routes, api_route)
        elif isinstance(route, api_route):
            yield route


def endpoint_name(route) -> str:
    """`module.function` of the route's handler (vLLM's decorators keep the name: functools.wraps)."""
    return f"{route.endpoint.__module__}.{route.endpoint.__name__}"


def takes_no_input(route) -> bool:
    """True for handlers that read nothing of the request (e.g. /version, the disabled scale-out stand-in)."""
    return not inspect.signature(route.endpoint).parameters


async def call_endpoint(route) -> tuple[int, bytes, str]:
    """(status, body, content type) of vLLM's own handler, for handlers that take no input."""
    response = await route.endpoint()
    if isinstance(response, dict):
        return HTTPStatus.OK, json.dumps(response).encode(), "application/json"
    return response.status_code, bytes(response.body), response.media_type or "application/json"


async def bind(route, args, query_string: str, headers: dict, body: bytes) -> tuple[dict, Optional[Reply]]:
    """(parameter name -> value, None), or ({}, vLLM's 400) - FastAPI's binding of the route's parameters
    (`fastapi/dependencies/utils.py`: `request_params_to_args`, `request_body_to_args`, what
    `solve_dependencies` calls), after its header-checking dependencies (`validate_json_request`)."""
    from fastapi.dependencies.utils import _should_embed_body_fields, request_body_to_args, request_params_to_args
    from fastapi.exceptions import RequestValidationError
    from starlette.datastructures import Headers, QueryParams

    dependant = route.dependant
    starlette_headers = Headers(headers=headers)
    try:
        for dependency in dependant.dependencies:
            await dependency.call(SimpleNamespace(headers=starlette_headers))
    except RequestValidationError as exc:
        return {}, await _validation_reply(args, exc)
    values, errors = request_params_to_args(dependant.query_params, QueryParams(query_string))
    if dependant.body_params:
        received = None
        if body:
            try:
                received = json.loads(body)
            except json.JSONDecodeError as exc:  # FastAPI's own error for an unparsable JSON body
                errors.append({"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error"})
        if not errors:
            embed = _should_embed_body_fields(dependant.body_params)
            body_values, body_errors = await request_body_to_args(dependant.body_params, received, embed)
            values.update(body_values)
            errors += body_errors
    if errors:
        return {}, await _validation_reply(args, RequestValidationError(errors))
    return values, None


async def _validation_reply(args, exc) -> Reply:
    """vLLM's 400 for a request FastAPI could not bind (`exception_handling/handlers/validation.py`)."""
    from vllm.entrypoints.serve.exception_handling.handlers.validation import validation_exception_handler

    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(args=args)), state=SimpleNamespace())
    response = await validation_exception_handler(request, exc)
    return response.status_code, json.loads(response.body)


def error(message: str | Exception, err_type: str = "BadRequestError", status: int = 400, param=None) -> Reply:
    """vLLM's ErrorResponse for `message`; an exception's type decides type and status as vLLM's
    `create_error_response` does (ValueError 400, NotImplementedError 501, any other Exception 500)."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    response = create_error_response(message, err_type, HTTPStatus(status), param)
    return response.error.code, response.model_dump()


def http_error(status: int, detail: str) -> Reply:
    """The body of vLLM's handler for an `HTTPException(status, detail)` its routes raise
    (`exception_handling/handlers/http.py`)."""
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse

    response = ErrorResponse(error=ErrorInfo(message=detail, type=HTTPStatus(status).phrase, code=status))
    return status, response.model_dump()


def engine_call_failed(message: str, world_size: int) -> Reply:
    """A failure inside a worker as the API server reports it: the engine core answers the utility call with
    "Call to collective_rpc method failed: ..." (`vllm/v1/engine/core.py`, raised as a plain Exception by
    `core_client.py`), wrapping, with several workers, the executor's "Worker failed with error '...'"
    (`vllm/v1/executor/multiproc_executor.py`); a plain Exception is vLLM's 500."""
    if world_size > 1:
        message = f"Worker failed with error '{message}', please check the stack trace above for the root cause"
    return error(Exception(f"Call to collective_rpc method failed: {message}"))


if __name__ == "__main__":
    print(json.dumps(vars(parse_cli(sys.argv[1:])), default=_as_data))
