"""Multi-GPU validation in one call: each check runs in its own processes and one table is printed.

    NCCL_NVLS_ENABLE=0 python tools/validate_multigpu.py --out validate_multigpu.json     # 2 GPUs, bf16
    python tools/validate_multigpu.py --device cpu --out /tmp/validate.json                # gloo, fp32, tiny
    python tools/validate_multigpu.py --checks megatron_tp2,fsdp_dp2                       # a subset

All five checks took 272 s on 2x H100 (docs/performance.md#multi-gpu-validation); with --compile they take several times
longer on a fresh machine, so split them where one command may run at most 10 minutes, e.g.
`--checks megatron_tp2,megatron_pp2,fsdp_dp2` then `--checks sync_distributed,colocated` (the model under
--work-dir is created once and reused). Positional arguments are extra Hydra overrides of the colocated
main.py run, e.g. `rollout.weight_sync.mode=tensor` (CUDA IPC between colocated trainer and engine).

Checks (`--checks`, comma-separated; default all):
  megatron_tp2, megatron_pp2  the megatron backend with TP=2 / PP=2 against TP=PP=1 on the same weights and
                              samples: mean |log-prob diff| of the forward-only pass, relative difference of
                              one optimizer step's gradient norm
  fsdp_dp2                    the fsdp backend on two data-parallel ranks against one (same global batch,
                              two optimizer steps): log-probs, every step's grad norm and pg_loss
  sync_distributed            trainer (`--sync-backend`, one rank) on GPU 0, an hf engine on GPU 1,
                              `distributed` weight sync (NCCL; gloo on CPU): per-tensor sha256 of the engine
                              (`POST /weights_checker` checksum) against the trainer's export, seconds per sync and GB/s
  colocated                   `python main.py` colocated on two GPUs (two training ranks, two engines),
                              train.num_rollout=3: exit status and last reward; needs Ray (SKIPPED without it)

On CUDA the model is Qwen3-0.6B's shape with 4 layers (random weights, created under --work-dir) in bf16,
tolerances 0.02 (log-probs) and 5% (grad norm); on CPU the tiny_qwen3 shape in fp32, tolerances 1e-5.
GB/s is the bytes the trainer broadcast per sync (its exported dtype) over the seconds of the whole sync
(pause, flush, transfer, continue). With fewer than two GPUs the multi-GPU checks print SKIPPED with the
reason; on one GPU the training checks still run their single-rank baseline (the CUDA path, one bf16 step:
its grad norm is printed). NVLink multicast is off for every child process (NCCL_NVLS_ENABLE=0 and PyTorch's
and NVSHMEM's switches), and so is torch.compile unless --compile is given (TORCHDYNAMO_DISABLE=1). Each
check's rows are printed, and --out rewritten, as soon as it ends.
Rank logs: <work dir>/logs/<check>.world<n>.rank<r>.log. Exit status: 0 when every executed check passed,
1 when one failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the repo (slime) and this directory (the rank functions, by a top-level name: an installed package called
# `tools` would shadow this directory's namespace package)
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import validate_multigpu_ranks as ranks  # noqa: E402

from slime.assets.tiny_model import ensure_tiny_model  # noqa: E402

# NVLink multicast off in NCCL, PyTorch and NVSHMEM: a program that uses it can take a shared host's GPUs down
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CHECKS = ("megatron_tp2", "megatron_pp2", "fsdp_dp2", "sync_distributed", "colocated")


@dataclasses.dataclass(kw_only=True)
class Row:
    """One line of the table; `status` is pass | FAIL | SKIPPED | info."""

    check: str
    layout: str
    metric: str
    value: float | str | None
    tolerance: str
    status: str
    seconds: float
    note: str = ""


def _row(check, layout, metric, value, tol: float | None, seconds, *, higher_ok: bool = False) -> Row:
    """A measured row: pass when `value` <= `tol` (info when there is no tolerance)."""
    if tol is None:
        return Row(
            check=check, layout=layout, metric=metric, value=value, tolerance="-", status="info", seconds=seconds
        )
    ok = value is not None and value == value and (value >= tol if higher_ok else value <= tol)
    return Row(
        check=check,
        layout=layout,
        metric=metric,
        value=value,
        tolerance=f"{'>=' if higher_ok else '<='} {tol:g}",
        status="pass" if ok else "FAIL",
        seconds=seconds,
    )


def _skipped(check: str, layout: str, why: str) -> Row:
    return Row(
        check=check, layout=layout, metric="-", value=None, tolerance="-", status="SKIPPED", seconds=0.0, note=why
    )


def _logs(opts, check: str) -> str:
    """Prefix of a check's logs: `<work dir>/logs/<check>` (+ `.world<n>.rank<r>.log`, `.log`, engine logs)."""
    return str(Path(opts.work_dir) / "logs" / check)


