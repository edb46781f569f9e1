"""Import-path fields are resolved and call-shape checked in validation; generators write their own file only;
checkpoint.save_hf, rollout.weight_sync and the registries are validated."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest

from slime.assets.prepare import prepare_assets
from slime.config import ConfigError, fill_derived
from slime.config.hooks import HookError, load_callable
from slime.plan.derive import derive
from slime.plan.validate import collect_problems, validate
from slime.registry import ENGINES, REWARD_TYPES, TRAIN_BACKENDS
from tests.helpers.compose import typed_config
from tests.helpers.registry import registered
from tests.helpers.runs import assert_stopped_in_validation, run_main

HOOKS = """
async def rm(args, sample):
    return 1.0

def sync_rm(args, sample):
    return 1.0

def rollout(args, rollout_id, data_source, evaluation=False):
    return None

def rollout_keyword_only(ctx, rollout_id, *, evaluation=False):
    return None

async def async_filter(args, group):
    return True

def group_only_filter(group):
    return True

def write(path, *, rows):
    open(path, "w").write("x\\n" * rows)
"""


@pytest.fixture
def hooks(tmp_path, monkeypatch) -> str:
    """A user module of hooks on sys.path (and PYTHONPATH, for subprocesses); returns its name."""
    name = f"user_hooks_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(HOOKS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return name


def problems_for(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate(typed_config(overrides))
    return {p.key: str(p) for p in info.value.problems}


def test_load_callable_suggests_the_nearest_names():
    with pytest.raises(
        HookError, match=r"no attribute 'check_reward_nonzero_sd' \(did you mean check_reward_nonzero_std\?\)"
    ):
        load_callable("slime.rollout.filters.check_reward_nonzero_sd", key="algo.dynamic_filter")
    with pytest.raises(HookError, match=r"no module named 'slime.rollout.filter' \(did you mean slime.rollout.filters"):
        load_callable("slime.rollout.filter.check_reward_nonzero_std", key="algo.dynamic_filter")
    with pytest.raises(HookError, match="expected an import path"):
        load_callable("generate_rollout", key="rollout.function")


def test_load_callable_checks_the_call_shape(hooks):
    shape = dict(signature=("args", "rollout_id", "data_source"), keywords=("evaluation",), may_be_async=False)
    assert load_callable(f"{hooks}.rollout", key="rollout.function", **shape)(None, 3, None) is None
    with pytest.raises(HookError) as info:
        load_callable(f"{hooks}.rollout_keyword_only", key="rollout.function", **shape)
    assert info.value.key == "rollout.function"
    assert "cannot be called as fn(args, rollout_id, data_source, evaluation=...)" in info.value.message
    with pytest.raises(HookError, match="coroutine function"):
        load_callable(
            f"{hooks}.async_filter", key="algo.dynamic_filter", signature=("args", "group"), may_be_async=False
        )
    assert load_callable(f"{hooks}.rm", key="rollout.custom_rm_path", signature=("args", "sample"))
    assert load_callable(f"{hooks}.sync_rm", key="rollout.custom_rm_path", signature=("args", "sample"))


def test_target_node_keys_are_the_targets_parameters(hooks, tmp_path):
    node = {"_target_": f"{hooks}.write", "path": str(tmp_path / "out.txt"), "rows": 3}
    load_callable(node, key="data.generator", signature=())()
    assert (tmp_path / "out.txt").read_text() == "x\n" * 3
    with pytest.raises(HookError) as info:
        load_callable({**node, "row": 3}, key="data.generator", signature=())
    assert info.value.key == "data.generator.row" and "did you mean rows?" in info.value.message


@pytest.mark.parametrize(
    "overrides,key,text",
    [
        (
            ["rollout.function=slime.rollout.default.generate_rolout"],
            "rollout.function",
            "did you mean generate_rollout",
        ),
        (["rollout.function=defualt"], "rollout.function", "did you mean default?"),
        (["algo.dynamic_filter=slime.rollout.filters.nope"], "algo.dynamic_filter", "no attribute 'nope'"),
        (
            ["rollout.rm_type=null", "rollout.custom_rm_path=nowhere_at_all.rm"],
            "rollout.custom_rm_path",
            "no module named",
        ),
        (["+data.generator.num_prompt=5"], "data.generator.num_prompt", "did you mean num_prompts?"),
        (
            ["data.generator._target_=slime.assets.digit_task.write_datset"],
            "data.generator._target_",
            "did you mean write_dataset?",
        ),
        (
            ["recipe=embedded_eval", "+eval.datasets.digit_task.generator.seeds=1"],
            "eval.datasets.digit_task.generator.seeds",
            "did you mean seed?",
        ),
        (["~data.generator.path", "data.prompt_data=/x.jsonl"], "data.generator.path", "names the one file it writes"),
        (["rollout.custom_rm_path=slime.rollout.rewards.exact_match"], "rollout.rm_type", "takes precedence"),
    ],
)
def test_hook_fields_fail_validation(overrides, key, text):
    found = problems_for(overrides)
    assert text in found[key], found


def test_user_hooks_validate_with_their_call_shapes(hooks):
    found = problems_for(
        [
            f"rollout.function={hooks}.rollout_keyword_only",
            f"algo.dynamic_filter={hooks}.group_only_filter",
            "rollout.rm_type=null",
            f"rollout.custom_rm_path={hooks}.rm",
        ]
    )
    assert set(found) == {"rollout.function", "algo.dynamic_filter"}
    assert "fn(args, group)" in found["algo.dynamic_filter"], found
    cfg = typed_config(
        [f"rollout.function={hooks}.rollout", "rollout.rm_type=null", f"rollout.custom_rm_path={hooks}.rm"]
    )
    assert fill_derived(cfg, validate(cfg)).rollout.function == f"{hooks}.rollout"


def test_bad_hook_stops_the_cli_before_ray(tmp_path):
    proc, imported = run_main("rollout.function=slime.rollout.default.generate_rolout", f"hydra.run.dir={tmp_path}")
    assert_stopped_in_validation(proc, imported)
    assert "rollout.function='slime.rollout.default.generate_rolout'" in proc.stderr


@pytest.mark.parametrize(
    "overrides,path",
    [
        ([], "slime.rollout.default.generate_rollout"),
        (["algo=sft"], "slime.rollout.sft.generate_rollout"),
        (["rollout.function=sft"], "slime.rollout.sft.generate_rollout"),
        (["algo=sft", "rollout.function=default"], "slime.rollout.default.generate_rollout"),
    ],
)
def test_rollout_function_resolves_names_and_the_algorithms_default(overrides, path):
    cfg = typed_config(overrides)
    derived = derive(cfg)
    assert derived.rollout_function == path
    assert fill_derived(cfg, derived).rollout.function == path  # saved in config.yaml as the import path


def test_generator_writes_its_own_path_only_when_the_run_reads_it(tmp_path):
    default = typed_config([])
    assert default.data.prompt_data == default.data.generator["path"]  # the embedded run reads the generated file
    prepare_assets(default)  # the tiny model (and the default data) first: only the generator's file is at stake
    own = tmp_path / "cache" / "train.jsonl"
    cfg = typed_config([f"data.generator.path={own}", f"data.prompt_data={own}", "data.generator.num_prompts=7"])
    assert prepare_assets(cfg) == [str(own)]
    labels = [json.loads(line)["label"] for line in own.read_text().splitlines()]
    assert len(labels) == 7 and set(labels) <= set("0123456789")
    assert prepare_assets(cfg) == []  # present: not rewritten
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"prompt": "p", "label": "1"}\n')
    other = tmp_path / "elsewhere" / "train.jsonl"
    cfg = typed_config([f"data.prompt_data={mine}", f"data.generator.path={other}"])
    validate(cfg)
    assert prepare_assets(cfg) == [] and not other.parent.exists()


@pytest.mark.parametrize(
    "template,ok",
    [
        ("/ckpt/hf/iter_{rollout_id:07d}", True),
        ("/ckpt/hf/{rollout_id}", True),
        ("/ckpt/hf", False),
        ("/ckpt/{step}/{rollout_id}", False),
        ("/ckpt/{rollout_id", False),
        (None, True),
    ],
)
def test_save_hf_is_a_directory_template(template, ok):
    overrides = [f"checkpoint.save_hf={'null' if template is None else repr(template)}"]
    if ok:
        cfg = typed_config(overrides)
        validate(cfg)
        assert cfg.checkpoint.save_hf == template
    else:
        assert "{rollout_id:07d}" in problems_for(overrides)["checkpoint.save_hf"]


def test_weight_sync_schema_and_checks():
    ws = typed_config([]).rollout.weight_sync
    assert (ws.mode, ws.bucket_mb, ws.keep) == ("disk", 1024, False)
    found = problems_for(["rollout.weight_sync.mode=dsk", "rollout.weight_sync.bucket_mb=0"])
    assert "did you mean disk?" in found["rollout.weight_sync.mode"]
    assert "must be > 0" in found["rollout.weight_sync.bucket_mb"]
    assert typed_config([]).debug.check_weight_update_equal is False
    found = problems_for(["debug=rollout_only", "debug.check_weight_update_equal=true"])
    assert "pushes no weights to check" in found["debug.check_weight_update_equal"]


def test_tensor_weight_sync_needs_colocated_engines():
    found = problems_for(["rollout.weight_sync.mode=tensor"])
    assert "cluster.colocate=true" in found["rollout.weight_sync.mode"]
    validate(typed_config(["rollout.weight_sync.mode=tensor", "cluster.colocate=true"]))
    validate(typed_config(["rollout.weight_sync.mode=distributed", "debug.check_weight_update_equal=true"]))
    # on several nodes too: each engine TP rank opens the handle of the training rank on its own device
    nodes = ["cluster.num_nodes=2", "cluster.num_gpus_per_node=1", "cluster.actor.num_nodes=2", "cluster.host=0.0.0.0"]
    validate(typed_config(["rollout.weight_sync.mode=tensor", "cluster.colocate=true", *nodes]))
    assert (
        "cluster.colocate=true" in problems_for(["rollout.weight_sync.mode=tensor", *nodes])["rollout.weight_sync.mode"]
    )


def test_distributed_weight_sync_is_refused_where_engines_share_the_trainers_gpus():
    """NCCL refuses two ranks of one group on one GPU ("Duplicate GPU detected"): colocated on CUDA, the trainer's
    source rank and an engine TP rank would be; on CPU (gloo) and disaggregated it is allowed."""
    gpu = ["model=qwen3_4b", "cluster.ray_address=auto", "rollout=sglang", "rollout.weight_sync.mode=distributed"]
    found = problems_for([*gpu, "cluster=one_gpu"])
    assert "NCCL refuses two ranks of one group on one device" in found["rollout.weight_sync.mode"]
    assert "rollout.weight_sync.mode=tensor" in found["rollout.weight_sync.mode"]
    for allowed in ([*gpu, "cluster=one_node_8gpu"], ["rollout.weight_sync.mode=distributed", "cluster.colocate=true"]):
        assert "rollout.weight_sync.mode" not in {p.key for p in collect_problems(typed_config(allowed))}


def test_choices_come_from_the_registries(monkeypatch):
    found = problems_for(["parallelism.backend=fsdpp", "rollout.engine=trtllm", "rollout.rm_type=exact"])
    assert "did you mean fsdp?" in found["parallelism.backend"]
    assert "registered: hf, sglang, vllm" in found["rollout.engine"]
    assert "did you mean exact_match?" in found["rollout.rm_type"]
    registered(monkeypatch, ENGINES, "trtllm", "slime.engine.sglang.engine.SGLangEngine")
    registered(monkeypatch, TRAIN_BACKENDS, "megatron", {})
    validate(typed_config(["parallelism.backend=megatron", "rollout.engine=trtllm"]))  # one record registers a part


def test_every_registered_name_resolves():
    from slime.engine.base import EngineServer
    from slime.registry import ALL
    from slime.sync.base import WeightSync
    from slime.train.base import TrainBackend

    for registry in ALL:
        for name in registry.names():
            roles = registry.roles(name) or [None]
            for role in roles:
                assert callable(registry.load(name, role)), (registry.key, name, role)
    assert issubclass(ENGINES.load("hf"), EngineServer) and issubclass(
        TRAIN_BACKENDS.load("fsdp", "critic"), TrainBackend
    )
    from slime.registry import WEIGHT_SYNC

    assert issubclass(WEIGHT_SYNC.load("disk"), WeightSync)
    assert (
        REWARD_TYPES.load("first_word")("8 is next", "8") == 1.0 and REWARD_TYPES.load("exact_match")("8 x", "8") == 0.0
    )


def test_wrong_hook_paths_and_signatures_exit_2_naming_each_field(hooks, tmp_path):
    """main.py stops in validation (exit 2, before Ray) with one line per bad hook field."""
    proc, imported = run_main(
        f"rollout.generate_function={hooks}.generat",
        f"rollout.sample_hooks=[{hooks}.rm]",
        f"rollout.buffer_filter={hooks}.group_only_filter",
        f"rollout.reward_post_process={hooks}.nowhere",
        f"eval.function={hooks}.rollout_keyword_only",
        "eval.interval=1",
        f"+eval.datasets.held_out.prompt_data={tmp_path / 'missing.jsonl'}",
        "+eval.datasets.other={prompt_data:/x.jsonl,n_sample_per_prompt:4}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert_stopped_in_validation(proc, imported)
    lines = {line.split("=", 1)[0].strip(" -"): line for line in proc.stderr.splitlines() if line.startswith("  - ")}
    assert "has no attribute 'generat'" in lines["rollout.generate_function"]
    assert "cannot be called as fn(args, sample, rollout_id=..., evaluation=...)" in lines["rollout.sample_hooks[0]"]
    assert "fn(args, rollout_id, buffer, num)" in lines["rollout.buffer_filter"]
    assert "has no attribute 'nowhere'" in lines["rollout.reward_post_process"]
    assert "fn(args, rollout_id, data_source, evaluation=...)" in lines["eval.function"]
    assert "path does not exist" in lines["eval.datasets.held_out.prompt_data"]
    assert "did you mean n_samples_per_prompt?" in lines["eval.datasets.other.n_sample_per_prompt"]


def test_an_eval_set_may_read_the_file_another_generator_writes(tmp_path):
    base = [
        "recipe=embedded_eval",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "eval.datasets.digit_task_sampled.generator=null",
    ]
    shared = typed_config(
        [*base, "eval.datasets.digit_task_sampled.prompt_data=${eval.datasets.digit_task.prompt_data}"]
    )
    validate(shared)  # digit_task's generator writes it before the run starts
    written = shared.eval.datasets["digit_task"]["prompt_data"]
    assert written in prepare_assets(shared) and len(Path(written).read_text().splitlines()) > 0
    nobody = tmp_path / "nobody.jsonl"
    with pytest.raises(ConfigError) as info:
        validate(typed_config([*base, f"eval.datasets.digit_task_sampled.prompt_data={nobody}"]))
    assert "eval.datasets.digit_task_sampled.prompt_data" in str(info.value) and "path does not exist" in str(
        info.value
    )


def test_agent_fields_are_checked_before_launch(hooks):
    """rollout.agent.*: the entrypoint imports with its call shape (module:function too), the tool parser is
    registered, no generate function competes; a good config validates."""
    validate(typed_config(["rollout.agent.entrypoint=tests.helpers.agents:chat_three_turns"]))
    problems = problems_for(
        [
            f"rollout.agent.entrypoint={hooks}:rm",
            "rollout.agent.tool_parser=qwen2",
            "rollout.agent.on_mismatch=split",
            "rollout.agent.samples=turn",
            "rollout.generate_function=slime.rollout.tool_use.generate",
        ]
    )
    assert "fn(base_url, api_key, record)" in problems["rollout.agent.entrypoint"]
    assert "did you mean qwen25" in problems["rollout.agent.tool_parser"]
    assert "drop_turn or drop_episode" in problems["rollout.agent.on_mismatch"]
    assert (
        "unknown option" in problems["rollout.agent.samples"]
        and "episode or turns" in problems["rollout.agent.samples"]
    )
    assert "would never be called" in problems["rollout.generate_function"]
    missing = problems_for(["rollout.agent.entrypoint=tests.helpers.no_such_agents.run"])
    assert "no module named 'tests.helpers.no_such_agents'" in missing["rollout.agent.entrypoint"]
