"""Prompt files (JSONL and Parquet), their errors, chat templating, the data source and its state."""

from __future__ import annotations

import json
import logging
import pickle
import random
import subprocess
import sys
import textwrap
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slime.assets.tokenizer import build_tokenizer
from slime.config import fill_derived
from slime.plan.derive import derive
from slime.plan.validate import collect_problems, validate
from slime.rollout.data_source import DataSource, PromptDataset, PromptsTooLong, build_data_source
from slime.rollout.prompt_file import DataFileError, RecordKeys, read_records
from slime.types import Sample, SampleStatus
from tests.helpers.compose import ROOT, typed_config

# slime's example record (its usage guide, "Data Format"), as one JSONL line.
SEED_RECORD = {
    "prompt": [
        {
            "content": "Solve the following math problem step by step. The last line of your response should be of "
            "the form Answer: \\boxed{$Answer} where $Answer is the answer to the problem.\n\nIn triangle $ABC$, "
            "$\\sin \\angle A = \\frac{4}{5}$ ... find $a + b + c$.\n\nRemember to put your answer on its own line "
            'after "Answer:".',
            "role": "user",
            "step_loss_mask": 1,
        }
    ],
    "label": "34",
}
KEYS = RecordKeys()


@pytest.fixture(scope="module")
def tok():
    tokenizer = build_tokenizer()
    # A template that shows what reached it: the tools, an extra kwarg, each message.
    tokenizer.chat_template = (
        "{% for t in tools or [] %}TOOL {{ t.name }} {% endfor %}{% if enable_thinking %}THINK {% endif %}"
        "{% for m in messages %}{{ m.role }} {{ m.content }} {% endfor %}{% if add_generation_prompt %}assistant{% endif %}"
    )
    return tokenizer


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def records(n: int) -> list[dict]:
    return [
        {"prompt": f"what comes after {i}", "label": i + 1, "metadata": {"rm_type": "math", "i": i}} for i in range(n)
    ]


def test_jsonl_and_parquet_give_the_same_records_and_slices(tmp_path):
    rows = [SEED_RECORD] + [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "label": str(r["label"]), "metadata": r["metadata"]}
        for r in records(4)
    ]
    rows[1]["tools"] = json.dumps([{"name": "calc"}])  # a JSON string of tool specs
    jsonl = write_jsonl(tmp_path / "p.jsonl", rows)
    columns = {k: [r.get(k) for r in rows] for k in ("prompt", "label", "metadata", "tools")}
    pq.write_table(pa.Table.from_pydict(columns), tmp_path / "p.parquet")
    from_jsonl = read_records(jsonl, KEYS)
    assert [r.line for r in from_jsonl] == [1, 2, 3, 4, 5]
    assert from_jsonl[0].prompt == SEED_RECORD["prompt"] and from_jsonl[0].label == "34"  # unchanged
    assert from_jsonl[1].tools == [{"name": "calc"}] and from_jsonl[2].metadata == {"rm_type": "math", "i": 1}
    from_parquet = read_records(str(tmp_path / "p.parquet"), KEYS)
    assert from_parquet[0].prompt == SEED_RECORD["prompt"]
    assert [(r.label, r.metadata, r.tools) for r in from_parquet] == [
        (r.label, r.metadata, r.tools) for r in from_jsonl
    ]
    assert [r.line for r in read_records(jsonl + "@[1:3]", KEYS)] == [2, 3]
    assert [r.label for r in read_records(str(tmp_path / "p.parquet") + "@[-2:]", KEYS)] == ["3", "4"]
    numbers = read_records(write_jsonl(tmp_path / "n.jsonl", records(2)), KEYS)
    assert [r.label for r in numbers] == ["1", "2"]  # numeric labels become strings


