"""Convert an HF checkpoint into a megatron torch_dist checkpoint (weights only), on CPU in one process.

python tools/convert_hf_to_torch_dist.py --hf-checkpoint /root/Qwen3-4B --save /root/Qwen3-4B_torch_dist

Writes <save>/release/ and <save>/latest_checkpointed_iteration.txt ("release"): use <save> as
checkpoint.ref_load (or checkpoint.load) of a parallelism=megatron run; any tp/pp/ep layout loads it.
The architecture is read from <hf-checkpoint>/config.json (qwen3, qwen3_moe, qwen2, llama).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf-checkpoint", required=True, help="HF model directory (config.json + *.safetensors)")
    parser.add_argument("--save", required=True, help="torch_dist checkpoint ROOT to write")
    args = parser.parse_args(argv)

    from slime.train.megatron.convert import hf_to_torch_dist

    print(hf_to_torch_dist(args.hf_checkpoint, args.save))


if __name__ == "__main__":  # the torch_dist writer starts processes that re-import __main__
    main()
