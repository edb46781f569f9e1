"""megatron-core's DDP, distributed optimizer and LR schedule from `train.*`.

Gradients are summed (never averaged) over data-parallel ranks: the losses carry step-level weights
(`TransformerConfig.calculate_per_token_loss`), and `finalize_model_grads` runs without a token count.
"""

from __future__ import annotations

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from slime.train.train_setup import TrainSetup

NO_CLIP = 1e30  # clip_grad = 0: megatron still reports the norm, and never clips at this bound


def wrap_ddp(chunks, config) -> list:
    """Each model chunk in megatron's DDP (one grad buffer per chunk; bucketing on the first only)."""
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=True,
        check_for_nan_in_grad=False,
    )
    wrapped = [
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
        for i, chunk in enumerate(chunks)
    ]
    config.finalize_model_grads_func = lambda model, *args, **kwargs: finalize_model_grads(model, num_tokens=None)
    config.no_sync_func = [m.no_sync for m in wrapped] if len(wrapped) > 1 else wrapped[0].no_sync
    return wrapped


def build(model: list, setup: TrainSetup, *, lr: float, warmup_steps: int):
    """(optimizer, OptimizerParamScheduler) for the wrapped chunks; one scheduler step per optimizer step."""
    t = setup.train
    bf16 = setup.precision == "bf16"
    config = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        min_lr=t.min_lr,
        weight_decay=t.weight_decay,
        adam_beta1=t.adam_beta1,
        adam_beta2=t.adam_beta2,
        adam_eps=t.adam_eps,
        clip_grad=t.clip_grad if t.clip_grad > 0 else NO_CLIP,
        bf16=bf16,
        params_dtype=model[0].config.params_dtype,
        use_distributed_optimizer=True,
    )
    optimizer = get_megatron_optimizer(config, model)
    if setup.device == "cuda":
        fused_adam(optimizer)
    total = max(setup.num_optimizer_steps, warmup_steps + 1)
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if warmup_steps else lr,
        max_lr=lr,
        min_lr=t.min_lr,
        lr_warmup_steps=warmup_steps,
        lr_decay_steps=total,
        lr_decay_style=t.lr_decay_style,
        start_wd=t.weight_decay,
        end_wd=t.weight_decay,
        wd_incr_steps=total,
        wd_incr_style="constant",
    )
    return optimizer, scheduler


def fused_adam(optimizer) -> None:
    """megatron-core without Transformer Engine or apex steps torch's Adam/AdamW with its default foreach
    kernels, about ten passes over the fp32 parameters and moments per step; torch's fused kernel makes one.
    The groups' flags are what torch reads at each step (and saves with the state, so a resume keeps them)."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_optimizer = getattr(inner, "optimizer", None)
        if isinstance(torch_optimizer, torch.optim.Adam | torch.optim.AdamW):
            for group in torch_optimizer.param_groups:
                group.update(foreach=False, fused=True)
