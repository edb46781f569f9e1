"""tools/convert_hf_to_torch_dist.py and tools/convert_torch_dist_to_hf.py: HF -> torch_dist -> HF is bit-exact
for every family (tied and untied, q/k/v bias, MoE, GLM-4.5 MoE with its expert-score bias, bf16), without Ray, in one CPU process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.helpers.compose import ROOT  # noqa: E402
from tests.helpers.megatron_checkpoints import FAMILIES, make_checkpoint, with_random_expert_bias  # noqa: E402
from tests.helpers.megatron_convert import assert_same_checkpoint  # noqa: E402
from tests.helpers.tools import load_tool  # noqa: E402


def _to_bf16(model_dir) -> None:
    """Rewrite a checkpoint in bfloat16, declared in its config.json, as real downloads are."""
    from safetensors.torch import load_file, save_file

    file = model_dir / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(file)).items()}, str(file), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))


SEED_FLAGS = {
    "convert_hf_to_torch_dist": ["--hf-checkpoint", "--save"],
    "convert_torch_dist_to_hf": ["--input-dir", "--output-dir", "--origin-hf-dir"],
}


@pytest.mark.parametrize("tool", sorted(SEED_FLAGS))
def test_tools_take_the_seeds_flags(tool):
    proc = subprocess.run(
        [sys.executable, f"tools/{tool}.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert all(flag in proc.stdout for flag in SEED_FLAGS[tool])
    # checkpoint writing starts processes that re-import __main__: the conversion must not run again there
    assert 'if __name__ == "__main__":' in (ROOT / "tools" / f"{tool}.py").read_text()


def test_hf_to_torch_dist_to_hf_is_bit_exact(tmp_path):
    """Every family in this process (world size 1 over gloo), as the tools run it; the torch_dist input as a
    release directory (slime's command passes an iter_ directory) and as a root (its tracker)."""
    to_dist, to_hf = load_tool("convert_hf_to_torch_dist"), load_tool("convert_torch_dist_to_hf")
    for family in FAMILIES:
        model = make_checkpoint(family, tmp_path / "hf")
        hf_dir = model.hf_checkpoint
        with_random_expert_bias(model)  # the routers' expert-score bias, a buffer, travels as the weights do
        if family == "qwen2":
            _to_bf16(tmp_path / "hf" / family)
        root, back = tmp_path / "dist" / family, tmp_path / "back" / family
        to_dist.main(["--hf-checkpoint", hf_dir, "--save", str(root)])
        assert (root / "latest_checkpointed_iteration.txt").read_text() == "release"
        assert any((root / "release").glob("*.distcp"))
        source = root / "release" if family == "qwen3_moe" else root
        to_hf.main(["--input-dir", str(source), "--output-dir", str(back), "--origin-hf-dir", hf_dir])
        assert_same_checkpoint(tmp_path / "hf" / family, back)


def test_input_dir_must_be_a_checkpoint(tmp_path):
    from slime.train.megatron.convert import checkpoint_root

    (tmp_path / "iter_0000042").mkdir()
    assert checkpoint_root(tmp_path / "iter_0000042") == (tmp_path.resolve(), 42)
    with pytest.raises(FileNotFoundError, match="neither a torch_dist root"):
        checkpoint_root(tmp_path / "elsewhere")
