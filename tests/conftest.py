"""Shared fixtures: composing the real config tree (shrunk to CPU) and the tiny model on disk."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import psutil
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from slime.config import register_configs, to_run_config

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# Inherited by every process the tests start (runs, Ray, routers, engines): leftovers are found by it,
# and runs of other sessions on the same machine are not mistaken for ours.
TEST_SESSION_VAR = "SLIME_TEST_SESSION"
os.environ[TEST_SESSION_VAR] = str(os.getpid())
# The generated models and data of this session's runs (paths.cache_dir): never the checkout's .cache, so
# sessions share nothing through the repository. Removed when the session ends.
SESSION_CACHE = Path(tempfile.mkdtemp(prefix="slime-test-cache-"))
os.environ["SLIME_CACHE_DIR"] = str(SESSION_CACHE)


def session_processes() -> list[str]:
    """Live processes (not zombies) started by this test session, as 'pid: command line'."""
    found = []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.info["pid"] == os.getpid():
            continue
        command = " ".join(proc.info["cmdline"] or [])
        if proc.info["ppid"] == os.getpid() and ("from multiprocessing." in command or "torch_shm_manager" in command):
            # this test process's own helpers (megatron's checkpoint Manager, spawn's resource tracker, the
            # shared-memory manager torch starts for the tensor sync's buckets)
            continue
        try:
            if proc.environ().get(TEST_SESSION_VAR) != os.environ[TEST_SESSION_VAR]:
                continue
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
        found.append(f"{proc.info['pid']}: {' '.join(proc.info['cmdline'] or [])[:120]}")
    return found


def in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run `fn()` in a daemon thread, started; its return value lands in the dict under "result"."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", fn()), daemon=True)
    thread.start()
    return thread, box


def main_argv(run_dir, *overrides: str, tracked: bool = False, progress: bool = False) -> list[str]:
    """`python main.py` writing to `run_dir`, as a test runs it: without what the test does not check.

    No progress display unless `progress`; no wandb run and no end-of-run plots unless `tracked` (wandb's
    service and matplotlib cost ~5 CPU-seconds a run, a fifth of a short run's on 2 cores; the runs of
    test_end_to_end.py keep both, as shipped, and check them)."""
    quiet = [] if progress else ["logger.progress=false"]
    if not tracked:
        quiet += ["logger.wandb.mode=disabled", "logger.plot=false"]
    return [sys.executable, "main.py", f"hydra.run.dir={run_dir}", *quiet, *overrides]


def compose_config(overrides: list[str], output_dir: str = "/tmp/slime-test-run"):
    """Compose conf/config.yaml with `overrides` (as the CLI would) and return the DictConfig."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[f"paths.output_dir={output_dir}", *overrides])


def typed_config(overrides: list[str], output_dir: str = "/tmp/slime-test-run"):
    return to_run_config(compose_config(overrides, output_dir))


def group_options() -> list[tuple[str, str]]:
    """(group, option) for every YAML option file of every top-level config group, recipes and presets included
    (conf/preset's subfolders hold values presets include, no options of their own)."""
    pairs = []
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir()):
        for option in sorted(group_dir.glob("*.yaml")):
            pairs.append((group_dir.name, option.stem))
    return pairs


def model_fields(option: str) -> dict:
    """The ModelConfig fields of conf/model/<option>.yaml (a model option holds nothing else)."""
    return yaml.safe_load((CONF / "model" / f"{option}.yaml").read_text())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Path of the embedded tiny model (config, tokenizer, safetensors), created by code in a temporary directory."""
    from slime.assets.tiny_model import create_tiny_model
    from slime.config.schema import ModelConfig

    fields = model_fields("tiny_qwen3")
    fields["hf_checkpoint"] = str(tmp_path_factory.mktemp("models") / "tiny_qwen3")
    return str(create_tiny_model(ModelConfig(**fields)))


# Order of the end-to-end (`slow`) modules. tools/test.sh runs them beside the unit tests, which keep one core busy
# for the first ~8 minutes: modules whose runs leave a core idle go first (the embedded default's 60-rollout run
# outlasts its module's other runs; single runs), and the pools of many short runs, which keep both cores busy,
# go last. Other modules run in between, in file order.
FIRST_SLOW_MODULES = ("test_end_to_end.py",)
LAST_SLOW_MODULES = ("test_exact_resume.py", "test_interrupts.py", "test_determinism.py", "test_algorithms.py")


def _module_rank(item) -> int:
    name = item.path.name
    if name in FIRST_SLOW_MODULES:
        return 0
    return 2 + LAST_SLOW_MODULES.index(name) if name in LAST_SLOW_MODULES else 1


def pytest_collection_modifyitems(config, items):
    """Modules in the order above (a stable sort by module: each module's tests stay together, in order, so a
    module-scoped pool of runs starts once). GPU-tier tests (marked `gpu`) run on a CUDA machine only; on CPU
    machines they are reported as skipped."""
    items.sort(key=_module_rank)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="GPU tier: needs a CUDA device (run on the lent H200, see README)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_unconfigure(config):
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)
