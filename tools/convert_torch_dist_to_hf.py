"""Convert a megatron torch_dist checkpoint back into an HF checkpoint, on CPU in one process.

python tools/convert_torch_dist_to_hf.py --input-dir /ckpt/iter_0000100 --output-dir /root/Qwen3-4B-iter100 \
    --origin-hf-dir /root/Qwen3-4B

--input-dir is a checkpoint ROOT (its tracker picks the iteration) or one of its iter_XXXXXXX / release
directories. --origin-hf-dir gives the architecture (config.json) and the tokenizer files copied next to
the weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input-dir", required=True, help="torch_dist root, or its iter_XXXXXXX / release dir")
    parser.add_argument("--output-dir", required=True, help="HF directory to write")
    parser.add_argument("--origin-hf-dir", required=True, help="the HF checkpoint the run started from")
    args = parser.parse_args(argv)

    from slime.train.megatron.convert import torch_dist_to_hf

    written = torch_dist_to_hf(args.input_dir, args.output_dir, args.origin_hf_dir)
    print(f"{args.output_dir}: {written / 2**20:.1f} MiB of weights")


if __name__ == "__main__":  # the torch_dist reader may start processes that re-import __main__
    main()
