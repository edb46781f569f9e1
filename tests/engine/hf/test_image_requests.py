"""The hf engine serving a vision-language model: SGLang's `image_data` parsed, each request's pixels and multimodal
RoPE positions, batches that mix image and text prompts, a bad request refused, and log-probs the trainer
reproduces within 1e-5 in fp32."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from slime.engine.hf.generator import GenerationError, GenerationRequest, Generator
from slime.engine.hf.protocol import parse_generate
from slime.engine.hf.sampling import SamplingParams
from slime.engine.hf.server import load_model
from slime.engine.hf.vision import EngineVision
from slime.types import Sample
from slime.vision.prompt import PromptImages
from tests.helpers.fsdp_rank import batches_for, make_backend, make_setup
from tests.helpers.images import shape_records

NEW_TOKENS = 6


@pytest.fixture(scope="module")
def served(tiny_vlm_dir):
    model, tokenizer = load_model(tiny_vlm_dir, "cpu", "float32")
    return model, tokenizer, Generator(model, tokenizer, seed=0, vision=EngineVision.of_checkpoint(model, tiny_vlm_dir))


def image_prompts(model_dir: str, count: int) -> list[tuple[list[int], list[str]]]:
    """(expanded prompt ids, image references) of `count` shape-task prompts, as the rollout sends them."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    images = PromptImages.of_checkpoint(model_dir)
    out = []
    for record in shape_records(count, seed=5):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": record["prompt"]}]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append((images.prompt_ids(tokenizer, text, record["images"]), record["images"]))
    return out


def gen_request(ids, refs=None, **params) -> GenerationRequest:
    params = {"max_new_tokens": NEW_TOKENS, "ignore_eos": True, "temperature": 1.0, "sampling_seed": 7, **params}
    return GenerationRequest(list(ids), SamplingParams.from_dict(params), images=refs)


def test_image_data_takes_sglangs_forms():
    body = {"input_ids": [1, 2], "image_data": "a.png"}
    assert parse_generate(body, encode=None).requests[0].images == ["a.png"]
    body = {"input_ids": [[1], [2], [3]], "image_data": [["a.png", "b.png"], None, "c.png"]}
    assert [r.images for r in parse_generate(body, encode=None).requests] == [["a.png", "b.png"], None, ["c.png"]]
    with pytest.raises(GenerationError, match="one entry per input"):
        parse_generate({"input_ids": [[1], [2]], "image_data": ["a.png"]}, encode=None)
    with pytest.raises(GenerationError, match="must hold image references"):
        parse_generate({"input_ids": [1], "image_data": [3]}, encode=None)


def test_a_batch_mixing_image_and_text_prompts_gives_each_its_own_tokens(served, tiny_vlm_dir):
    model, tokenizer, generator = served
    prompts = image_prompts(tiny_vlm_dir, 2)
    text = tokenizer("<|im_start|>user\nwhat comes after 3 ?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    requests = [gen_request(*prompts[0]), gen_request(text), gen_request(*prompts[1])]
    together = generator.generate(requests)
    alone = [generator.generate([gen_request(r.input_ids, r.images)])[0] for r in requests]
    for both, single in zip(together, alone):
        assert both.output_ids == single.output_ids
        torch.testing.assert_close(
            torch.tensor(both.output_logprobs), torch.tensor(single.output_logprobs), atol=1e-5, rtol=0
        )
    other_image = generator.generate([gen_request(prompts[0][0], prompts[1][1])])[0]  # same ids, the other image
    assert other_image.output_logprobs != alone[0].output_logprobs  # what it sees comes from the pixels


@pytest.mark.parametrize("option", ["tiny_qwen2_5_vl", "tiny_qwen3_vl"])
def test_the_trainer_reproduces_the_engines_log_probs(option, request):
    """Both families (Qwen3-VL's DeepStack features too): the trainer's packed forward of the engine's samples."""
    model_dir = request.getfixturevalue("tiny_vlm_dir" if option == "tiny_qwen2_5_vl" else "tiny_qwen3_vl_dir")
    model, tokenizer = load_model(model_dir, "cpu", "float32")
    generator = Generator(model, tokenizer, seed=0, vision=EngineVision.of_checkpoint(model, model_dir))
    prompts = image_prompts(model_dir, 4)
    results = generator.generate([gen_request(ids, refs) for ids, refs in prompts])
    samples = [
        Sample(
            index=i,
            tokens=ids + res.output_ids,
            response_length=len(res.output_ids),
            loss_mask=[1] * len(res.output_ids),
            rollout_log_probs=res.output_logprobs,
            reward=float(i % 2),
            images=refs,
        )
        for i, ((ids, refs), res) in enumerate(zip(prompts, results))
    ]
    backend = make_backend(make_setup(model_dir, [f"model={option}"]))
    batch = batches_for(samples, dp=1, k=1)[0]
    backend.load_batch(0, batch)
    backend.compute_log_probs("old")
    trainer = backend.columns["old_log_probs"]
    engine = torch.tensor([lp for i in batch.sample_indices for lp in samples[i].rollout_log_probs])
    assert trainer.shape == engine.shape
    assert (trainer - engine).abs().max() < 1e-5


def test_a_request_whose_ids_do_not_hold_its_images_tokens_is_refused(served, tiny_vlm_dir):
    _, _, generator = served
    (ids, refs), _ = image_prompts(tiny_vlm_dir, 2)
    with pytest.raises(
        GenerationError, match=r"input_ids hold 3 image tokens \(id 82\); the 1 images of image_data make 4"
    ):
        generator.validate(gen_request([t for i, t in enumerate(ids) if i != ids.index(82)], refs))
    with pytest.raises(GenerationError, match="image_data: no such image file: gone.png"):
        generator.validate(gen_request(ids, ["gone.png"]))


def test_a_text_model_refuses_image_data(tiny_model):
    model, tokenizer = tiny_model
    with pytest.raises(GenerationError, match="this model reads no images"):
        Generator(model, tokenizer).validate(gen_request([1, 2, 3], ["a.png"]))
