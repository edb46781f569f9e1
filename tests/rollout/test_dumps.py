"""Rollout dumps: what `debug.save_rollout_data` writes, reading it back, and the per-epoch coverage check.

main.py with save and replay: tests/e2e/test_end_to_end.py::test_data_parallel_run_and_resume.
"""

from __future__ import annotations

import json

import pytest
import torch

from slime.plan.validate import collect_problems
from slime.rollout.data_source import DataSource, PromptDataset
from slime.rollout.dumps import epoch_coverage, load_rollout_data, main, save_rollout_data
from slime.types import SampleStatus
from tests.helpers.compose import typed_config


def _finish(groups, reward=1.0):
    for group in groups:
        for s in group:
            s.tokens = [1, 2]
            s.append_response([3, 4], [-0.5, -0.25], "a b")
            s.reward, s.status = reward, SampleStatus.COMPLETED
    return groups


def test_dumps_round_trip_and_show_each_prompt_once_per_epoch(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(3)))
    dataset = PromptDataset(
        str(path), tokenizer=None, input_key="prompt", label_key="label", metadata_key=None, apply_chat_template=False
    )
    source = DataSource(dataset, n_samples_per_prompt=2, shuffle=True, seed=3)
    # step 0 over-samples 3 groups, trains 2 and hands one back unfinished; step 1 serves it first
    drawn = source.get_groups(3)
    source.add_groups([drawn[1]])
    step0 = _finish([drawn[0], drawn[2]])
    step1 = _finish(source.get_groups(2), reward={"score": 0.5})
    drawn = source.get_groups(2)
    source.add_groups([drawn[1]])  # the run ends with this one still in the buffer
    step2 = _finish([drawn[0]])
    torch.save(source.state_dict(), tmp_path / "state.pt")  # what the last checkpoint holds
    for rollout_id, groups in enumerate([step0, step1, step2]):
        save_rollout_data(tmp_path / "run", rollout_id, groups)
    dump_dir = tmp_path / "run" / "rollout_data"
    loaded = load_rollout_data(dump_dir, 1)
    assert [[s.to_dict() for s in g] for g in loaded] == [[s.to_dict() for s in g] for g in step1]
    assert loaded[0][0].epoch == 0 and loaded[1][0].epoch == 1 and loaded[0][0].reward == {"score": 0.5}
    coverage = epoch_coverage(dump_dir)
    assert coverage[0] == {0: 1, 1: 1, 2: 1} and sum(coverage[1].values()) == 2 and set(coverage) == {0, 1}
    assert main([str(dump_dir), "3", str(tmp_path / "state.pt")]) == 0
    out = capsys.readouterr().out
    assert "epoch 0: 3 of 3 prompts trained, repeated [], in the buffer 0, missing 0 []" in out
    assert "epoch 1: 2 of 3 prompts trained, repeated [], in the buffer 1, missing 0 []" in out
    save_rollout_data(tmp_path / "skipped", 0, step1)  # epoch 1 drawn while 2 prompts of epoch 0 are lost
    assert main([str(tmp_path / "skipped" / "rollout_data"), "3"]) == 1
    save_rollout_data(tmp_path / "run", 3, step0)  # the same prompts again in epoch 0
    assert main([str(dump_dir), "3"]) == 1
    (dump_dir / "4.jsonl").write_text('{"index": 0, "tokens": [1], "response_length": 3}\n')
    with pytest.raises(ValueError, match=r"4\.jsonl:1: not a dumped sample \(ValueError: sample 0: response_length 3"):
        load_rollout_data(dump_dir, 4)


def test_load_rollout_data_is_checked_at_start_up(tmp_path):
    dump_dir = tmp_path / "rollout_data"
    dump_dir.mkdir()
    (dump_dir / "0.jsonl").write_text("{}\n")
    cfg = typed_config([f"debug.load_rollout_data={dump_dir}", "train.num_rollout=3", "recipe=embedded_eval"])
    problems = {p.key: str(p) for p in collect_problems(cfg)}
    assert "no dump for rollout(s) [1, 2] of train.num_rollout=3" in problems["debug.load_rollout_data"]
    assert "starts no engines to evaluate with" in problems["eval.interval"]
    cfg.debug.load_rollout_data = str(tmp_path / "nowhere")
    assert "not a directory" in {p.key: str(p) for p in collect_problems(cfg)}["debug.load_rollout_data"]
