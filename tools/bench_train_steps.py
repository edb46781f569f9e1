"""The pieces of `tools/bench_train.py`: the RL-shaped batch and its model FLOPs, the benchmark's config and random
model, and one timed training step of each kind (the fsdp or megatron backend as the runtime drives it; plain
transformers, padded, as the baseline)."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

from slime.models.flops import train_flops

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"qwen3_1p7b": "qwen3_1_7b", "tiny": "tiny_qwen3"}


# ---- the batch and its FLOPs -------------------------------------------------------------------
def rl_batch_lengths(seed: int, count: int = 14) -> list[tuple[int, int]]:
    """(prompt, response) token counts: prompts uniform 64-512, responses log-uniform 32-4096."""
    rng = random.Random(seed)
    return [(rng.randint(64, 512), int(math.exp(rng.uniform(math.log(32), math.log(4096))))) for _ in range(count)]


def batch_flops(model, lengths: list[tuple[int, int]]) -> float:
    """Training FLOPs of the (prompt, response) batch, the LM head counted on every token (slime.models.flops)."""
    return train_flops(model, [(p + r, p + r) for p, r in lengths])


# ---- one step ---------------------------------------------------------------------------------------
def compose(shape: str, device: str, model_dir: str, overrides: list[str]):
    """The typed run config of the benchmark (the real config tree, no validation of paths or GPUs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from slime.config.loader import to_run_config
    from slime.run_schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    cluster = "one_gpu" if device == "cuda" else "local_cpu"
    base = [
        f"model={SHAPES[shape]}",
        f"model.hf_checkpoint={model_dir}",
        f"cluster={cluster}",
        # the fsdp backend (a megatron variant's parallelism=megatron comes later and wins) and the built-in engine
        "parallelism=fsdp",
        "parallelism.gradient_checkpointing=false",  # the model's preset recomputes; a variant says whether it does
        "rollout=hf",
        "algo=grpo",
        "algo.use_kl_loss=false",
        "algo.kl_loss_coef=0",
        "train.num_rollout=100",
        "paths.output_dir=/tmp/bench_train",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_run_config(hydra_compose(config_name="config", overrides=base + overrides))


def write_model(cfg, model_dir: str, device: str) -> None:
    """A randomly initialised HF checkpoint of the configured shape (bf16 safetensors)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from slime.assets.tiny_model import hf_config_dict

    if (Path(model_dir) / "config.json").exists():
        return
    torch.manual_seed(0)
    config = AutoConfig.for_model(**hf_config_dict(cfg.model, eos_token_id=0, pad_token_id=0))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device)
    model.save_pretrained(model_dir)


def make_batch(cfg, lengths: list[tuple[int, int]], seed: int):
    """The TrainBatch of one optimizer step on one rank: random token ids, random ±1 advantages."""
    from slime.rollout.postprocess import split_for_data_parallel
    from slime.types import Sample

    rng = random.Random(seed)
    samples = [
        Sample(
            index=i,
            tokens=[rng.randrange(cfg.model.vocab_size) for _ in range(p + r)],
            response_length=r,
            loss_mask=[1] * r,
            reward=float(rng.choice((0, 1))),
        )
        for i, (p, r) in enumerate(lengths)
    ]
    rewards = [s.reward - 0.5 for s in samples]
    n = len(samples)
    return split_for_data_parallel(samples, [s.reward for s in samples], rewards, step_sizes=[n], dp_size=1)[0]


def time_steps(step, steps: int, device: str) -> tuple[list[float], list]:
    """Seconds of each of `steps` calls of `step()` after one warm-up call, and what each of them returned."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step()
    sync()
    times, returned = [], []
    for _ in range(steps):
        start = time.perf_counter()
        returned.append(step())
        sync()
        times.append(time.perf_counter() - start)
    return times, returned


def backend_step(cfg, batch):
    """The configured train backend as the runtime drives it, one rank: load, advantages, one optimizer step; a
    call returns the step's `perf/*` as a run logs them."""
    from slime.net import free_port
    from slime.plan.derive import derive
    from slime.train.base import get_backend_class
    from slime.train.layout import RankLayout
    from slime.train.train_setup import TrainSetup

    setup = TrainSetup.from_run_config(cfg, derive(cfg))
    backend_cls = get_backend_class(cfg.parallelism.backend)
    backend = backend_cls(setup, rank=0, layout=RankLayout(dp=1), master_addr="127.0.0.1", master_port=free_port())
    backend.init()

    def step():
        backend.load_batch(0, batch)
        backend.compute_advantages()
        return backend.train()["perf"]

    return step


def hf_padded_step(cfg, batch, *, micro_batch_size: int, device: str):
    """Plain transformers the way HF-based RL trainers feed it: fp32 parameters under bf16 autocast, SDPA,
    micro-batches of `micro_batch_size` samples right-padded to their longest, full-vocabulary logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        cfg.model.hf_checkpoint, dtype=torch.float32, attn_implementation="sdpa"
    )
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device == "cuda")
    advantages = [r for r in batch.rewards]
    total_tokens = sum(batch.response_lengths)

    def step():
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(batch), micro_batch_size):
            idx = list(range(start, min(start + micro_batch_size, len(batch))))
            width = max(len(batch.tokens[i]) for i in idx)
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            attn = torch.zeros(len(idx), width, dtype=torch.long)
            mask = torch.zeros(len(idx), width - 1)
            adv = torch.zeros(len(idx), width - 1)
            for row, i in enumerate(idx):
                tokens, resp = batch.tokens[i], batch.response_lengths[i]
                ids[row, : len(tokens)] = torch.tensor(tokens)
                attn[row, : len(tokens)] = 1
                mask[row, len(tokens) - resp - 1 : len(tokens) - 1] = 1
                adv[row] = advantages[i]
            ids, attn, mask, adv = (t.to(device) for t in (ids, attn, mask, adv))
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
            log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
            loss = -(adv * log_probs * mask).sum() / total_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def profile_step(step, out: Path) -> None:
    """One more step under torch.profiler: where the GPU time goes and how busy the GPU was."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"wall {wall:.3f} s, GPU kernels {busy:.3f} s ({100 * busy / wall:.0f}% busy)\n\n"
        + events.table(sort_by="self_device_time_total", row_limit=40)
        + "\n\n"
        + events.table(sort_by="cpu_time_total", row_limit=40)
        + "\n\nwhere the host waits for the GPU:\n"
        + "\n".join(
            f"{e.count:5d} x {e.key}: " + " <- ".join(e.stack[:6])
            for e in sorted(prof.key_averages(group_by_stack_n=6), key=lambda e: -e.count)
            if e.key in ("aten::item", "cudaStreamSynchronize", "aten::_local_scalar_dense")
        )
    )
