"""train.async=full's GroupStream against a real hf engine behind the real sglang-router: groups stream while a
"push" (pause, new weight version, continue) interrupts them; stale groups are dropped or regenerated; a snapshot
taken mid-stream loses and repeats no prompt."""

from __future__ import annotations

import socket
import time

import pytest

from slime.config.schema import RouterConfig
from slime.engine.client import EngineClient
from slime.engine.router import Router
from slime.rollout.base import RolloutContext, RolloutProgress, StreamLimits
from slime.rollout.data_source import DataSource
from slime.rollout.stream import GroupsFailed, GroupStream
from tests.helpers.rollout_context import context, count_prompts, register_parity, served_engine

MAX_NEW = 48  # tokens (ignore_eos): long enough for a pause to catch requests mid-decode


@pytest.fixture(autouse=True)
def parity_reward_type(monkeypatch):
    register_parity(monkeypatch)


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    """One hf engine (4 sequences per batch) behind the router."""
    with served_engine(tiny_model_dir, tmp_path_factory.mktemp("stream_logs")) as served:
        yield served


def source(tmp_path, tokenizer, num_prompts: int, *, max_groups: int | None = None) -> DataSource:
    data = count_prompts(tmp_path, tokenizer, "prompts", num_prompts, n=2)
    data.max_groups = max_groups
    return data


def stream(served, data, *, regenerate: bool = False, max_staleness: int = 1) -> GroupStream:
    ctx = context(served, batch_size=2, over_sampling=2, max_new_tokens=MAX_NEW)
    limits = StreamLimits(batch_size=2, max_staleness=max_staleness, regenerate_stale=regenerate)
    return GroupStream(ctx, data, limits)


def push(client: EngineClient, version: int, pause_mode: str = "abort", model_dir=None) -> None:
    """A weight push as the engines see it (slime.sync.base): pause (aborting what runs, or holding it in place),
    new version, continue. With `model_dir` the version comes with a reload of the same weights, which (as a real
    push's load) waits for the running batch to stop between two decode steps, so a row that had started holds
    tokens of the old version."""
    client.pause_generation(pause_mode)
    if model_dir is None:
        client.update_weight_version(str(version), abort_all_requests=pause_mode == "abort")
    else:
        client.update_weights_from_disk(str(model_dir), weight_version=str(version), flush_cache=False)
    client.continue_generation()


def wait_decoding(client: EngineClient, timeout_s: float = 60.0) -> None:
    """Until the engine decodes a request (queued ones, which a push can't split, don't count)."""
    deadline = time.monotonic() + timeout_s
    while not any(e.get("num_running_reqs", 0) for e in client.loads()["loads"]):
        assert time.monotonic() < deadline, "no request started decoding"
        time.sleep(0.002)


@pytest.mark.parametrize("pause_mode", ["abort", "in_place"])
def test_a_push_interrupts_generation_and_each_token_keeps_its_version(served, tiny_model_dir, tmp_path, pause_mode):
    """Samples cut by a push's abort continue under the new version in a second call; samples an in-place pause
    held decode on in the same call; either way a response spans two versions, aligned. The stream keeps at most
    batch_size groups in flight, at most one step's started ahead of the trainer (max_staleness 1), and the trainer
    takes them in the order they started."""
    push(served.client, 0)
    s = stream(served, source(tmp_path, served.tokenizer, num_prompts=64))
    s.ctx.config.mask_offpolicy_in_partial_rollout = True
    s.start(trainer_version=0)
    try:
        spanning, trained = [], []
        for version in range(1, 8):
            progress = RolloutProgress()
            groups, metrics = s.take(version - 1, progress)
            assert len(groups) == 2 and metrics["rollout/groups_in_flight"] <= 2
            assert (progress.kept, progress.needed, progress.in_flight) == (2, 2, 0)  # the display's counts
            assert metrics["rollout/buffer_depth"] + metrics["rollout/groups_in_flight"] <= 2  # one step ahead
            trained += groups
            wait_decoding(served.client)  # the next step's groups
            push(served.client, version, pause_mode, tiny_model_dir)
            spanning = [x for g in trained for x in g if len(set(x.token_versions)) > 1]
            if spanning:
                break
        assert spanning, "no push caught a request mid-decode"
        for x in spanning:
            x.check_alignment()
            assert x.response_length == MAX_NEW and x.token_versions == sorted(x.token_versions)
            # the aborted call(s) and the continuation, or the one call held across the push
            assert len(x.weight_versions) >= 2 if pause_mode == "abort" else len(x.weight_versions) == 1
            newest = max(x.token_versions)  # mask_offpolicy_in_partial_rollout: the older tokens carry no loss
            assert x.loss_mask == [int(v == newest) for v in x.token_versions] and 0 in x.loss_mask
        indices = [g[0].group_index for g in trained]
        assert indices == sorted(set(indices))  # start order: fresh prompts are drawn in index order
    finally:
        s.close()


