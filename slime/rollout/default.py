"""The default rollout function (`rollout.function=default`, docs/data-and-rewards.md#the-default-rollout-function).

`generate_rollout(args, rollout_id, data_source, evaluation=False)`:

* train: pull `over_sampling_batch_size` groups (the buffer first) whenever kept + in flight fall
  below `batch_size`; every sample of a group is generated concurrently under a semaphore of
  `concurrency × engines` (`slime.rollout.generate`); a finished group goes through the dynamic filter
  and is kept until `batch_size` groups are. Then the leftovers are aborted: the flag stops samples
  that have not started, and every engine the router lists gets `POST /abort_request {abort_all}`
  (repeated until the in-flight requests came back, none is awaited to its end). With
  `rollout.partial_rollout` the cut groups return to the buffer as they are (finished samples with
  their rewards, aborted ones with their partial responses) and continue at the next step; without,
  they return reset, to be generated anew. Either way no prompt is lost or trained twice.
* eval (`evaluation=True`): every prompt of every `args.eval_datasets` entry, all datasets at once,
  with the dataset's own sampling parameters and reward type; no filter, no abort.

With `args.sampling_seed` set (rollout.deterministic), every request carries SGLang's per-request
`sampling_seed`, and groups are judged (dynamic filter, batch full) in submission order rather than
completion order, so which groups are kept does not depend on timing. Where an abort cuts a response
does, so a deterministic partial rollout lets the leftovers finish instead and returns them whole.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import aiohttp

from slime.engine.router import Router
from slime.registry import ENGINES
from slime.rollout.base import EvalDataset, EvalOutput, RolloutContext, RolloutOutput
from slime.rollout.filters import FilterResult
from slime.rollout.generate import generate_and_reward, post_json
from slime.types import Sample, SampleStatus

logger = logging.getLogger(__name__)

ABORT_RETRY_S = 1.0  # re-send the abort while requests are still out (one may have reached an engine late)


@dataclasses.dataclass
class _Step:
    """Bookkeeping of one train rollout call."""

    kept: list[list[Sample]] = dataclasses.field(default_factory=list)
    pending: list[asyncio.Task] = dataclasses.field(default_factory=list)  # in submission order
    drops: dict[str, int] = dataclasses.field(default_factory=dict)
    submitted: int = 0


async def _generate_group(
    args: RolloutContext, semaphore: asyncio.Semaphore, group: list[Sample], params: dict, **call
) -> list[Sample]:
    async def one(sample: Sample) -> Sample:
        async with semaphore:
            return await generate_and_reward(args, sample, params, **call)

    group = list(await asyncio.gather(*(one(s) for s in group)))
    if args.rewards.group_rm:
        await args.rewards.reward_group(args, group, rm_type=args.rm_type)  # one call for the whole group
    return group


def _judge(args: RolloutContext, group: list[Sample], step: _Step) -> bool:
    """Apply the dynamic filter; count drops by reason. Keeps everything past `max_filter_drops`."""
    if args.hooks.dynamic_filter is None:
        return True
    result = args.hooks.dynamic_filter(args, group)
    if isinstance(result, bool):
        result = FilterResult(result)
    if result.keep:
        return True
    if result.keep_when_insufficient and len(step.kept) + len(step.pending) < args.batch_size:
        step.drops["kept_when_insufficient"] = step.drops.get("kept_when_insufficient", 0) + 1
        return True  # dropping it would force another over-sampling round
    if sum(n for reason, n in step.drops.items() if reason.startswith("drop")) >= args.max_filter_drops:
        step.drops["forced_keep"] = step.drops.get("forced_keep", 0) + 1
        return True
    key = f"drop_{result.reason}" if result.reason else "drop"
    step.drops[key] = step.drops.get(key, 0) + 1
    return False


async def _abort_engines(args: RolloutContext) -> None:
    """POST the engine's abort of everything in flight to every worker the router lists (EngineFacts: SGLang's
    /abort_request {abort_all}, vLLM's /abort_requests {})."""
    workers = await asyncio.to_thread(Router(args.router_url).list_workers)
    facts = ENGINES.facts(args.config.engine)
    body = {"abort_all": True} if facts.abort_all_flag else {}
    await asyncio.gather(*(post_json(args.session, f"{w['url']}{facts.abort_path}", body) for w in workers))


async def _drain(args: RolloutContext, pending: list[asyncio.Task], *, abort: bool) -> list[list[Sample]]:
    """The leftover groups, aborted (unless `abort` is false: then they finish), in submission order."""
    if abort:
        args.aborted = True
    waiting = set(pending)
    while waiting:
        if abort:
            await _abort_engines(args)
        _, waiting = await asyncio.wait(waiting, timeout=ABORT_RETRY_S if abort else None)
    return [task.result() for task in pending]


def _report(args: RolloutContext, step: _Step) -> None:
    """The step's group counts so far, for the progress display."""
    dropped = sum(n for reason, n in step.drops.items() if reason.startswith("drop"))
    args.progress.kept, args.progress.submitted, args.progress.dropped = len(step.kept), step.submitted, dropped
    args.progress.in_flight = len(step.pending)


async def _train(args: RolloutContext, data_source, rollout_id: int, semaphore: asyncio.Semaphore) -> _Step:
    step = _Step()
    try:
        return await _fill(args, data_source, rollout_id, semaphore, step)
    except BaseException:  # a group failed (a dead engine): the rest are cancelled, not left to fail unheard
        for task in step.pending:
            task.cancel()
        await asyncio.gather(*step.pending, return_exceptions=True)
        raise


