"""The SGLang command line against SGLang 0.5.23's own parser (the wheel of tools/setup_sglang_cpu.sh, through
tests.helpers.sglang_probe): every ServerArgs field either reaches the server with exactly the value set, or
validation refuses it naming the key; the recorded actions are what the installed wheel registers today."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from slime.engine.base import EngineLaunch
from slime.engine.sglang.engine import SGLangEngine, SGLangEngineConfig
from slime.engine.sglang.server_args import (
    FIELDS_FILE,
    OWNED_FIELDS,
    check_server_args,
    known_fields,
    server_args_cli,
)
from tests.helpers.compose import ROOT
from tests.helpers.sglang_probe import SGLangProbe

FIELDS = known_fields()
REQUIRED = ["--model-path", "/models/m"]  # SGLang's parser requires it: every argv starts with it
# parse_cuda_graph_config_arg takes only the phases and keys it knows (sglang/srt/model_executor/cuda_graph_config.py)
JSON_VALUES = {"cuda_graph_config": {"decode": {"max_bs": 8}}}


@pytest.fixture(scope="module")
def probe():
    probe = SGLangProbe.start()
    yield probe
    probe.close()


def plausible_values(name: str) -> list[Any]:
    """Values a user could set for `name`, from its recorded action: True and False for flags, a non-default
    choice, a non-default value of the argparse type's kind, a JSON object (or list) for JSON words."""
    action = FIELDS.actions[name]
    if action is None:
        return ["on"]
    if action["action"] == "boolean_optional" or action["nargs"] == 0:
        return [True, False] if isinstance(action["const"], bool) or action["const"] is None else [action["const"]]
    if action["value_type"] == "json":
        listed = "List" in FIELDS.types[name] or "list" in FIELDS.types[name]
        return [JSON_VALUES.get(name, [7, "probe"] if listed else {"probe": 1, "nested": [1]})]
    one = _one_value(action)
    return [[one]] if action["nargs"] in ("+", "*") else [one]


def _one_value(action: dict) -> Any:
    default = action["default"]
    if action["choices"]:
        return next((c for c in action["choices"] if c != default), action["choices"][0])
    return {"int": 7 if default != 7 else 8, "float": 0.25 if default != 0.25 else 0.5}.get(
        action["value_type"], "probe-value"
    )


def refused(name: str, value: Any) -> str | None:
    """check_server_args' message for {name: value}, asserting it names the key; None when accepted."""
    issues = check_server_args({name: value})
    if not issues:
        return None
    assert [i.key for i in issues] == [f"rollout.sglang.{name}"]
    return issues[0].message


def parse(probe, args: dict[str, Any]) -> dict:
    """SGLang's namespace for the rendered `args`, all in one argv; a refused argv is parsed field by field
    to name the culprit."""
    argv = server_args_cli(args)
    answer = probe.parse_cli(REQUIRED + argv)
    if answer["parse_error"] is not None and len(args) > 1:
        for name, value in args.items():
            parse(probe, {name: value})
    assert answer["parse_error"] is None, f"SGLang's parser refuses {argv}: {answer['parse_error']}"
    return answer["namespace"]