def _spawn(opts, check: str, fn, job: ranks.Job) -> list[dict]:
    """`fn` on every rank of `job`'s layout; each rank's result dict."""
    logs = f"{_logs(opts, check)}.world{job.world_size}"
    return ranks.run_ranks(fn, job, job.world_size, opts.timeout_s, logs)


def _layout(check: str, opts) -> str:
    if check == "sync_distributed":
        where = "GPU0 -> hf engine GPU1" if opts.device == "cuda" else "-> hf engine (gloo)"
        return f"{opts.sync_backend} trainer {where}"
    return {"megatron_tp2": "tp=2", "megatron_pp2": "pp=2", "fsdp_dp2": "dp=2"}.get(check, "2 ranks + 2 engines")


# ---- the checks: each returns its rows; an exception becomes a FAIL row ---------------------------------
def check_megatron(name: str, profile: ranks.Profile, opts) -> list[Row]:
    sizes = {"megatron_tp2": {"tp": 2}, "megatron_pp2": {"pp": 2}}[name]
    start = time.perf_counter()
    if opts.megatron_baseline is None:  # tp=pp=1, shared by megatron_tp2 and megatron_pp2
        opts.megatron_baseline = _spawn(opts, name, ranks.megatron_rank, ranks.Job(profile=profile))[0]
    one = opts.megatron_baseline
    job = ranks.Job(profile=profile, **sizes)
    owner = _spawn(opts, name, ranks.megatron_rank, job)[job.layout().owner_of(0)]
    seconds, layout = time.perf_counter() - start, _layout(name, opts)
    lp_diff = (owner["log_probs"] - one["log_probs"]).abs().mean().item()
    grad_rel = abs(owner["grad_norm"] - one["grad_norm"]) / max(abs(one["grad_norm"]), 1e-12)
    return [
        _row(name, layout, "mean |log-prob diff| vs tp=pp=1", lp_diff, profile.log_prob_tol, seconds),
        _row(name, layout, "grad-norm rel diff vs tp=pp=1", grad_rel, profile.grad_tol, seconds),
        _row(name, layout, "grad norm (tp=pp=1)", one["grad_norm"], None, seconds),
    ]


def check_fsdp_dp2(name: str, profile: ranks.Profile, opts) -> list[Row]:
    start = time.perf_counter()
    one = _spawn(opts, name, ranks.fsdp_rank, ranks.Job(profile=profile, backend="fsdp"))
    two = _spawn(opts, name, ranks.fsdp_rank, ranks.Job(profile=profile, backend="fsdp", dp=2))
    seconds, layout = time.perf_counter() - start, _layout(name, opts)
    lp1 = {i: lp for r in one for i, lp in r["log_probs"].items()}  # sample index -> Tensor[response tokens]
    lp2 = {i: lp for r in two for i, lp in r["log_probs"].items()}
    lp_diff = sum((lp1[i] - lp2[i]).abs().sum().item() for i in lp1) / sum(v.numel() for v in lp1.values())
    steps1, steps2 = one[0]["steps"], two[0]["steps"]
    grad_rel = max(
        abs(a["train/grad_norm"] - b["train/grad_norm"]) / max(abs(a["train/grad_norm"]), 1e-12)
        for a, b in zip(steps1, steps2)
    )
    loss_diff = max(abs(a["train/pg_loss"] - b["train/pg_loss"]) for a, b in zip(steps1, steps2))
    n = len(steps1)
    return [
        _row(name, layout, "mean |log-prob diff| vs dp=1", lp_diff, profile.log_prob_tol, seconds),
        _row(name, layout, f"max grad-norm rel diff ({n} steps)", grad_rel, profile.grad_tol, seconds),
        _row(name, layout, f"max |pg_loss diff| ({n} steps)", loss_diff, profile.log_prob_tol, seconds),
        _row(name, layout, "steps compared", float(len(steps2)), float(n), seconds, higher_ok=True),
    ]