@pytest.mark.parametrize("regenerate", [False, True])
def test_stale_groups_are_dropped_or_regenerated(served, tmp_path, regenerate):
    """Groups finished under version 0 are 2 versions behind a trainer at 2: dropped (counted) or handed back to
    the data source as fresh prompts; what is taken is never over max_staleness."""
    push(served.client, 0)
    data = source(tmp_path, served.tokenizer, num_prompts=64)
    s = stream(served, data, regenerate=regenerate)
    s.start(trainer_version=0)
    try:
        deadline = time.monotonic() + 60
        while s.state_dict()["finished"] == [] and time.monotonic() < deadline:
            time.sleep(0.05)  # a group finished under version 0 waits in the buffer
        push(served.client, 2)
        groups, metrics = s.take(2)
        assert all(max(x.token_versions) == 2 and min(x.token_versions) >= 1 for g in groups for x in g)
        stale = metrics["rollout/stale_regenerated_groups" if regenerate else "rollout/stale_dropped_groups"]
        assert stale >= 1
        other = metrics["rollout/stale_dropped_groups" if regenerate else "rollout/stale_regenerated_groups"]
        assert other == 0
    finally:
        s.close()


def test_a_snapshot_mid_stream_loses_and_repeats_no_prompt(served, tmp_path):
    """A bounded source of 10 groups: 2 steps taken, a snapshot (finished groups kept, those in flight as fresh
    prompts), a new stream from it takes the rest; every group is trained exactly once over both. No push: the
    engine stays at version 0, within max_staleness of every step."""
    push(served.client, 0)
    first = stream(served, source(tmp_path, served.tokenizer, num_prompts=10, max_groups=10), max_staleness=8)
    first.start(trainer_version=0)
    try:
        trained = [g for version in range(2) for g in first.take(version)[0]]
        state = first.state_dict()
        while not state["in_flight"]:  # the stream draws its next groups once woken by the take
            time.sleep(0.01)
            state = first.state_dict()
    finally:
        first.close()
    assert all(x["status"] == "pending" and x["tokens"] == [] for g in state["in_flight"] for x in g)
    second = stream(served, source(tmp_path, served.tokenizer, num_prompts=10, max_groups=10), max_staleness=8)
    second.load_state_dict(state)
    second.start(trainer_version=2)
    try:
        trained += [g for version in range(2, 5) for g in second.take(version)[0]]
        with pytest.raises(RuntimeError, match="the data source ran out"):
            second.take(5)
    finally:
        second.close()
    assert sorted(g[0].group_index for g in trained) == list(range(10))


def closed_router(ctx) -> socket.socket:
    """A bound socket that never listens: the context's requests to it are refused, as to a router that is gone."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    ctx.router_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    return closed


def keeping_stream(served, tmp_path) -> tuple[GroupStream, RolloutContext]:
    """A keep_failed stream of 2 groups a step over a bounded source of 6, not started, and its context (whose
    `router_url` the test points at an outage first)."""
    push(served.client, 0)
    ctx = context(served, batch_size=2, over_sampling=2, max_new_tokens=4)
    limits = StreamLimits(batch_size=2, max_staleness=8, regenerate_stale=False, keep_failed=True)
    data = source(tmp_path, served.tokenizer, num_prompts=6, max_groups=6)
    return GroupStream(ctx, data, limits), ctx


def test_with_keep_failed_groups_whose_router_died_run_again_in_their_places(served, tmp_path):
    """keep_failed (fault tolerance): the stream's requests go to a router that is gone (a closed port), so every
    group fails; take raises GroupsFailed and keeps them, reset, in their places (a snapshot holds them as fresh
    prompts). Once the router answers again and the manager says so (`restarted()`), they run again, and so does a
    group that was still retrying into the outage: the steps take groups 0-1, 2-3, 4-5, each once, no take failing."""
    s, ctx = keeping_stream(served, tmp_path)
    with closed_router(ctx):
        s.start(trainer_version=0)
        try:
            with pytest.raises(GroupsFailed, match=r"failed their generation .*first error: RuntimeError: POST http"):
                s.take(0)
            state = s.state_dict()
            assert [g[0]["group_index"] for g in state["in_flight"]][:2] == [0, 1]
            assert all(x["status"] == "pending" and x["tokens"] == [] for g in state["in_flight"] for x in g)
            ctx.router_url = served.url
            s.restarted()
            taken = [[g[0].group_index for g in s.take(version)[0]] for version in range(3)]
        finally:
            s.close()
    assert taken == [[0, 1], [2, 3], [4, 5]]


def test_a_group_whose_retries_run_out_after_the_restart_runs_again_instead_of_failing_the_take(served, tmp_path):
    """Groups sent into an outage (a real router with no workers answers 503) whose requests are still retrying when
    what died is back (`restarted()`) fail only after it: each runs again in its place at once, so no take fails
    on them (the loop would find no dead part to restart then, and stop the run)."""
    s, ctx = keeping_stream(served, tmp_path)
    log = tmp_path / "empty_router.log"
    empty = Router.launch(cfg=RouterConfig(startup_timeout_s=120), log_path=log)
    try:
        ctx.router_url = empty.url
        s.start(trainer_version=0)
        try:
            deadline = time.monotonic() + 60
            while log.read_text().count("server error") < 4:  # both groups' 2 requests each answered 503
                assert time.monotonic() < deadline, "the stream sent no request"
                time.sleep(0.01)
            ctx.router_url = served.url  # their retries still go to the empty router: they were sent there
            s.restarted()
            taken = [[g[0].group_index for g in s.take(version)[0]] for version in range(3)]
        finally:
            s.close()
    finally:
        empty.shutdown()
    assert taken == [[0, 1], [2, 3], [4, 5]]
