"""tools/plot_runs.py: several runs' curves of chosen keys in one PNG (eval keys at their eval steps); a
malformed --run or keys no run logged exit 2 with a message."""

from __future__ import annotations

import json

from tests.helpers.tools import load_tool


def write_metrics(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


RECORDS = [
    {"eval/step": 0, "eval/arithmetic": 0.25},
    {"rollout/step": 0, "rollout/raw_reward": 0.2},
    {"rollout/step": 1, "rollout/raw_reward": 0.4},
    {"eval/step": 2, "eval/arithmetic": 0.5},
]


def test_two_runs_eval_curves_in_one_png(tmp_path):
    run_dir = tmp_path / "fsdp"
    run_dir.mkdir()
    write_metrics(run_dir / "metrics.jsonl", RECORDS)
    other = write_metrics(tmp_path / "megatron.jsonl", RECORDS[:1])
    out = tmp_path / "curves.png"
    tool = load_tool("plot_runs")
    assert (
        tool.main(
            ["--run", f"fsdp={run_dir}", "--run", f"megatron={other}", "--key", "eval/arithmetic", "--out", str(out)]
        )
        == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_bad_run_or_nothing_to_plot_exits_2(tmp_path, capsys):
    tool = load_tool("plot_runs")
    metrics = write_metrics(tmp_path / "m.jsonl", RECORDS)
    assert tool.main(["--run", str(metrics), "--key", "eval/arithmetic", "--out", str(tmp_path / "a.png")]) == 2
    assert "expected LABEL=PATH" in capsys.readouterr().err
    assert tool.main(["--run", f"a={metrics}", "--key", "eval/other", "--out", str(tmp_path / "b.png")]) == 2
    assert "no run logged any of ['eval/other']" in capsys.readouterr().err
    assert not (tmp_path / "b.png").exists()