def check_sync(name: str, profile: ranks.Profile, opts) -> list[Row]:
    start = time.perf_counter()
    job = ranks.Job(profile=profile, backend=opts.sync_backend, num_syncs=opts.num_syncs, log_dir=_logs(opts, name))
    result = _spawn(opts, name, ranks.sync_rank, job)[0]
    seconds, layout = time.perf_counter() - start, _layout(name, opts)
    later = result["times"][1:] or result["times"]
    per_sync = sum(later) / len(later)
    gb = result["bytes"] / 1e9
    return [
        _row(name, layout, f"tensors differing after sync (of {result['num_tensors']})", result["mismatched"], 0, seconds),
        _row(name, layout, "tensors the sync changed on the engine", result["changed"], 1, seconds, higher_ok=True),
        _row(name, layout, "weight version on the engine", float(result["engine_version"]), job.num_syncs, seconds,
             higher_ok=True),
        _row(name, layout, "first sync s", result["times"][0], None, seconds),
        _row(name, layout, f"s per sync (mean of {len(later)})", per_sync, None, seconds),
        _row(name, layout, f"GB/s ({gb:.3g} GB per sync)", gb / per_sync, None, seconds),
    ]  # fmt: skip


def _run_main(command: list[str], log: Path, timeout_s: float) -> int:
    """main.py's exit status; past `timeout_s` it gets SIGTERM (it tears Ray down and exits 143), then SIGKILL."""
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise


def check_colocated(name: str, profile: ranks.Profile, opts) -> list[Row]:
    layout = _layout(name, opts)
    if subprocess.run([sys.executable, "-c", "import ray"], capture_output=True).returncode != 0:
        return [_skipped(name, layout, "`import ray` failed: Ray is not installed here (carry it in to run this)")]
    run_dir = Path(opts.work_dir) / "colocated_run"
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl of an earlier call must not be read
    cluster = ["cluster=one_gpu", "cluster.num_gpus_per_node=2"] if opts.device == "cuda" else ["cluster.colocate=true"]
    command = [
        sys.executable, "main.py", f"hydra.run.dir={run_dir}", "logger.progress=false", "logger.wandb.mode=disabled",
        "train.num_rollout=3",
        *cluster, "cluster.actor.num_gpus_per_node=2", "cluster.rollout.num_gpus=2", *opts.main_overrides,
    ]  # fmt: skip
    start = time.perf_counter()
    code = _run_main(command, Path(f"{_logs(opts, name)}.log"), opts.timeout_s)
    seconds = time.perf_counter() - start
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    rewards = [r["rollout/raw_reward"] for r in records if "rollout/raw_reward" in r]
    rows = [
        _row(name, layout, "exit status of main.py", float(code), 0, seconds),
        _row(name, layout, "rollout steps logged", float(len(rewards)), 3, seconds, higher_ok=True),
        _row(name, layout, "last rollout/raw_reward", rewards[-1] if rewards else None, None, seconds),
    ]
    rows[0].note = " ".join(command[1:]) + ("" if code == 0 else f" (log: {_logs(opts, name)}.log)")
    return rows


# the single-rank run each training check compares against: (rank function, backend)
BASELINES = {
    "megatron_tp2": (ranks.megatron_rank, "megatron"),
    "megatron_pp2": (ranks.megatron_rank, "megatron"),
    "fsdp_dp2": (ranks.fsdp_rank, "fsdp"),
}


def baseline_only(name: str, profile: ranks.Profile, opts) -> list[Row]:
    """One GPU: the check's single-rank run alone (the CUDA path, bf16, one step), the comparison SKIPPED."""
    fn, backend = BASELINES[name]
    start = time.perf_counter()
    result = _spawn(opts, name, fn, ranks.Job(profile=profile, backend=backend))[0]
    grad_norm = result["steps"][0]["train/grad_norm"] if "steps" in result else result["grad_norm"]
    seconds = time.perf_counter() - start
    return [
        _row(name, "1 rank", "grad norm of one step (1 GPU)", grad_norm, None, seconds),
        _skipped(name, _layout(name, opts), "needs 2 GPUs; this machine has 1: only the 1-rank baseline ran"),
    ]


CHECK_FUNCTIONS = {
    "megatron_tp2": check_megatron,
    "megatron_pp2": check_megatron,
    "fsdp_dp2": check_fsdp_dp2,
    "sync_distributed": check_sync,
    "colocated": check_colocated,
}


