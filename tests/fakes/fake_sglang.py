"""A fake SGLang server for CPU tests: SGLang's CLI and HTTP contract, the hf engine's real generation.

Run as SGLang is run: `python -m tests.fakes.fake_sglang --model-path P --port N --tp-size 2 ...`
(`rollout.sglang_launch.module=tests.fakes.fake_sglang`). The command line is parsed the way
`sglang.launch_server` parses it: one `--field-name` option per ServerArgs field of the pinned SGLang
version (`slime/engine/sglang/server_args_fields.json`), bool fields as bare flags, so an argument
SGLang would reject fails here too. Generation, weight updates and every control endpoint are the hf
engine's (`slime.engine.hf.server`, which implements SGLang's endpoints and payloads) on the tiny
model; `/server_info` reports the parsed ServerArgs as SGLang does.

For assertions, every request other than `/generate` and health probes is logged to stderr (the
engine log) as one line `FAKE_SGLANG_REQUEST {"method", "path", "body"}`, in arrival order; a
`/generate` adds `FAKE_SGLANG_GENERATE {"weight_version"}` when it arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from slime.engine.sglang.server_args import FIELDS_FILE

logger = logging.getLogger("fake_sglang")
REQUEST_MARK = "FAKE_SGLANG_REQUEST"
GENERATE_MARK = "FAKE_SGLANG_GENERATE"
_QUIET = {"/generate", "/health", "/health_generate", "/server_info", "/get_server_info", "/model_info"}
_QUIET |= {"/get_model_info", "/weights_checksum", "/v1/loads", "/get_load", "/get_weight_version"}


def _list_type(annotation: str) -> bool:
    return "List[" in annotation or "list[" in annotation


def build_parser() -> argparse.ArgumentParser:
    """SGLang's CLI: `--<field-name>` per ServerArgs field; bools are store_true, lists take several values."""
    fields = json.loads(FIELDS_FILE.read_text())["fields"]
    parser = argparse.ArgumentParser(prog="sglang.launch_server", allow_abbrev=False)
    for name, spec in fields.items():
        flag, annotation = "--" + name.replace("_", "-"), spec.get("type", "")
        if annotation == "bool":
            parser.add_argument(flag, dest=name, action="store_true")
        elif _list_type(annotation):
            parser.add_argument(flag, dest=name, nargs="*")
        elif annotation.removeprefix("Optional[").startswith("int"):
            parser.add_argument(flag, dest=name, type=int)
        elif annotation.removeprefix("Optional[").startswith("float"):
            parser.add_argument(flag, dest=name, type=float)
        else:
            parser.add_argument(flag, dest=name)
    return parser


def hf_args(server_args: argparse.Namespace) -> argparse.Namespace:
    """The hf server's arguments for these ServerArgs (one CPU process, whatever tp_size says)."""
    from slime.engine.hf import server as hf_server

    argv = ["--model-path", server_args.model_path, "--host", server_args.host or "127.0.0.1"]
    argv += ["--port", str(server_args.port), "--seed", str(server_args.random_seed or 0), "--device", "cpu"]
    argv += ["--weight-version", server_args.weight_version or "default", "--batch-wait-ms", "2"]
    if server_args.context_length:
        argv += ["--context-length", str(server_args.context_length)]
    return hf_server.parse_args(argv)


def make_server(server_args: argparse.Namespace):
    """The hf server, reporting SGLang's ServerArgs on /server_info and logging control requests (torch is
    imported here, after the command line was accepted, as SGLang rejects bad arguments before loading)."""
    from aiohttp import web

    from slime.engine.hf import server as hf_server

    class FakeSGLangServer(hf_server.HFServer):
        async def server_info(self, request: web.Request) -> web.Response:
            info: dict[str, Any] = {k: v for k, v in vars(server_args).items() if v is not None}
            info.update(
                version="fake-sglang",
                dtype=self.dtype,
                weight_version=self.scheduler.weight_version,
                internal_states=[
                    {"paused": self.scheduler.paused, "released_tags": sorted(self.scheduler.released_tags)}
                ],
            )
            return web.json_response(info)

        @web.middleware
        async def log_requests(self, request: web.Request, handler) -> web.StreamResponse:
            if request.path == "/generate":
                mark = {"weight_version": self.scheduler.weight_version}
                print(f"{GENERATE_MARK} {json.dumps(mark)}", file=sys.stderr, flush=True)
            elif request.path not in _QUIET:
                try:
                    body = await request.json() if request.body_exists else None
                except ValueError:  # the handler answers it with SGLang's 400
                    body = "<not JSON>"
                line = {"method": request.method, "path": request.path, "body": _summary(body)}
                print(f"{REQUEST_MARK} {json.dumps(line)}", file=sys.stderr, flush=True)
            return await handler(request)

    return FakeSGLangServer(hf_args(server_args))


def _summary(body: Any) -> Any:
    """The body without bulky payloads (weight names); serialised buckets as their handles' shm paths."""
    if not isinstance(body, dict):
        return body
    summary = {k: (v if len(json.dumps(v)) < 200 else f"<{len(json.dumps(v))} chars>") for k, v in body.items()}
    if isinstance(body.get("serialized_named_tensors"), list):
        from slime.sync import wire

        handles = [wire.decode(item)["handle"] for item in body["serialized_named_tensors"]]
        summary["serialized_named_tensors"] = [h.get("path", h.get("kind")) for h in handles]
    return summary


async def serve(server_args: argparse.Namespace) -> None:
    from aiohttp import web

    from slime.engine.hf import server as hf_server
    from slime.engine.hf.http_util import errors_as_json

    server = make_server(server_args)
    app = web.Application(client_max_size=1 << 30, middlewares=[server.log_requests, errors_as_json])
    await hf_server.run_app(server, app)


def main(argv: list[str] | None = None) -> None:
    server_args = build_parser().parse_args(argv)
    if not server_args.model_path or server_args.port is None:
        sys.exit("fake_sglang: --model-path and --port are required")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s [fake-sglang] %(message)s")
    logger.info("ServerArgs %s", json.dumps({k: v for k, v in vars(server_args).items() if v not in (None, False)}))
    import torch

    torch.set_num_threads(1)
    asyncio.run(serve(server_args))
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
