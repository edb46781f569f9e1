"""Token samples of the arithmetic task (recipe=smollm2_arithmetic) in a real model's chat template, for the
tests that compare log-probs on real weights."""

from __future__ import annotations

import random

from slime.assets.arithmetic_task import make_record


def templated_prompts(model_dir: str, num: int, *, seed: int = 3) -> tuple[list[list[int]], list[str]]:
    """`num` train-split problems as the rollout sends them (chat template, generation prompt, no special
    tokens added): their token ids and labels."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng, prompts, labels = random.Random(seed), [], []
    for _ in range(num):
        record = make_record(rng, "train")
        text = tokenizer.apply_chat_template(record["prompt"], tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        labels.append(record["label"])
    return prompts, labels


def boxed_answer_samples(model_dir: str, num: int) -> list[tuple[list[int], int]]:
    """(prompt + response ids, response length): each problem answered `\\boxed{label}<|im_end|>`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts, labels = templated_prompts(model_dir, num)
    out = []
    for prompt, label in zip(prompts, labels):
        response = tokenizer(f"\\boxed{{{label}}}<|im_end|>", add_special_tokens=False)["input_ids"]
        out.append((prompt + response, len(response)))
    return out
