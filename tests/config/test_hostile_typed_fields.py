"""Hostile values of every path-, URL-, address- and model-typed config field (slime.config.input_kinds): each is
refused before anything starts, naming the key. The field list is the schema's own, so a new typed field without
a case here fails `test_every_typed_field_has_a_hostile_case`."""

from __future__ import annotations

import dataclasses
import json
import re
import typing

import pytest

from hydra_plugins.ray_jobs_launcher._core import check_address
from hydra_plugins.ray_jobs_launcher.ray_jobs_launcher import RayJobsLauncherConf
from slime.assets.check import generates_checkpoint
from slime.assets.prepare import prepare_assets
from slime.config.input_kinds import KIND, typed_fields
from slime.config.schema import EvalDatasetConfig
from slime.plan.validate import validate
from slime.run_schema import run_schema
from tests.helpers.compose import fake_hf_dir, typed_config
from tests.helpers.processes import session_processes
from tests.helpers.runs import run_main
from tests.helpers.validation import problems_for

TINY_GENERATED_ONLY_AT = (
    "no such directory (model=tiny_qwen3 generates its random-weight model only at model.generate_at="
)
SERVED = "rollout.models=[{{name: policy, update_weights: true, %s, server_groups: [{{num_gpus: 1}}]}}]"

# typed field (or "field (variant)"): (overrides, the key named, text of the message). {tmp}: the test's tmp_path, which holds a_file (a
# file), prompts.jsonl (one good record) and tiny_qwen3/ (an HF directory of the dense tiny model: config.json only)
FIELD_CASES = {
    "model.hf_checkpoint": (
        ["model.hf_checkpoint={tmp}/tiny_qwen3_typo"],
        "model.hf_checkpoint",
        TINY_GENERATED_ONLY_AT,
    ),
    "model.generate_at": (["model.generate_at={tmp}/a_file/tiny"], "model.generate_at", "a_file is a file"),
    "teacher.hf_checkpoint": (
        ["recipe=tiny_opd", "teacher.hf_checkpoint={tmp}/typo"],
        "teacher.hf_checkpoint",
        "path does not exist",
    ),
    "teacher.hf_checkpoint (another architecture)": (
        [
            "recipe=tiny_opd",
            "model=tiny_qwen3_moe",
            "model@teacher=tiny_qwen3_moe",
            "teacher.hf_checkpoint={tmp}/tiny_qwen3",
        ],
        "teacher.hf_checkpoint",
        "says num_experts=None, the policy (model.num_experts) has 4",
    ),
    "teacher.generate_at": (
        ["recipe=tiny_opd", "teacher.generate_at={tmp}/a_file/t"],
        "teacher.generate_at",
        "a_file is a file",
    ),
    "cluster.ray_address": (["cluster.ray_address=head-node"], "cluster.ray_address", "expected host:port"),
    "cluster.host": (["cluster.host=http://10.0.0.2"], "cluster.host", "not a URL"),
    "rollout.agent.host": (["rollout.agent.host=http://127.0.0.1"], "rollout.agent.host", "not a URL"),
    "rollout.rm_url": (
        ["rollout.rm_type=remote_rm", "rollout.rm_url=localhost:8000"],
        "rollout.rm_url",
        "not an http(s) URL",
    ),
    "rollout.router.address": (["rollout.router.address=router-host"], "rollout.router.address", "host:port"),
    "rollout.models[].model_path": (
        ["rollout.engine=sglang", SERVED % "model_path: {tmp}/typo"],
        "rollout.models[0].model_path",
        "path does not exist",
    ),
    "rollout.models[].router.address": (
        ["rollout.engine=sglang", SERVED % "router: {{address: 'http://r:0'}}"],
        "rollout.models[0].router.address",
        "port 0 is no port",
    ),
    "rollout.external_engines": (
        ["rollout.external_engines=[127.0.0.1:3000]"],
        "rollout.external_engines[0]",
        "not an http(s) URL",
    ),
    "data.prompt_data": (
        ['data.prompt_data="{tmp}/prompts.jsonl@[1.5:]"', "data.generator=null"],
        "data.prompt_data",
        "the row slice '@[1.5:]' is not [start:end] with integer (or empty) bounds",
    ),
    "train.critic.load": (["algo=ppo", "train.critic.load={tmp}/typo"], "train.critic.load", "path does not exist"),
    "train.critic.save": (["train.critic.save={tmp}/a_file"], "train.critic.save", "a file, not a directory"),
    "checkpoint.load": (["checkpoint.load={tmp}/typo"], "checkpoint.load", "path does not exist"),
    "checkpoint.ref_load": (
        ["model=tiny_qwen3_moe", "checkpoint.ref_load={tmp}/tiny_qwen3"],
        "checkpoint.ref_load",
        "says num_experts=None, the policy (model.num_experts) has 4",
    ),
    "checkpoint.ref_load (a file)": (
        ["checkpoint.ref_load={tmp}/a_file"],
        "checkpoint.ref_load",
        "no config.json there",
    ),
    "checkpoint.save": (["checkpoint.save={tmp}/a_file/ckpt"], "checkpoint.save", "a_file is a file, not a directory"),
    "checkpoint.save_hf": (
        ['checkpoint.save_hf="{tmp}/a_file/hf_{{rollout_id}}"'],
        "checkpoint.save_hf",
        "a_file is a file, not a directory",
    ),
    "paths.cache_dir": (["paths.cache_dir={tmp}/a_file"], "data.generator.path", "a_file is a file, not a directory"),
    "paths.output_dir": (["paths.output_dir={tmp}/a_file/run"], "paths.output_dir", "a_file is a file"),
    "debug.load_rollout_data": (
        ["debug=train_only", "debug.load_rollout_data={tmp}/typo"],
        "debug.load_rollout_data",
        "not a directory",
    ),
    "eval.datasets.<name>.prompt_data": (
        ["recipe=embedded_eval", "eval.datasets.digit_task.prompt_data={tmp}/typo.jsonl"],
        "eval.datasets.digit_task.prompt_data",
        "path does not exist",
    ),
}
# the Ray Jobs launcher's typed fields (hydra.launcher.*): value, text of the message
LAUNCHER_CASES = {"hydra.launcher.address": ("127.0.0.1:8265", "not an http(s) URL. Fix: give the dashboard's")}
# String fields whose names suggest a path or an address but that hold neither, and why.
UNTYPED = {
    "rollout.custom_rm_path": "an import path (module.fn): the hooks' checks, tests/config/test_config_hooks.py",
    "paths.root_dir": "the checkout, set by conf/paths (Hydra's runtime.cwd), never typed by a user",
}
PATHLIKE_NAME = re.compile(r"(path|dir|url|address|host|load|save\w*|checkpoint|prompt_data|engines)$")


