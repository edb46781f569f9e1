"""The rewards hub: which reward function scores a sample, and what happens when it fails.

Selection order (docs/data-and-rewards.md#rewards): per-sample `metadata.custom_rm_path` -> `rollout.custom_rm_path`
-> `metadata.rm_type` -> `rollout.rm_type` (eval datasets pass their own rm_type). Call shapes (as
slime's): a custom reward is `rm(args, sample) -> float | dict`, or with `rollout.group_rm` one call per
group `rm(args, samples) -> list[float | dict]` (def or async def; `args` is what the rollout function
passes, the RolloutContext). Built-in types are `fn(response, label, metadata) -> float | dict`,
registered in `slime.registry.REWARD_TYPES`; `remote_rm` asks the HTTP reward model at `rollout.rm_url`.

A reward function that raises, returns NaN or returns something that is neither a number nor a dict
marks its sample FAILED with `sample.error` saying why; the sample gets reward 0.0 and
`remove_sample` (no loss of its own), so its group still has n samples. `check_failures` fails the
rollout step when more than `rollout.reward.max_failure_ratio` of its samples failed.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
from collections.abc import Callable
from typing import Any, Optional

from slime.config.hooks import load_callable
from slime.registry import REWARD_TYPES
from slime.rollout.rm.remote import RemoteRewardModel
from slime.types import Sample, SampleStatus

GROUP_RM_SHAPE = ("args", "samples")
# What a user's reward may raise and only fail its samples: sys.exit() inside a reward must not end the rollout
# (asyncio re-raises SystemExit out of the event loop); Ctrl-C still stops the run.
USER_ERRORS = (Exception, SystemExit)
SAMPLE_RM_SHAPE = ("args", "sample")


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def exact_match(response: str, label: str, metadata: Optional[dict] = None) -> float:
    """1.0 iff the whitespace-normalised, lower-cased response equals the label."""
    return float(_normalize(response) == _normalize(label))


def first_word(response: str, label: str, metadata: Optional[dict] = None) -> float:
    """1.0 iff the first whitespace-separated word of the response equals the label (case-insensitive)."""
    words = _normalize(response).split(" ")
    return float(bool(words) and words[0] == _normalize(label))


class RewardFailureError(RuntimeError):
    """Too many samples of one rollout step failed their reward."""


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    result = fn(*args)
    return await result if inspect.isawaitable(result) else result


def checked_reward(value: Any, reward_key: Optional[str]) -> float | dict[str, Any]:
    """`value` as a reward: a finite real number (bools and numpy scalars included) as float, or a dict whose
    `reward_key` holds one; else ValueError saying why (NaN and infinities too)."""
    if isinstance(value, dict):
        if reward_key is None or reward_key not in value:
            raise ValueError(
                f"the reward function returned a dict with keys {sorted(map(str, value))}; set rollout.reward_key "
                f"to the one holding the reward (got {reward_key!r})"
            )
        scalar = value[reward_key]
    else:
        scalar = value
    if not isinstance(scalar, numbers.Real):
        raise ValueError(f"the reward function returned {type(value).__name__} {value!r}; expected a number or dict")
    if math.isnan(scalar):
        raise ValueError(f"the reward function returned NaN ({value!r})")
    if math.isinf(scalar):
        raise ValueError(f"the reward function returned an infinite reward ({value!r})")
    return float(value) if not isinstance(value, dict) else value


class RewardHub:
    """Scores samples for a rollout: built-in types, custom functions, the remote reward model."""

    def __init__(
        self,
        *,
        rm_type: Optional[str],
        custom_rm_path: Optional[Any],
        group_rm: bool = False,
        reward_key: Optional[str] = None,
        rm_url: Optional[str] = None,
        remote_options: Optional[dict[str, Any]] = None,  # RemoteRewardModel keyword arguments
    ):
        self.rm_type, self.custom_rm_path, self.group_rm = rm_type, custom_rm_path, group_rm
        self.reward_key, self.rm_url = reward_key, rm_url
        self.remote_options = dict(remote_options or {})
        self._loaded: dict[str, Callable[..., Any]] = {}
        self._remote = None

    @classmethod
    def from_config(cls, rollout) -> RewardHub:
        """From a `RolloutConfig` (rm_type, custom_rm_path, group_rm, reward_key, rm_url, reward.*)."""
        r = rollout.reward
        options = dict(timeout_s=r.timeout_s, max_retries=r.max_retries, max_connections=r.max_connections)
        return cls(
            rm_type=rollout.rm_type,
            custom_rm_path=rollout.custom_rm_path,
            group_rm=rollout.group_rm,
            reward_key=rollout.reward_key,
            rm_url=rollout.rm_url,
            remote_options=options,
        )

    async def reward_group(self, args: Any, group: list[Sample], *, rm_type: Optional[str] = None) -> None:
        """Set `reward` on every sample of `group` that needs one (not ABORTED, not yet rewarded).

        With `group_rm`, one call of the custom function for the whole group; a failure fails them all.
        """
        todo = [s for s in group if s.reward is None and s.status != SampleStatus.ABORTED]
        if not todo:
            return
        if self.group_rm:
            try:
                values = await _call(self._load(self.custom_rm_path, "rollout.custom_rm_path"), args, todo)
                if not isinstance(values, (list, tuple)) or len(values) != len(todo):
                    raise ValueError(f"the group reward function must return a list of {len(todo)} rewards")
                rewards = [checked_reward(v, self.reward_key) for v in values]
            except USER_ERRORS as exc:
                for sample in todo:
                    mark_failed(sample, exc)
                return
            for sample, reward in zip(todo, rewards):
                sample.reward = reward
            return
        for sample in todo:
            await self.reward_sample(args, sample, rm_type=rm_type)

    async def reward_sample(self, args: Any, sample: Sample, *, rm_type: Optional[str] = None) -> None:
        """Set `sample.reward`, or mark the sample FAILED with the error."""
        try:
            sample.reward = checked_reward(await self._compute(args, sample, rm_type), self.reward_key)
        except USER_ERRORS as exc:  # a user's reward function may raise anything; the run decides on the ratio
            mark_failed(sample, exc)

    async def _compute(self, args: Any, sample: Sample, rm_type: Optional[str]) -> Any:
        custom = sample.metadata.get("custom_rm_path") or self.custom_rm_path
        if custom:
            return await _call(self._load(custom, "rollout.custom_rm_path"), args, sample)
        name = sample.metadata.get("rm_type") or rm_type or self.rm_type
        if name == "remote_rm":
            return await self._remote_model().score(sample)
        if name not in REWARD_TYPES:
            raise ValueError(REWARD_TYPES.unknown_message(name))
        if sample.label is None:
            raise ValueError(f"no label; rm_type={name!r} compares the response with the label")
        return REWARD_TYPES.load(name)(sample.response, str(sample.label), sample.metadata)

    def _load(self, spec: Any, key: str) -> Callable[..., Any]:
        cache_key = repr(spec)
        if cache_key not in self._loaded:
            self._loaded[cache_key] = load_callable(spec, key=key)
        return self._loaded[cache_key]

    def _remote_model(self):
        if self._remote is None:
            if not self.rm_url:
                raise ValueError("rm_type='remote_rm' needs rollout.rm_url")
            self._remote = RemoteRewardModel(self.rm_url, **self.remote_options)
        return self._remote

    def remote_metrics(self, scope: str) -> dict[str, float]:
        """`<scope>/reward_retries` and `<scope>/reward_gave_up` of the remote reward model since the last call
        (retried attempts; requests failed after every retry, which the failure ratio then judges); {} without
        one."""
        if self._remote is None:
            return {}
        counts = self._remote.take_counts()
        return {
            f"{scope}/reward_retries": float(counts["retries"]),
            f"{scope}/reward_gave_up": float(counts["gave_up"]),
        }

    def close(self) -> None:
        if self._remote is not None:
            self._remote.close()
            self._remote = None


def mark_failed(sample: Sample, exc: BaseException) -> None:
    """FAILED with the error recorded; reward 0.0 and no loss of its own (its group keeps n samples)."""
    sample.status = SampleStatus.FAILED
    sample.error = f"reward: {type(exc).__name__}: {exc}"
    sample.reward = 0.0
    sample.remove_sample = True


def check_failures(samples: list[Sample], max_failure_ratio: float, *, scope: str = "rollout") -> dict[str, float]:
    """`<scope>/reward_failed` and `<scope>/reward_failed_ratio` (scope: `rollout`, or `eval/<dataset>`, which the
    same rule holds: a broken reward is never read as a score); RewardFailureError when more than
    `max_failure_ratio` of `samples` failed their reward."""
    # an agent episode that raised or timed out (slime.rollout.agent.episode) is judged as a failed reward
    failed = [
        s for s in samples if s.status == SampleStatus.FAILED and (s.error or "").startswith(("reward:", "agent:"))
    ]
    ratio = len(failed) / len(samples) if samples else 0.0
    if ratio > max_failure_ratio:
        examples = "; ".join(f"sample {s.index}: {s.error}" for s in failed[:3])
        where = f"eval dataset {scope.removeprefix('eval/')!r}: " if scope.startswith("eval/") else ""
        raise RewardFailureError(
            f"{where}{len(failed)} of {len(samples)} samples ({ratio:.1%}) failed their reward or agent episode, more than "
            f"rollout.reward.max_failure_ratio={max_failure_ratio}. First errors: {examples}"
        )
    return {f"{scope}/reward_failed": float(len(failed)), f"{scope}/reward_failed_ratio": ratio}
