"""Servers bind loopback by default; credentials never reach config.yaml, Hydra's records or error messages;
product checkpoints load with weights_only."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from slime.config.validate_keys import check_unknown_keys
from slime.driver.launch import redacted_yaml, scrub_hydra_records
from slime.tracking.secrets import REDACTED
from tests.helpers.compose import ROOT, typed_config

ENV_SECRETS = {"WANDB_API_KEY": "wk-env-secret-0123456789", "HF_TOKEN": "hf_envtoken_abcdefghij"}
CLI_SECRET = "sk-cli-secret-9876543210"


def test_servers_bind_loopback_unless_configured():
    cfg = typed_config([])
    assert cfg.cluster.host == "127.0.0.1"
    from slime.engine.base import EngineLaunch
    from slime.engine.hf.engine import HFEngine

    launch = EngineLaunch(rank=0, model_path="m", host=cfg.cluster.host, seed=0, device="cpu", log_dir="/tmp")
    command = HFEngine(launch, cfg.rollout.hf).command([15001])
    assert command[command.index("--host") + 1] == "127.0.0.1"


def test_config_yaml_redacts_secret_keys_and_pasted_env_tokens(monkeypatch):
    for name, value in ENV_SECRETS.items():
        monkeypatch.setenv(name, value)
    cfg = typed_config([f"logger.wandb.notes=token {ENV_SECRETS['HF_TOKEN']} pasted", "+rollout.sglang.api_key=x"])
    cfg.rollout.sglang["api_key"] = CLI_SECRET  # a passthrough key for the server
    text = redacted_yaml(cfg)
    assert CLI_SECRET not in text and ENV_SECRETS["HF_TOKEN"] not in text
    assert f"api_key: {REDACTED}" in text and f"notes: token {REDACTED} pasted" in text
    assert "input_key: prompt" in text  # data field names are no secrets


def test_hydra_records_are_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", ENV_SECRETS["HF_TOKEN"])
    hydra_dir = tmp_path / ".hydra"
    hydra_dir.mkdir()
    overrides = [f"+logger.wandb.api_key={CLI_SECRET}", "train.lr=1e-5"]
    (hydra_dir / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (hydra_dir / "config.yaml").write_text(f"x: {ENV_SECRETS['HF_TOKEN']}\n")
    scrub_hydra_records(tmp_path, overrides)
    assert (hydra_dir / "overrides.yaml").read_text() == f"- +logger.wandb.api_key={REDACTED}\n- train.lr=1e-5\n"
    assert (hydra_dir / "config.yaml").read_text() == f"x: {REDACTED}\n"


def test_unknown_secret_key_is_refused_without_echoing_its_value():
    cfg = typed_config([f"+logger.wandb.api_key={CLI_SECRET}"])
    (problem,) = list(check_unknown_keys(cfg))
    assert problem.key == "logger.wandb.api_key" and CLI_SECRET not in str(problem) and REDACTED in str(problem)


def test_cli_with_secrets_in_env_and_overrides_leaks_none(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "main.py", f"hydra.run.dir={run_dir}", f"+logger.wandb.api_key={CLI_SECRET}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **ENV_SECRETS},
    )
    assert proc.returncode == 2 and "logger.wandb.api_key=<redacted>: no such key" in proc.stderr, proc.stderr
    leaked = [s for s in (CLI_SECRET, *ENV_SECRETS.values()) if s in proc.stdout + proc.stderr]
    assert leaked == []
    for record in run_dir.rglob("*"):
        if record.is_file():
            assert not any(s in record.read_text() for s in (CLI_SECRET, *ENV_SECRETS.values())), record
    assert not (run_dir / "config.yaml").exists()


def test_product_code_loads_torch_files_with_weights_only():
    """Every torch.load under slime/ passes weights_only=True (no pickle code runs from a checkpoint)."""
    calls = []
    for path in (ROOT / "slime").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                flags = {k.arg: ast.unparse(k.value) for k in node.keywords}
                calls.append((str(path.relative_to(ROOT)), flags.get("weights_only")))
    assert calls and all(flag == "True" for _, flag in calls), calls
