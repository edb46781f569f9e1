"""transformers' own forward as the log-prob reference of the GPU tier: one unpacked sample at a time, sdpa."""

from __future__ import annotations

import torch

Samples = list[tuple[list[int], list[int]]]  # (prompt + response ids, one 0/1 per response token)


def hf_cuda_log_probs(model_dir: str, samples: Samples, *, dtype=torch.bfloat16) -> torch.Tensor:
    """Log-probs (temperature 1) of every response token of `samples`: flat Tensor[N], fp32, on the CPU."""
    from transformers import AutoModelForCausalLM

    from slime.algo.logprobs import log_probs_and_entropy, response_logits_slice

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").cuda()
    out = []
    with torch.no_grad():
        for tokens, mask in samples:
            logits = model(torch.tensor([tokens], device="cuda")).logits[0]
            rows = logits[response_logits_slice(len(tokens) - len(mask), len(mask))]
            target = torch.tensor(tokens[-len(mask) :], device="cuda")
            out.append(log_probs_and_entropy(rows, target, temperature=1.0, with_entropy=False)[0])
    del model
    torch.cuda.empty_cache()
    return torch.cat(out).float().cpu()