def all_typed_fields() -> set[str]:
    fields = {key for key, _ in typed_fields(run_schema())}
    fields |= {key for key, _ in typed_fields(RayJobsLauncherConf, "hydra.launcher.")}
    return fields | {key for key, _ in typed_fields(EvalDatasetConfig, "eval.datasets.<name>.")}


def string_fields(cls: type, prefix: str = ""):
    """(dotted key, field) of every str / list[str] field under the schema class `cls`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
        inner = args[0] if args else hints[f.name]
        if dataclasses.is_dataclass(inner):
            suffix = "[]" if typing.get_origin(hints[f.name]) is list else ""
            yield from string_fields(inner, f"{prefix}{f.name}{suffix}.")
        elif hints[f.name] in (str, typing.Optional[str], list[str]):
            yield prefix + f.name, f


@pytest.fixture
def hostile_dir(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "what comes after 3", "label": "4"}) + "\n")
    fake_hf_dir(tmp_path, "tiny_qwen3")
    return tmp_path


def test_every_typed_field_has_a_hostile_case():
    covered = {case.partition(" (")[0] for case in [*FIELD_CASES, *LAUNCHER_CASES]}  # "field (what)": more cases
    assert covered == all_typed_fields()


def test_every_field_named_like_a_path_or_address_is_typed():
    """A new `*_path`, `*_dir`, `*_url`, `address`... field must say its kind (or why it has none) to be checked."""
    untyped = [
        key
        for key, f in [
            *string_fields(run_schema()),
            *string_fields(EvalDatasetConfig, "eval.datasets.<name>."),
            *string_fields(RayJobsLauncherConf, "hydra.launcher."),
        ]
        if PATHLIKE_NAME.search(key.rsplit(".", 1)[-1]) and KIND not in f.metadata and key not in UNTYPED
    ]
    assert untyped == []


@pytest.mark.parametrize("field", list(FIELD_CASES))
def test_a_hostile_value_of_a_typed_field_is_refused_naming_it(field, hostile_dir):
    overrides, key, text = FIELD_CASES[field]
    found = problems_for([o.format(tmp=hostile_dir) for o in overrides], hostile_dir / "run")
    assert key in found, found
    assert text in found[key], found[key]


@pytest.mark.parametrize("field", list(LAUNCHER_CASES))
def test_a_hostile_launcher_value_exits_2_before_any_job(field, capsys):
    value, text = LAUNCHER_CASES[field]
    with pytest.raises(SystemExit) as info:
        check_address(value)
    assert info.value.code == 2
    assert (
        f"Configuration error: invalid configuration (1 problem):\n  - {field}='{value}': {text}"
        in capsys.readouterr().err
    )


def test_a_typed_model_path_is_never_generated_into(tmp_path):
    """The embedded model's option generates its model at model.generate_at only: a mistyped hf_checkpoint is
    refused, and the prepare phase, were it reached, would make nothing there."""
    cfg = typed_config([f"model.hf_checkpoint={tmp_path}/typo", f"paths.cache_dir={tmp_path}/cache"])
    assert not generates_checkpoint(cfg.model)
    found = problems_for([f"model.hf_checkpoint={tmp_path}/typo"], tmp_path / "run")
    assert found["model.hf_checkpoint"].endswith(
        "Fix: download the HF checkpoint to a directory and set model.hf_checkpoint=<dir> (absolute paths are safest)"
    )
    prepare_assets(cfg)
    assert not (tmp_path / "typo").exists()


def test_the_options_own_path_is_generated_wherever_the_cache_is(tmp_path):
    cfg = typed_config([f"paths.cache_dir={tmp_path}/cache"], str(tmp_path / "run"))
    assert cfg.model.hf_checkpoint == cfg.model.generate_at == f"{tmp_path}/cache/models/tiny_qwen3"
    validate(cfg)
    assert cfg.model.hf_checkpoint in prepare_assets(cfg)
    assert (tmp_path / "cache" / "models" / "tiny_qwen3" / "config.json").exists()


def test_a_checkpoint_that_contradicts_the_model_option_names_each_field_with_both_values(hostile_dir):
    found = problems_for(["model=tiny_qwen3_moe", f"model.hf_checkpoint={hostile_dir}/tiny_qwen3"], hostile_dir / "run")
    config_json = f"{hostile_dir}/tiny_qwen3/config.json"
    assert found["model.architecture"].startswith(f"model.architecture='qwen3_moe': {config_json} says 'qwen3'")
    assert found["model.num_experts"].startswith(f"model.num_experts=4: {config_json} says None")
    assert "set model.num_experts=null or pick the model option matching the checkpoint" in found["model.num_experts"]
    assert found["model.tie_word_embeddings"].startswith(f"model.tie_word_embeddings=False: {config_json} says True")


@pytest.mark.parametrize(
    "message,text",
    [
        ({"role": "user"}, "prompt[0] has no 'content'; every message needs one"),
        ({"content": "hi"}, "prompt[0] must be an object with a string 'role'"),
        ({"role": "user", "content": None}, "prompt[0] has no 'content'"),
    ],
)
def test_a_chat_message_without_content_or_role_is_refused_at_its_line(message, text, tmp_path):
    path = tmp_path / "chat.jsonl"
    good = {"prompt": [{"role": "user", "content": "hi"}], "label": "1"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({"prompt": [message], "label": "2"}) + "\n")
    found = problems_for([f"data.prompt_data={path}", "data.generator=null"], tmp_path / "run")
    assert found["data.prompt_data"].startswith(f"data.prompt_data='{path}': {path}:2: {text}"), found


def test_an_assistant_tool_call_may_carry_no_text(tmp_path):
    path = tmp_path / "chat.jsonl"
    messages = [
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "add", "arguments": "{}"}}]},
        {"role": "tool", "content": "3"},
    ]
    path.write_text(json.dumps({"prompt": messages, "label": "3"}) + "\n")
    validate(typed_config([f"data.prompt_data={path}", "data.generator=null"], str(tmp_path / "run")))


def test_every_prompt_longer_than_max_prompt_len_exits_2_before_ray_starts(tmp_path):
    """Only the model's tokenizer can measure the embedded task's (generated) prompts: the check runs once the
    prepare phase made them, before the startup phase starts Ray (slime.driver.preflight)."""
    run_dir = tmp_path / "run"
    proc, _ = run_main(f"hydra.run.dir={run_dir}", "rollout.max_prompt_len=3")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (
        "rollout.max_prompt_len=3: drops every prompt of data.prompt_data=" in proc.stderr
        and "all 2000 are longer (templated: 10 to 10 tokens). Fix: raise rollout.max_prompt_len to at least 10"
        in proc.stderr
    )
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["status"], result["phase"], result["rollouts_completed"]) == ("invalid_config", "prepare", 0)
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
    assert session_processes() == []