# ---- driver -------------------------------------------------------------------------------------------
def run_checks(selected: list[str], profile: ranks.Profile, opts) -> Iterator[list[Row]]:
    """Each check's rows as soon as it ends (a later check that outlives the caller's time leaves them kept)."""
    gpus = ranks.gpu_count() if profile.device == "cuda" else None
    for check in selected:
        one_gpu = gpus == 1 and check in BASELINES
        if gpus is not None and gpus < 2 and not one_gpu:
            hint = " (--device cpu runs the checks on CPU over gloo)" if gpus == 0 else ""
            yield [_skipped(check, _layout(check, opts), f"needs 2 GPUs; this machine has {gpus}{hint}")]
            continue
        print(f"== {check} (logs: {_logs(opts, check)}*)", flush=True)
        start = time.perf_counter()
        try:
            if check != "colocated":  # main.py creates its own model
                ensure_tiny_model(profile.model)
            yield (baseline_only if one_gpu else CHECK_FUNCTIONS[check])(check, profile, opts)
        except Exception as exc:  # noqa: BLE001 - one failed check is a FAIL row; the others still run
            lines = [line for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
            yield [
                Row(check=check, layout=_layout(check, opts), metric="error", value=None, tolerance="-", status="FAIL",
                    seconds=time.perf_counter() - start, note=f"{lines[-1][:300]} (logs: {_logs(opts, check)}*)")
            ]  # fmt: skip


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def render(rows: list[Row], header: str) -> str:
    cols = ("check", "layout", "metric", "value", "tolerance", "status", "seconds")
    table = [cols] + [
        (r.check, r.layout, r.metric, _fmt(r.value), r.tolerance, r.status, f"{r.seconds:.1f}") for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    lines = [header] if header else []
    lines.append("  ".join(c.ljust(w) for c, w in zip(table[0], widths)))
    lines.append("  ".join("-" * w for w in widths))
    for row, line in zip(rows, table[1:]):
        lines.append("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
        if row.note:
            lines.append(f"    {row.status}: {row.note}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated subset of {', '.join(CHECKS)}")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument(
        "--work-dir",
        default=str(ROOT / "outputs" / "validate_multigpu"),
        help="the random-weight model (reused by later calls), rank and engine logs, the colocated run",
    )
    parser.add_argument("--sync-backend", choices=("fsdp", "megatron"), default="fsdp")
    parser.add_argument("--num-syncs", type=int, default=5, help="weight syncs timed (the first is reported apart)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per spawned group of ranks / main.py run")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="keep torch.compile on (off by default: on a fresh 2-GPU machine compiling took 66 s of a 3-rollout "
        "colocated run and most of each training check; the checks are about layouts, not speed)",
    )
    parser.add_argument("main_overrides", nargs="*", help="extra Hydra overrides for the colocated main.py run")
    opts = parser.parse_args(argv)
    selected = [c.strip() for c in opts.checks.split(",") if c.strip()]
    unknown = [c for c in selected if c not in CHECKS]
    if unknown or not selected:
        parser.error(f"--checks: unknown {unknown or 'empty list'}; choose from {', '.join(CHECKS)}")
    if opts.num_syncs < 1:
        parser.error(f"--num-syncs={opts.num_syncs}: at least one sync")
    opts.selected = selected
    opts.megatron_baseline = None
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    os.environ.update(NO_MULTICAST)  # for every child process: NVLink multicast off
    if not opts.compile:
        os.environ["TORCHDYNAMO_DISABLE"] = "1"  # every child's torch.compile runs eagerly
    opts.work_dir = str(Path(opts.work_dir).resolve())
    Path(opts.work_dir, "logs").mkdir(parents=True, exist_ok=True)
    profile = ranks.make_profile(opts.device, Path(opts.work_dir) / "models")
    start = time.perf_counter()
    payload = {
        "device": ranks.describe_device(opts.device),
        "model": profile.model.name,
        "precision": profile.precision,
        "command": " ".join(["python", "tools/validate_multigpu.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    header = f"validate_multigpu on {payload['device']}: model {profile.model.name}, {profile.precision}, "
    rows: list[Row] = []
    for check_rows in run_checks(opts.selected, profile, opts):
        rows += check_rows
        print(render(check_rows, ""), flush=True)
        payload.update(seconds=round(time.perf_counter() - start, 1), rows=[dataclasses.asdict(r) for r in rows])
        if opts.out:  # rewritten after every check
            Path(opts.out).write_text(json.dumps(payload, indent=2))
    print(render(rows, header + f"{payload['seconds']} s\n$ {payload['command']}"), flush=True)
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