def test_every_field_reaches_sglangs_parser_with_its_value_or_is_refused(probe):
    accepted: dict[str, list] = {}
    refusals: dict[str, list[str]] = {}
    for name in sorted(FIELDS.types):
        for value in plausible_values(name):
            message = refused(name, value)
            if message is None:
                accepted.setdefault(name, []).append(value)
            else:
                refusals.setdefault(name, []).append(message)
    for name, messages in refusals.items():  # only what the command line cannot carry is refused
        expressible = name not in OWNED_FIELDS and FIELDS.actions[name] is not None
        assert not expressible or all("cannot be expressed" in m for m in messages), (name, messages)
    wrong = {}
    for i in range(2):  # a flag is tried with True, then False: one argv per round
        round_ = {name: values[i] for name, values in accepted.items() if len(values) > i}
        namespace = parse(probe, round_)
        for name, value in round_.items():
            got = namespace[FIELDS.actions[name]["dest"]]
            if got != json.loads(json.dumps(value)):
                wrong[name] = (value, got, server_args_cli({name: value}))
    assert wrong == {}
    assert len(accepted.keys() | refusals.keys()) == len(FIELDS.types) == 543
    no_flag = {name for name, messages in refusals.items() if "has no command-line flag" in messages[0]}
    assert len(no_flag) == 14 and {"watermark_key", "grpc_worker_threads", "stat_loggers"} <= no_flag
    inexpressible = {name for name, messages in refusals.items() if "cannot be expressed" in messages[-1]}
    assert {"enable_multimodal", "enable_lora"} <= inexpressible  # store_true over a None default: False is lost
    assert sum(len(values) for values in accepted.values()) > 600


def test_fields_without_a_flag_are_refused_naming_the_fix():
    (issue,) = check_server_args({"watermark_key": "k"}, prefix="rollout.models[0].server_groups[0].overrides")
    assert issue.key == "rollout.models[0].server_groups[0].overrides.watermark_key"
    assert issue.message == (
        "SGLang 0.5.23 has no command-line flag for ServerArgs.watermark_key: it cannot be set at launch"
    )
    assert issue.fix == "remove rollout.models[0].server_groups[0].overrides.watermark_key"
    assert check_server_args({"grpc_worker_threads": 4, "stat_loggers": ["x"]}) != []


@pytest.mark.parametrize(
    "args,expected",
    [
        # fields registered under another flag name (Arg(cli_name=...))
        (
            {"fp8_gemm_runner_backend": "triton", "fp4_gemm_runner_backend": "flashinfer_cutlass"},
            ["--fp8-gemm-backend", "triton", "--fp4-gemm-backend", "flashinfer_cutlass"],
        ),
        ({"ep_join_mode": "recover", "ep_join_rank_offset": 3}, ["--elastic-ep-join-mode", "recover"]),
        # fields whose argparse type reads ONE JSON word (json_list_type)
        ({"sidecar_args": ["--a", "1"], "forward_hooks": [{"name": "h", "target": "m"}]}, ['["--a", "1"]']),
        ({"remote_instance_weight_loader_send_weights_group_ports": [5001, 5002]}, ["[5001, 5002]"]),
        # BooleanOptionalAction: False is --no-x, not a flag left out (the field's default is None)
        ({"enable_tf32_matmul": False, "dcp_replicate_q_proj": True}, ["--no-enable-tf32-matmul"]),
        ({"dllm_fdfo": False, "lora_strict_loading": True}, ["--no-dllm-fdfo", "--lora-strict-loading"]),
    ],
)
def test_flags_sglang_spells_its_own_way_parse_to_the_values(probe, args, expected):
    assert check_server_args(args) == []
    cli = server_args_cli(args)
    assert all(word in cli for word in expected), cli
    namespace = parse(probe, args)
    assert {name: namespace[name] for name in args} == json.loads(json.dumps(args))