BAD = [
    ('{"prompt": "a", "label": "1"}\n{"prompt": "b", "label": \n', 2, "not valid JSON"),
    ('{"prompt": "a", "label": "1"}\n\n{"question": "b", "label": "2"}\n', 3, "no key 'prompt' (data.input_key)"),
    ('{"prompt": "a"}\n', 1, "no key 'label' (data.label_key)"),
    ('{"prompt": 7, "label": "1"}\n', 1, "'prompt' must be a string or a non-empty list of messages, got int"),
    ('{"prompt": "a", "label": {"x": 1}}\n', 1, "'label' must be a string or a number, got dict"),
    ('{"prompt": "a", "label": "1", "metadata": [1]}\n', 1, "'metadata' (data.metadata_key) must be an object"),
    ('{"prompt": [{"role": "user", "content": "a", "step_loss_mask": 2}], "label": "1"}\n', 1, "step_loss_mask"),
    ('{"prompt": [{"role": "robot", "content": "a"}], "label": "1"}\n', 1, "prompt[0].role='robot'"),
    ('["prompt", "a"]\n', 1, "expected a JSON object, got list"),
    (b'{"prompt": "a", "label": "1"}\n{"prompt": "caf\xe9", "label": "1"}\n', 2, "not UTF-8 text (byte 0xe9"),
    ("", None, "holds no records (empty file)"),
    ("\n  \n", None, "holds no records (empty file)"),
]


@pytest.mark.parametrize("content,line,message", BAD)
def test_bad_prompt_files_name_file_and_line(tmp_path, content, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataFileError) as info:
        read_records(str(path), KEYS)
    where = f"{path}:{line}" if line else str(path)
    assert str(info.value).startswith(f"{where}: ") and message in str(info.value), str(info.value)


def test_bad_parquet_and_empty_slice(tmp_path):
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "a", "label": "1"}, {"prompt": None, "label": "2"}]), tmp_path / "b.parquet"
    )
    with pytest.raises(DataFileError, match=r"b\.parquet:2: 'prompt' must be a string"):
        read_records(str(tmp_path / "b.parquet"), KEYS)
    (tmp_path / "c.parquet").write_text("not parquet")
    with pytest.raises(DataFileError, match="not a readable parquet file"):
        read_records(str(tmp_path / "c.parquet"), KEYS)
    path = write_jsonl(tmp_path / "p.jsonl", records(2))
    with pytest.raises(DataFileError, match=r"the row slice \[5:None\] selects none of its 2 records"):
        read_records(path + "@[5:]", KEYS)


def test_a_bad_prompt_file_is_a_configuration_error_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "label": "1"}\n{"question": "b", "label": "1"}\n')
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "main.py", f"hydra.run.dir={run_dir}", f"data.prompt_data={bad}", "data.generator=null"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"data.prompt_data='{bad}': {bad}:2: no key 'prompt' (data.input_key)" in proc.stderr
    assert not (run_dir / "result.json").exists() and not (run_dir / "config.yaml").exists()  # nothing started


def test_chat_template_tools_kwargs_and_prompt_length_filter(tmp_path, tok, caplog):
    rows = [
        {"prompt": "what is 1 plus 1", "label": "2", "tools": [{"name": "calc"}]},
        {
            "prompt": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi", "step_loss_mask": 0},
            ],
            "label": "x",
        },
        {"prompt": " ".join(["one"] * 30), "label": "y"},  # too long
    ]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    kwargs = dict(tokenizer=tok, input_key="prompt", label_key="label", metadata_key="metadata")
    with caplog.at_level(logging.INFO, logger="slime.rollout.data_source"):
        dataset = PromptDataset(
            path, **kwargs, apply_chat_template=True, template_kwargs={"enable_thinking": True}, max_prompt_len=12
        )
    assert [s.prompt for s in dataset.samples] == [
        "TOOL calc THINK user what is 1 plus 1 assistant",
        "THINK system be brief user hi assistant",
    ]
    assert dataset.samples[0].metadata == {"tools": [{"name": "calc"}]} and dataset.num_too_long == 1
    assert dataset.samples[1].messages[1]["step_loss_mask"] == 0  # kept for SFT, stripped for the template
    assert f"{path}: dropped 1 of 3 prompts longer than rollout.max_prompt_len=12 tokens" in caplog.text
    raw = PromptDataset(path, **kwargs, apply_chat_template=False)
    assert raw.samples[0].prompt == "what is 1 plus 1" and raw.samples[0].messages is None
    assert raw.samples[1].prompt == rows[1]["prompt"] and raw.samples[1].messages == rows[1]["prompt"]
    with pytest.raises(PromptsTooLong) as info:
        PromptDataset(path, **kwargs, apply_chat_template=True, max_prompt_len=1)
    assert (info.value.count, info.value.shortest, info.value.longest) == (3, 6, 32)
    assert (
        str(info.value)
        == f"{path}: all 3 prompts are longer than rollout.max_prompt_len=1 tokens (templated: 6 to 32 tokens)"
    )


