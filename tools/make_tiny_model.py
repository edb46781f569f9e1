"""Create the tiny model of a model config option (e.g. conf/model/tiny_qwen3.yaml) at a path.

python tools/make_tiny_model.py --option tiny_qwen3 --out /tmp/tiny_qwen3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from slime.assets.tiny_model import create_tiny_model
from slime.config.schema import ModelConfig

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"


def make_tiny_model(option: str, out: str | Path) -> Path:
    """The random-weight model of conf/model/<option>.yaml created at `out`."""
    fields = yaml.safe_load((CONF / f"{option}.yaml").read_text())
    fields["hf_checkpoint"] = str(out)
    return Path(create_tiny_model(ModelConfig(**fields)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--option", default="tiny_qwen3", help="a file name (without .yaml) in conf/model/")
    parser.add_argument("--out", required=True, help="directory to create (must not exist)")
    args = parser.parse_args()
    print(make_tiny_model(args.option, args.out))


if __name__ == "__main__":
    main()
