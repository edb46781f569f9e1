"""SGLang 0.5.23's route table and request types, read from its own FastAPI app (call after
`tests.helpers.sglang_real.bootstrap()`): what the contract probe judges with and the fake server enforces."""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from typing import Any, Optional


@functools.lru_cache(maxsize=1)
def route_table() -> dict[tuple[str, str], Optional[type]]:
    """(method, path) -> the type its handler builds from the JSON body (an io_struct Struct or
    GenerateReqInput), None for routes without one; from `sglang/srt/entrypoints/http_server.py:app`."""
    from fastapi.routing import APIRoute
    from sglang.srt.entrypoints.http_server import app

    table = {}
    for route in _api_routes(app.routes, APIRoute):
        for method in route.methods:
            table[(method, route.path)] = _body_type(route)
    return table


def _api_routes(routes, api_route: type):
    """The app's APIRoutes, those of included routers too (FastAPI >= 0.16x lists an included router as one
    entry holding `original_router`; SGLang includes `/v1/loads` and the elastic-EP routes so, unprefixed)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _api_routes(included.routes, api_route)
        elif isinstance(route, api_route):
            yield route


def _body_type(route) -> Optional[type]:
    hints = typing.get_type_hints(route.endpoint, include_extras=True)
    for name, hint in hints.items():
        if name in ("request", "raw_request", "return"):
            continue
        while typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) is typing.Union and len(args) == 1:
            hint = args[0]
        if isinstance(hint, type) and (hasattr(hint, "__struct_fields__") or dataclasses.is_dataclass(hint)):
            return hint
    return None


def field_names(body_type: type) -> list[str]:
    if hasattr(body_type, "__struct_fields__"):
        return list(body_type.__struct_fields__)
    return [f.name for f in dataclasses.fields(body_type)]


def parse_body(body_type: type, body: Any) -> tuple[Any, Optional[list]]:
    """(the request object, None), or (None, FastAPI's 422 `detail` list): pydantic over SGLang's own
    schema for the type (`msgspec_utils.msgspec_struct_pydantic_core_schema`), as FastAPI builds it."""
    import pydantic

    try:
        return _type_adapter(body_type).validate_python({} if body is None else body), None
    except pydantic.ValidationError as exc:
        return None, json.loads(exc.json())


@functools.cache
def _type_adapter(body_type: type):
    """One validator per request type, built once as FastAPI builds a route's body field at start-up (building
    the schema of a request dataclass took ~80% of the fake server's CPU when done per request)."""
    import pydantic

    return pydantic.TypeAdapter(body_type)


def generate_errors(body: dict) -> list[str]:
    """Why SGLang refuses a `/generate` body: its JSON contract gate (`api_contract.generate_contract_error`)
    and `SamplingParams(**sampling_params)` (`sglang/srt/sampling/sampling_params.py`)."""
    import inspect

    from sglang.srt.entrypoints.api_contract import generate_contract_error
    from sglang.srt.sampling.sampling_params import SamplingParams

    errors = [generate_contract_error(body)]
    try:
        inspect.signature(SamplingParams).bind(**(body.get("sampling_params") or {}))
    except TypeError as exc:
        errors.append(f"SamplingParams: {exc}")
    return [e for e in errors if e]


def to_builtins(value: Any) -> Any:
    """A request object as JSON data (bytes as their repr)."""
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    return json.loads(json.dumps(msgspec_to_builtins(value), default=repr))