def _source(tmp_path, tok, n_prompts=5, **kw):
    dataset = PromptDataset(
        write_jsonl(tmp_path / "d.jsonl", records(n_prompts)),
        tokenizer=tok,
        input_key="prompt",
        label_key="label",
        metadata_key="metadata",
        apply_chat_template=False,
    )
    return DataSource(dataset, n_samples_per_prompt=2, shuffle=True, seed=7, **kw)


def test_data_source_epochs_shuffle_buffer_and_state(tmp_path, tok):
    source = _source(tmp_path, tok)
    groups = source.get_groups(7)  # crosses into epoch 1
    orders = [list(range(5)), list(range(5))]
    random.Random(7).shuffle(orders[0])
    random.Random(8).shuffle(orders[1])  # seed + epoch
    assert [g[0].prompt_index for g in groups] == orders[0] + orders[1][:2]
    assert [g[0].epoch for g in groups] == [0] * 5 + [1] * 2
    assert [[s.index for s in g] for g in groups[:2]] == [[0, 1], [2, 3]] and groups[6][0].group_index == 6
    assert all(g[0].label == str(g[0].prompt_index + 1) and len(g) == 2 for g in groups)
    # a partial group comes back: served before fresh prompts, with its tokens
    partial = groups[6]
    partial[0].append_response([5, 6], [-0.1, -0.2], "x y")
    partial[0].status = SampleStatus.ABORTED
    source.add_groups([partial])
    with pytest.raises(ValueError, match="holds 1 samples, expected 2"):
        source.add_groups([[Sample()]])
    state = pickle.loads(pickle.dumps(source.state_dict()))  # what the checkpoint stores
    resumed = _source(tmp_path, tok)
    resumed.load_state_dict(state)
    for src in (source, resumed):
        again = src.get_groups(2)
        assert again[0][0].tokens == [5, 6] and again[0][0].status == SampleStatus.ABORTED
        assert [g[0].group_index for g in again] == [6, 7] and again[1][0].prompt_index == orders[1][2]


def test_buffer_filter_picks_which_groups_return(tmp_path, tok):
    newest_first = lambda buffer, num: list(reversed(buffer))[:num]  # noqa: E731
    source = _source(tmp_path, tok, buffer_filter=newest_first)
    first, second, third = source.get_groups(3)
    source.add_groups([first, second, third])
    assert [g[0].group_index for g in source.get_groups(2)] == [2, 1]
    assert [g[0].group_index for g in source.buffer] == [0]


def test_no_dataset_serves_empty_samples():
    source = DataSource(None, n_samples_per_prompt=3, shuffle=True, seed=0)
    (group,) = source.get_groups(1)
    assert len(source) == 0 and [(s.prompt, s.index, s.status) for s in group] == [
        ("", i, SampleStatus.PENDING) for i in range(3)
    ]


CUSTOM_SOURCE = """
from slime.rollout.data_source import DataSource

class Reversed(DataSource):
    def get_groups(self, num_groups):
        return list(reversed(super().get_groups(num_groups)))

class NoState:
    def __init__(self, dataset, *, n_samples_per_prompt, shuffle, seed):
        pass

    def get_groups(self, num_groups):
        return []
"""


def test_custom_data_source_by_import_path(tmp_path, tok, monkeypatch):
    name = f"user_source_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(CUSTOM_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    data_file = write_jsonl(tmp_path / "d.jsonl", records(4))
    cfg = typed_config([f"data.prompt_data={data_file}", "data.generator=null", f"data.source_class={name}.Reversed"])
    fill_derived(cfg, validate(cfg))
    source = build_data_source(cfg.data, data_file, tokenizer=tok, n_samples_per_prompt=1, shuffle=False)
    assert [g[0].prompt_index for g in source.get_groups(3)] == [2, 1, 0]
    for spec, text in [
        (f"{name}.NoState", "lacks add_groups, state_dict, load_state_dict, __len__"),
        (f"{name}.Reverse", "did you mean Reversed?"),
    ]:
        cfg.data.source_class = spec
        assert [(p.key, text in str(p)) for p in collect_problems(cfg)] == [("data.source_class", True)]


