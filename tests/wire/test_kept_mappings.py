"""The reader's held buffers (slime.wire.kept_mappings) and the hf engine's tensor update that uses them: the two
buffers opened last are held, an item naming one of them again reuses it, and the reply comes after the copy."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import torch

from slime.engine.hf.weight_receiver import WeightReceiver
from slime.wire import bucket_codec
from slime.wire.kept_mappings import KeptMappings


def shared_item(flat: torch.Tensor, value: int) -> str:
    flat.fill_(value)
    metadata = bucket_codec.bucket_metadata([("w", flat)])
    return bucket_codec.encode(flat, metadata, shared=bucket_codec.share_once(flat))


def test_the_two_buffers_opened_last_are_held_and_reused():
    kept = KeptMappings()
    buffers = [torch.empty(64, dtype=torch.uint8) for _ in range(3)]
    first, _ = kept.decode(shared_item(buffers[0], 1))
    again, _ = kept.decode(shared_item(buffers[0], 2))  # written again after the reply: the same mapping sees it
    assert again.data_ptr() == first.data_ptr() and int(again.sum()) == 2 * 64 and len(kept.held) == 1
    kept.decode(shared_item(buffers[1], 3))
    kept.decode(shared_item(buffers[2], 4))
    assert len(kept.held) == 2  # the oldest let go
    assert {t.data_ptr() for t in kept.held.values()} == {b.data_ptr() for b in buffers[1:]}
    kept.release()
    assert not kept.held


def test_the_reply_comes_after_the_copy_and_its_wait():
    order = []
    receiver = WeightReceiver.__new__(WeightReceiver)

    async def run_exclusive(fn, *args):
        return fn(*args)

    receiver.session_open = True
    receiver.scheduler = SimpleNamespace(run_exclusive=run_exclusive, weight_version="0")
    receiver.open_items = lambda items, keep=False: order.append(("open", keep)) or []
    receiver.load = lambda tensors, version: order.append("copy") or 0
    receiver.finish_copies = lambda: order.append("wait")
    body = {"serialized_named_tensors": ["x"], "load_format": "flattened_bucket", "keep_mapping": True}

    async def json():
        return body

    reply = asyncio.run(receiver.handle_update_from_tensor(SimpleNamespace(body_exists=True, json=json)))
    assert reply.status == 200 and order == [("open", True), "copy", "wait"]