async def _fill(args: RolloutContext, data_source, rollout_id: int, semaphore: asyncio.Semaphore, step: _Step) -> _Step:
    """Submit groups and judge them as they finish until `rollout.batch_size` are kept; the rest stay pending."""
    call = dict(rollout_id=rollout_id, evaluation=False)
    args.progress.needed = args.batch_size
    while len(step.kept) < args.batch_size:
        if len(step.kept) + len(step.pending) < args.batch_size:  # slime: (submitted - dropped) < batch_size
            for group in data_source.get_groups(args.over_sampling_batch_size):
                task = _generate_group(args, semaphore, group, args.sampling_params, **call)
                step.pending.append(asyncio.create_task(task))
                step.submitted += 1
        _report(args, step)
        if not step.pending:  # a bounded source (train.num_epoch) serves every group of the run, no more
            raise RuntimeError(
                f"rollout {rollout_id}: the data source ran out with {len(step.kept)} of rollout.batch_size="
                f"{args.batch_size} groups kept: the run's prompts (train.num_epoch) are spent; a filter dropped "
                "groups the run needed"
            )
        if args.sampling_seed is not None:  # deterministic: the oldest group first, whenever it finishes
            await asyncio.wait(step.pending[:1])
            done = step.pending[:1]
        else:
            finished, _ = await asyncio.wait(step.pending, return_when=asyncio.FIRST_COMPLETED)
            done = [t for t in step.pending if t in finished]
        step.pending = [t for t in step.pending if t not in done]
        for task in done:
            group = task.result()
            if len(step.kept) >= args.batch_size:
                step.pending.insert(0, task)  # finished after the batch filled: a leftover like the rest
            elif _judge(args, group, step):
                step.kept.append(group)
        _report(args, step)
    return step


def _return_leftovers(args: RolloutContext, data_source, leftovers: list[list[Sample]], rollout_id: int) -> None:
    """Put the cut groups back in the buffer: as they are (partial rollout) or reset to fresh prompts."""
    if args.config.partial_rollout:
        for sample in (s for g in leftovers for s in g):
            sample.metadata.setdefault("start_rollout_id", rollout_id)
    else:
        leftovers = [[reset_sample(s) for s in g] for g in leftovers]
    leftovers.sort(key=lambda g: g[0].index)
    data_source.add_groups(leftovers)


def reset_sample(sample: Sample) -> Sample:
    """The sample as its data source made it: no response, no reward, PENDING."""
    return dataclasses.replace(
        sample,
        tokens=[],
        response="",
        response_length=0,
        loss_mask=None,
        rollout_log_probs=None,
        reward=None,
        status=SampleStatus.PENDING,
        weight_versions=[],
        token_versions=None,
        error=None,
        remove_sample=False,
    )


def _step_metrics(step: _Step, leftovers: list[list[Sample]], seconds: float) -> dict[str, float]:
    """Filter drops (deterministic), and the timing-dependent counts and speeds under perf/."""
    generated = [s for g in [*step.kept, *leftovers] for s in g]
    tokens = sum(s.response_length for s in generated)
    metrics = {f"rollout/dynamic_filter/{reason}": float(count) for reason, count in step.drops.items()}
    metrics.update(
        {
            "rollout/groups_submitted": float(step.submitted),
            "perf/rollout_time": seconds,
            "perf/rollout_tokens": float(tokens),
            "perf/rollout_tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "perf/rollout_leftover_groups": float(len(leftovers)),
            "perf/rollout_aborted_samples": float(sum(s.status == SampleStatus.ABORTED for s in generated)),
        }
    )
    return metrics


async def _train_rollout(args: RolloutContext, rollout_id: int, data_source) -> RolloutOutput:
    start = time.perf_counter()
    semaphore = asyncio.Semaphore(args.max_in_flight)
    connector = aiohttp.TCPConnector(limit=args.max_in_flight)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        args.session, args.aborted = session, False
        step = await _train(args, data_source, rollout_id, semaphore)
        keep_whole = args.config.partial_rollout and args.sampling_seed is not None
        leftovers = await _drain(args, step.pending, abort=not keep_whole)
        args.session = None
    _return_leftovers(args, data_source, leftovers, rollout_id)
    step.kept.sort(key=lambda g: g[0].index)
    return RolloutOutput(groups=step.kept, metrics=_step_metrics(step, leftovers, time.perf_counter() - start))


async def _eval_dataset(args: RolloutContext, dataset: EvalDataset, semaphore, rollout_id: int) -> list[list[Sample]]:
    args = dataclasses.replace(args, rm_type=dataset.rm_type, reward_key=dataset.reward_key)
    groups = dataset.source.get_groups(dataset.num_prompts)
    call = dict(rollout_id=rollout_id, evaluation=True)
    tasks = [_generate_group(args, semaphore, g, dataset.sampling_params, **call) for g in groups]
    return list(await asyncio.gather(*tasks))


async def _eval_rollout(args: RolloutContext, rollout_id: int) -> EvalOutput:
    semaphore = asyncio.Semaphore(args.max_in_flight)
    connector = aiohttp.TCPConnector(limit=args.max_in_flight)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        args.session, args.aborted = session, False
        results = await asyncio.gather(*(_eval_dataset(args, d, semaphore, rollout_id) for d in args.eval_datasets))
        args.session = None
    datasets = {d.name: groups for d, groups in zip(args.eval_datasets, results)}
    return EvalOutput(datasets=datasets)


def generate_rollout(
    args: RolloutContext, rollout_id: int, data_source, evaluation: bool = False
) -> RolloutOutput | EvalOutput:
    """Run one rollout (train) or eval synchronously, an event loop per call; see the module docstring."""
    if evaluation:
        return asyncio.run(_eval_rollout(args, rollout_id))
    return asyncio.run(_train_rollout(args, rollout_id, data_source))