@pytest.mark.parametrize(
    "args,message",
    [
        ({"enable_multimodal": False}, "can only set ServerArgs.enable_multimodal to true, and without it the field"),
        ({"sampling_backend": "cuda"}, "'cuda' is not one of SGLang's choices for --sampling-backend"),
        (
            {"lora_target_modules": ["q_proj", "nope"]},
            "'nope' is not one of SGLang's choices for --lora-target-modules",
        ),
        (
            {"context_length": "4k"},
            "ServerArgs.context_length is int (--context-length, argparse type human_readable_int)",
        ),
        ({"mem_fraction_static": True}, "ServerArgs.mem_fraction_static is float"),
        ({"served_model_name": ["a", "b"]}, "ServerArgs.served_model_name takes one value (--served-model-name V)"),
        ({"numa_node": 0}, "ServerArgs.numa_node takes a list (--numa-node V1 V2 ...), got int"),
        ({"numa_node": []}, "--numa-node takes at least one value"),
        ({"sidecar_args": "not json"}, "--sidecar-args takes one JSON value"),
        ({"enable_tf32_matmul": 1}, "ServerArgs.enable_tf32_matmul is a flag (--enable-tf32-matmul / --no-enable"),
        ({"max_prefill_tokens": None}, "None cannot be given on SGLang's command line"),
    ],
)
def test_values_the_parser_would_refuse_or_misread_are_refused(args, message):
    issues = check_server_args(args)
    assert [i.key for i in issues] == [f"rollout.sglang.{name}" for name in args]
    assert message in issues[0].message
    with pytest.raises(ValueError, match="ServerArgs|--"):
        server_args_cli(args)


def parse_argv(probe, argv: list[str]) -> dict:
    answer = probe.parse_cli(argv)
    assert answer["parse_error"] is None, f"SGLang's parser refuses {argv}: {answer['parse_error']}"
    return answer["namespace"]


def make_engine(worker_type="regular", memory_saver=True, server_args=None) -> SGLangEngine:
    launch = EngineLaunch(
        rank=0,
        model_path="/models/qwen",
        host="10.0.0.2",
        seed=5,
        device="cuda",
        log_dir="/tmp",
        gpu_ids=("2", "3", "4", "5"),
        memory_saver=memory_saver,
        weight_version="3",
    )
    return SGLangEngine(launch, SGLangEngineConfig(server_args=server_args or {}, worker_type=worker_type))


def test_owned_args_of_a_cuda_colocated_prefill_engine_parse_to_the_intended_values(probe):
    engine = make_engine("prefill", server_args={"pp_size": 2, "enable_tf32_matmul": False})
    ports = [31000, 31001, 31002]
    namespace = parse_argv(probe, engine.command(ports)[3:])
    expected = {
        **engine.owned_args(ports),
        "tp_size": 2,  # four GPUs over pp 2
        "disaggregation_mode": "prefill",
        "disaggregation_bootstrap_port": 31002,
        "enable_memory_saver": True,
        "weight_version": "3",
        "device": None,  # cuda: SGLang picks the device itself
        "trust_remote_code": True,
        "cuda_graph_backend_prefill": "disabled",  # the memory saver cannot release breakable prefill graphs
        "pp_size": 2,
        "enable_tf32_matmul": False,
    }
    assert {name: namespace[name] for name in expected} == expected
    assert namespace["random_seed"] == 5 and namespace["enable_deterministic_inference"] is False


def test_users_keep_the_last_word_on_the_launch_defaults(probe):
    engine = make_engine(server_args={"trust_remote_code": False, "cuda_graph_backend_prefill": "full"})
    namespace = parse_argv(probe, engine.command([1, 2, 3])[3:])
    assert (namespace["trust_remote_code"], namespace["cuda_graph_backend_prefill"]) == (False, "full")
    not_colocated = parse_argv(probe, make_engine(memory_saver=False).command([1, 2, 3])[3:])
    assert (not_colocated["trust_remote_code"], not_colocated["cuda_graph_backend_prefill"]) == (True, None)


def test_recorded_actions_are_what_the_installed_wheel_registers():
    """The tool's own function, run again on the wheel of tools/setup_sglang_cpu.sh: a stale JSON fails."""
    proc = subprocess.run(
        [sys.executable, "tools/gen_sglang_server_args.py", "--print"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    fresh, recorded = json.loads(proc.stdout), json.loads(FIELDS_FILE.read_text())
    assert fresh["sglang_version"] == recorded["sglang_version"] == "0.5.23"
    stale = sorted(
        n
        for n in fresh["fields"].keys() | recorded["fields"].keys()
        if fresh["fields"].get(n) != recorded["fields"].get(n)
    )
    assert stale == []
