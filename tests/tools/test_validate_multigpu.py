"""tools/validate_multigpu.py in CPU mode (gloo, fp32): the fsdp dp=2 check passes at 1e-5 and lands in the
table and the JSON; bad arguments exit 2; a cuda run without two GPUs prints SKIPPED rows and exits 0."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers.compose import ROOT

TOOL = ROOT / "tools" / "validate_multigpu.py"
sys.path.insert(0, str(TOOL.parent))  # as the tool itself does: its modules by top-level names
import validate_multigpu  # noqa: E402


def run_tool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    """Shared by the CPU runs: the tiny model is created by the first and reused by the next."""
    return tmp_path_factory.mktemp("validate_multigpu")


def test_cpu_fsdp_dp2_passes(work_dir, tmp_path):
    out = tmp_path / "rows.json"
    proc = run_tool("--device", "cpu", "--checks", "fsdp_dp2", "--out", str(out), "--work-dir", str(work_dir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert payload["precision"] == "fp32" and payload["device"] == "CPU (gloo)"
    rows = payload["rows"]
    assert {r["check"] for r in rows} == {"fsdp_dp2"} and all(r["status"] == "pass" for r in rows)
    by_metric = {r["metric"]: r for r in rows}
    assert 0 <= by_metric["mean |log-prob diff| vs dp=1"]["value"] <= 1e-5
    assert 0 <= by_metric["max grad-norm rel diff (2 steps)"]["value"] <= 1e-5
    assert by_metric["steps compared"]["value"] == 2
    table = proc.stdout[proc.stdout.index("validate_multigpu on") :]
    lines = [line.split() for line in table.splitlines() if line.startswith("fsdp_dp2 ")]
    assert len(lines) == len(rows) and all(line[-2:-1] == ["pass"] for line in lines) and "FAIL" not in table


def test_unknown_check_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        validate_multigpu.parse_args(["--device", "cpu", "--checks", "fsdp_dp3"])
    assert exc.value.code == 2 and "--checks: unknown ['fsdp_dp3']" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has two GPUs: nothing is skipped")
def test_cuda_without_two_gpus_skips_with_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # main() sets it for its children: restored after the test
    out = tmp_path / "rows.json"
    code = validate_multigpu.main(
        ["--checks", "megatron_tp2,sync_distributed", "--out", str(out), "--work-dir", str(tmp_path)]
    )
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["status"] for r in rows] == ["SKIPPED", "SKIPPED"]
    assert all(f"this machine has {torch.cuda.device_count()}" in r["note"] for r in rows)
    assert "SKIPPED: needs 2 GPUs" in capsys.readouterr().out


def test_a_check_past_its_timeout_fails_and_exits_1(work_dir, tmp_path):
    """The ranks are killed at --timeout-s; the row says so and where the logs are; the exit status is 1."""
    out = tmp_path / "rows.json"
    proc = run_tool(
        "--device", "cpu", "--checks", "fsdp_dp2", "--timeout-s", "1", "--out", str(out), "--work-dir", str(work_dir)
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    [row] = json.loads(out.read_text())["rows"]
    assert row["status"] == "FAIL" and "fsdp_rank on 1 rank(s) ran past 1s" in row["note"]
    assert f"logs: {work_dir}/logs/fsdp_dp2" in row["note"] and "FAIL" in proc.stdout
