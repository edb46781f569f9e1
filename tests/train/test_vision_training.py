"""A vision-language model on the fsdp backend: packed micro-batches of image prompts give each sample's own
log-probs and gradients, an image pad the policy sampled stays a text token, and train.freeze_vision keeps the tower
as loaded (a push carries it, unchanged)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoTokenizer

from slime.algo.logprobs import log_probs_and_entropy
from slime.types import Sample
from slime.vision.processor import pixel_inputs
from slime.vision.prompt import PromptImages
from tests.helpers.fsdp_rank import batches_for, make_backend, make_setup, train_rollout
from tests.helpers.images import shape_records

VLM = ["model=tiny_qwen2_5_vl"]


def vision_samples(model_dir: str, count: int, *, pad_in_response: int | None = None, text_only: int | None = None):
    """Shape-task prompts (templated, images expanded) with random responses; sample `pad_in_response` answers with
    the image pad token among its tokens, sample `text_only` has no image."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    images = PromptImages.of_checkpoint(model_dir)
    rng = random.Random(0)
    samples = []
    for i, record in enumerate(shape_records(count)):
        refs = None if i == text_only else record["images"]
        content = [{"type": "text", "text": record["prompt"]}] if refs is None else None
        messages = [{"role": "user", "content": content or [{"type": "image"}, {"type": "text", "text": "how"}]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = images.prompt_ids(tokenizer, text, refs) if refs else tokenizer(text)["input_ids"]
        response = [rng.randrange(4, 80) for _ in range(rng.randint(2, 5))]
        if i == pad_in_response:
            response[1] = images.tokens.image_pad
        samples.append(
            Sample(
                index=i,
                tokens=prompt + response,
                response_length=len(response),
                loss_mask=[1] * len(response),
                rollout_log_probs=[-1.0] * len(response),
                reward=float(i % 2),
                images=refs,
            )
        )
    return samples


def reference_log_probs(model, model_dir: str, sample: Sample, temperature: float) -> torch.Tensor:
    """The sample alone, its embeddings built here: the image features at the prompt's image tokens, every other
    token (a sampled image pad too) its own embedding, multimodal RoPE positions from transformers."""
    tokens, prompt = sample.tokens, len(sample.tokens) - sample.response_length
    ids = torch.tensor([tokens])
    embeds = model.get_input_embeddings()(ids)
    positions = None
    if sample.images:
        pixels = pixel_inputs(model_dir, sample.images)
        features = model.model.get_image_features(pixels.pixel_values, pixels.image_grid_thw).pooler_output
        mask = torch.tensor(tokens) == model.config.image_token_id
        mask[prompt:] = False  # the prompt's image tokens only
        embeds = embeds.clone()
        embeds[0, mask] = torch.cat(features)
        positions, _ = model.model.get_rope_index(ids, mask.int()[None], image_grid_thw=pixels.image_grid_thw)
    logits = model(inputs_embeds=embeds, position_ids=positions, use_cache=False).logits[0]
    lp, _ = log_probs_and_entropy(
        logits[prompt - 1 : len(tokens) - 1], torch.tensor(tokens[prompt:]), temperature=temperature, with_entropy=False
    )
    return lp


def test_packed_image_prompts_give_each_samples_log_probs_and_gradients(tiny_vlm_dir):
    setup = make_setup(tiny_vlm_dir, VLM)
    backend = make_backend(setup)
    samples = vision_samples(tiny_vlm_dir, 5, pad_in_response=1, text_only=3)
    batch = batches_for(samples, dp=1, k=1)[0]
    backend.load_batch(0, batch)
    backend.model.eval()
    reference = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir, dtype=torch.float32).eval()
    indices = list(range(len(batch)))
    lp, _ = backend._forward(backend.model, batch, indices, with_entropy=False)
    order = {s.index: s for s in samples}
    ref = torch.cat(
        [reference_log_probs(reference, tiny_vlm_dir, order[i], setup.temperature) for i in batch.sample_indices]
    )
    torch.testing.assert_close(lp, ref, rtol=0, atol=1e-5)
    coef = torch.linspace(-1, 1, lp.numel())
    (lp * coef).sum().backward()
    (ref * coef).sum().backward()
    ours = {n: p.grad for n, p in backend.model.named_parameters() if p.grad is not None}
    theirs = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert ours.keys() == theirs.keys() and any(n.startswith("model.visual.") for n in ours)
    for name, grad in ours.items():
        torch.testing.assert_close(grad, theirs[name], rtol=0, atol=1e-5, msg=name)


def test_a_sampled_image_pad_is_a_text_token_in_training(tiny_vlm_dir):
    """Placed by the model's own rule (every image pad id), the response's pad would take an image feature: the
    forward would fail for the count; placed by the prompt, the sample trains."""
    backend = make_backend(make_setup(tiny_vlm_dir, VLM))
    samples = vision_samples(tiny_vlm_dir, 2, pad_in_response=0)
    batch = batches_for(samples, dp=1, k=1)[0]
    backend.load_batch(0, batch)
    packed = backend._pack([0, 1])
    assert int(packed.image_mask.sum()) == 8 and int((packed.input_ids[0] == 82).sum()) == 9
    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        backend.model(**packed.model_kwargs())


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_vision_keeps_the_tower_as_loaded(tiny_vlm_dir, freeze):
    backend = make_backend(make_setup(tiny_vlm_dir, [*VLM, f"train.freeze_vision={str(freeze).lower()}"]))
    before = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    train_rollout(backend, batches_for(vision_samples(tiny_vlm_dir, 8), dp=1, k=1)[0])
    moved = {n for n, p in backend.model.named_parameters() if not torch.equal(p, before[n])}
    tower = {n for n in before if n.startswith("model.visual.")}
    assert moved & tower == (set() if freeze else tower)
    assert moved - tower == set(before) - tower  # the language model trains either way
    pushed = {name: t for bucket in backend.export_weights(1 << 20) for name, t in bucket}
    tower_pushed = {n: t for n, t in pushed.items() if n.startswith("visual.")}
    assert len(tower_pushed) == len(tower) and "lm_head.weight" not in pushed  # whole, the tied head once
    loaded = before["model.visual.blocks.0.attn.qkv.weight"]
    assert torch.equal(tower_pushed["visual.blocks.0.attn.qkv.weight"], loaded) is freeze
