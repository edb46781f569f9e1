"""Passthrough dicts are checked against the library they feed: the real sglang-router parser, SGLang's
ServerArgs fields (a pinned list here: sglang is not installable on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from slime.config import ConfigError
from slime.engine.sglang.server_args import (
    FIELDS_FILE,
    OWNED_FIELDS,
    ServerArgsFields,
    check_server_args,
    known_fields,
)
from slime.plan.validate import validate
from tests.helpers.compose import ROOT, typed_config
from tests.helpers.runs import assert_stopped_in_validation, run_main


def problems_for(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate(typed_config(overrides))
    return {p.key: str(p) for p in info.value.problems}


# ----------------------------------------------------------------------------------------------- router
def test_valid_router_flags_pass():
    cfg = typed_config(
        [
            "+rollout.router.extra_args.cache_threshold=0.3",
            "+rollout.router.extra_args.disable_health_check=true",
            "+rollout.router.extra_args.balance_abs_threshold=64",
            "rollout.router.policy=cache_aware",
        ]
    )
    validate(cfg)


@pytest.mark.parametrize(
    "override,key,text",
    [
        (
            "+rollout.router.extra_args.cache_treshold=0.3",
            "rollout.router.extra_args.cache_treshold",
            "no flag --cache-treshold (did you mean cache_threshold",
        ),
        (
            "+rollout.router.extra_args.cache_threshold=abc",
            "rollout.router.extra_args.cache_threshold",
            "invalid float value: 'abc'",
        ),
        ("+rollout.router.extra_args.backend=grpc", "rollout.router.extra_args.backend", "invalid choice: 'grpc'"),
        ("+rollout.router.extra_args.port=3000", "rollout.router.extra_args.port", "set by the framework"),
        (
            "+rollout.router.extra_args.prometheus_port=3000",
            "rollout.router.extra_args.prometheus_port",
            "set by the framework",
        ),
        ("+rollout.router.extra_args.help=true", "rollout.router.extra_args.help", "no flag --help"),
        ("rollout.router.policy=roundrobin", "rollout.router.policy", "invalid choice: 'roundrobin'"),
    ],
)
def test_router_flags_are_checked_by_the_routers_parser(override, key, text):
    found = problems_for([override])
    assert text in found[key], found


def test_router_flags_of_a_joined_router_do_nothing():
    found = problems_for(["rollout.router.address=127.0.0.1:3000", "+rollout.router.extra_args.cache_threshold=0.3"])
    assert "not launched" in found["rollout.router.extra_args"]


def test_bad_router_flag_stops_the_cli_before_ray(tmp_path):
    proc, imported = run_main("+rollout.router.extra_args.cache_treshold=0.3", f"hydra.run.dir={tmp_path}")
    assert_stopped_in_validation(proc, imported)
    assert "rollout.router.extra_args.cache_treshold" in proc.stderr and "cache_threshold" in proc.stderr


# ----------------------------------------------------------------------------------------------- sglang
def stored(name: str, value_type: str, default=None, choices=None) -> dict:
    """A recorded `store` action, in the shape tools/gen_sglang_server_args.py writes."""
    flag = "--" + name.replace("_", "-")
    return {
        "flag": flag,
        "option_strings": [flag],
        "dest": name,
        "action": "store",
        "type": value_type,
        "value_type": value_type,
        "nargs": None,
        "choices": choices,
        "const": None,
        "default": default,
    }


STAND_IN = ServerArgsFields(
    version="9.9",
    source="test",
    types={
        "mem_fraction_static": "Optional[float]",
        "dp_size": "int",
        "attention_backend": "Optional[str]",
        "port": "int",
        "log_level": "str",
        "json_model_override_args": "str",
    },
    actions={
        "mem_fraction_static": stored("mem_fraction_static", "float"),
        "dp_size": stored("dp_size", "int", 1),
        "attention_backend": stored("attention_backend", "str", choices=["triton", "fa3"]),
        "port": stored("port", "int", 30000),
        "log_level": stored("log_level", "str", "info"),
        "json_model_override_args": stored("json_model_override_args", "str", "{}"),
    },
)


@pytest.mark.parametrize(
    "args,expected",
    [
        ({"mem_fraction_static": 0.7, "dp_size": 2, "attention_backend": None, "log_level": "warn"}, []),
        (
            {"mem_fraction_statik": 0.7},
            [
                "rollout.sglang.mem_fraction_statik: not a ServerArgs field of sglang 9.9 (test); "
                "did you mean mem_fraction_static?"
            ],
        ),
        (
            {"port": 30000},
            ["rollout.sglang.port: the framework sets ServerArgs.port itself (a port the framework reserves)"],
        ),
        (
            {"dp_size": "2"},
            ["rollout.sglang.dp_size: ServerArgs.dp_size is int (--dp-size, argparse type int), got str"],
        ),
        (
            {"dp_size": True},
            ["rollout.sglang.dp_size: ServerArgs.dp_size is int (--dp-size, argparse type int), got bool"],
        ),
        ({"mem_fraction_static": 1}, []),
        (
            {"attention_backend": "flash"},
            [
                "rollout.sglang.attention_backend: 'flash' is not one of SGLang's choices for --attention-backend: triton, fa3"
            ],
        ),
    ],
)
def test_server_args_against_a_field_list(args, expected):
    assert [f"{i.key}: {i.message}" for i in check_server_args(args, STAND_IN)] == expected


def test_pinned_field_list_is_a_real_sglang_version():
    data = json.loads(FIELDS_FILE.read_text())
    assert data["sglang_version"] == "0.5.23" and data["generated_by"] == "tools/gen_sglang_server_args.py"
    fields = known_fields()  # sglang is not importable here: the pinned list
    assert fields.version == "0.5.23" and len(fields.types) > 400
    assert {"mem_fraction_static", "context_length", "dp_size", "attention_backend"} <= set(fields.types)
    assert set(OWNED_FIELDS) <= set(fields.types)  # every owned field exists in the pinned version
    assert not [name for name in fields.types if name.startswith("_")]
    assert fields.actions["fp8_gemm_runner_backend"]["flag"] == "--fp8-gemm-backend"  # SGLang's parser, not the name
    assert sum(action is None for action in fields.actions.values()) == 14  # fields SGLang gives no flag


def test_sglang_keys_are_checked_even_with_the_hf_engine():
    found = problems_for(["+rollout.sglang.mem_fraction_statik=0.7", "+rollout.sglang.random_seed=3"])
    assert "do nothing with rollout.engine=hf" in found["rollout.sglang"]
    assert "did you mean mem_fraction_static?" in found["rollout.sglang.mem_fraction_statik"]
    assert "set seed instead" in found["rollout.sglang.random_seed"]


def test_sglang_package_imports_without_sglang():
    code = "import sys, slime.engine.sglang.server_args as m; m.known_fields(); print('sglang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_generator_tool_reads_both_server_args_layouts():
    """The AST reader on the two layouts SGLang has used: one dataclass, and namespaces (later 0.5.x)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from gen_sglang_server_args import SERVER_ARGS, public, server_args_fields
    finally:
        sys.path.remove(str(ROOT / "tools"))
    dataclass_layout = {
        SERVER_ARGS: textwrap.dedent("""
        @dataclasses.dataclass
        class ServerArgs:
            model_path: str
            mem_fraction_static: Optional[float] = None
            _explicit: bool = False
            LIMIT: ClassVar[int] = 3
            def url(self): return ""
        """)
    }
    assert server_args_fields(dataclass_layout) == {
        "model_path": {"type": "str", "default": ""},
        "mem_fraction_static": {"type": "Optional[float]", "default": "None"},
        "_explicit": {"type": "bool", "default": "False"},
    }
    namespace_layout = {
        SERVER_ARGS: textwrap.dedent("""
            from sglang.srt.arg_groups.fields.memory import Memory
            class ServerArgs:
                def resolve_once(self): pass
            _INPUT_NAMESPACES = [Memory]
            """),
        "sglang/srt/arg_groups/fields/memory.py": textwrap.dedent("""
            class Memory(msgspec.Struct):
                _NS_PATH = "memory"
                mem_fraction_static: A[Optional[float], "The fraction of memory."] = None
                derived = Derived(doc="not a field")
            """),
    }
    assert public(server_args_fields(namespace_layout)) == {
        "mem_fraction_static": {"type": "Optional[float]", "default": "None"}
    }
