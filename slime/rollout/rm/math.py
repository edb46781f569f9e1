"""Math rewards: `math`, `deepscaler`, `dapo`.

Equivalence goes through math-verify (HuggingFace's maintained LaTeX/sympy answer checker), not home-grown
string rules. math-verify's own timeout uses SIGALRM, which only works on a process's main thread; off
it (a threaded caller) the check runs without that timeout.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Optional

from math_verify import parse, verify

TIMEOUT_S = 5  # per parse / comparison, main thread only
_BOX_OPENERS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> Optional[str]:
    r"""The content of the LAST `\boxed{...}` (or `\fbox{...}`, `\boxed x`) in `text`, braces balanced; None if none."""
    start = max(text.rfind(opener) for opener in _BOX_OPENERS)
    if start < 0:
        return None
    rest = text[start:]
    opener = next(o for o in _BOX_OPENERS if rest.startswith(o))
    rest = rest[len(opener) :]
    if rest.startswith(" "):  # `\boxed 5`
        return rest[1:].split("$")[0].strip() or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return rest[1:i]
    return None  # unbalanced


def equivalent(gold: str, pred: str) -> bool:
    """Whether two final answers (LaTeX or plain) are mathematically equal, by math-verify."""
    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
    pred_parsed = parse(f"\\boxed{{{pred}}}", parsing_timeout=timeout)
    if not gold_parsed or not pred_parsed:  # nothing math-verify can read: only an identical answer counts
        return gold.strip() == pred.strip()
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


def math_reward(response: str, label: str, metadata: Optional[dict] = None) -> float:
    r"""1.0 iff the response's last `\boxed{}` equals the label (itself unboxed if boxed); no box: 0."""
    pred = last_boxed(response)
    if pred is None:
        return 0.0
    gold = last_boxed(label) if "\\boxed" in label or "\\fbox" in label else label
    return float(equivalent(gold or label, pred))


def deepscaler_reward(response: str, label: str, metadata: Optional[dict] = None) -> float:
    """DeepScaleR: grade only the text after `</think>` (or `###Response`); without either marker, 0."""
    for marker in ("</think>", "###Response"):
        if marker in response:
            return math_reward(response.split(marker, 1)[1], label)
    return 0.0


_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def _normalize_final_answer(answer: str) -> str:
    """DAPO's answer normalisation (after Minerva): unbox, drop `$`, spaces, thousands commas, a trailing dot."""
    answer = answer.strip()
    boxed = last_boxed(answer)
    if boxed is not None:
        answer = boxed
    answer = re.sub(r"\\text\{\s*([^}]*)\}", r"\1", answer)
    for token in ("$", "\\!", "\\,", "\\ ", " "):
        answer = answer.replace(token, "")
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    answer = re.sub(r"(\d),(?=\d{3}(\D|$))", r"\1", answer)
    return answer.rstrip(".")


def dapo_reward(response: str, label: str, metadata: Optional[dict] = None) -> dict[str, Any]:
    """DAPO: the last `Answer: X` in the final 300 characters, normalised, must equal the label.

    Returns `{score: 1.0 | -1.0, acc: bool, pred: str}`; pick the scalar with `rollout.reward_key=score`.
    """
    matches = _ANSWER.findall(response[-300:])
    pred = _normalize_final_answer(matches[-1]) if matches else ""
    acc = bool(pred) and pred == _normalize_final_answer(label)
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}