def test_num_epoch_derives_num_rollout(tmp_path):
    data_file = write_jsonl(tmp_path / "d.jsonl", records(10))
    base = [
        f"data.prompt_data='{data_file}@[0:9]'",
        "data.generator=null",
        "rollout.batch_size=4",
        "train.global_batch_size=null",
    ]
    cfg = typed_config([*base, "train.num_rollout=null", "train.num_epoch=2"])
    assert derive(cfg).num_rollout == 4  # 2 × 9 // 4
    for num_rollout, num_epoch, key, text in [
        (3, 2, "train.num_epoch", "one of them sizes the run"),
        (None, None, "train.num_rollout", "the run's length is not set"),
        (None, 0, "train.num_epoch", "must be > 0"),
    ]:
        cfg.train.num_rollout, cfg.train.num_epoch = num_rollout, num_epoch
        assert [(p.key, text in str(p)) for p in collect_problems(cfg)] == [(key, True)]
    cfg.train.num_rollout, cfg.train.num_epoch = None, 2
    cfg.algo.dynamic_filter = "slime.rollout.filters.check_reward_nonzero_std"  # drops use up the epochs' prompts
    assert [(p.key, "may fill fewer rollout steps than the 4 derived" in str(p)) for p in collect_problems(cfg)] == [
        ("train.num_epoch", True)
    ]
    cfg.algo.dynamic_filter = None
    cfg.train.num_epoch, cfg.rollout.batch_size, cfg.train.global_batch_size = 1, 16, 128
    assert ("train.num_epoch", True) in [
        (p.key, "fewer prompts than one rollout step" in str(p)) for p in collect_problems(cfg)
    ]


def _over_sampled_steps(source, *, steps: int, batch: int, over: int, seed: int) -> list[list[Sample]]:
    """The default rollout's bookkeeping without engines: each step draws `over` groups (the buffer first),
    trains the `batch` that finish first (a seeded shuffle stands in for timing) and hands the rest back."""
    rng, trained = random.Random(seed), []
    for _ in range(steps):
        drawn = source.get_groups(over)
        assert len(drawn) >= batch
        rng.shuffle(drawn)
        trained += drawn[:batch]
        source.add_groups(sorted(drawn[batch:], key=lambda g: g[0].index))
    return trained


def test_num_epoch_bound_trains_each_prompt_once_per_epoch_under_over_sampling(tmp_path, tok):
    """10 prompts, 2 epochs, batch 4 (5 steps), 6 groups drawn per step: unbounded, the source draws into a
    third epoch and prompts of the first wait in the buffer; bounded by num_rollout × batch it serves exactly
    the run's groups, the last step gets the 4 left, and a resume keeps the bound."""
    unbounded = _over_sampled_steps(_source(tmp_path, tok, 10), steps=5, batch=4, over=6, seed=0)
    # the bug: a third epoch trained, so as many prompts of the first two were not
    assert max(g[0].epoch for g in unbounded) == 2
    assert len({(g[0].epoch, g[0].prompt_index) for g in unbounded if g[0].epoch < 2}) < 20
    bounded = _source(tmp_path, tok, 10, max_groups=20)
    trained = _over_sampled_steps(bounded, steps=3, batch=4, over=6, seed=0)
    resumed = _source(tmp_path, tok, 10, max_groups=20)
    resumed.load_state_dict(pickle.loads(pickle.dumps(bounded.state_dict())))
    trained += _over_sampled_steps(resumed, steps=2, batch=4, over=6, seed=0)
    per_epoch = {e: sorted(g[0].prompt_index for g in trained if g[0].epoch == e) for e in (0, 1)}
    assert per_epoch == {0: list(range(10)), 1: list(range(10))} and len(trained) == 20
    assert resumed.buffer == [] and resumed.exhausted and resumed.get_groups(3) == []
    resumed.add_groups([trained[0]])  # a group handed back after the end is still served
    assert resumed.get_groups(3) == [trained[0]]
