"""Question-answering rewards: `f1` (SQuAD-style token F1) and `gpqa` (multiple-choice letter)."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Optional

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_EXACT_ONLY = ("yes", "no", "noanswer")


def _squad_normalize(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1_reward(response: str, label: str, metadata: Optional[dict] = None) -> float:
    """Token F1 of response vs label after lower-casing and removing punctuation and articles, in [0, 1].

    yes / no / noanswer must match exactly (SQuAD/HotpotQA convention).
    """
    pred, gold = _squad_normalize(response), _squad_normalize(label)
    if (pred in _EXACT_ONLY or gold in _EXACT_ONLY) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


DEFAULT_LETTERS = "ABCDEFGHIJ"


def _valid_letters(metadata: dict) -> str:
    choices = metadata.get("choices")
    if isinstance(choices, (list, dict)) and choices:
        return DEFAULT_LETTERS[: len(choices)] if isinstance(choices, list) else "".join(sorted(map(str, choices)))
    return metadata.get("valid_letters") or DEFAULT_LETTERS


def _correct_letter(label: str, metadata: dict, letters: str) -> Optional[str]:
    for key in ("correct_letter", "answer_letter"):
        if isinstance(metadata.get(key), str) and metadata[key].strip().upper() in letters:
            return metadata[key].strip().upper()
    text = label.strip().strip("()").upper()
    if len(text) == 1 and text in letters:
        return text
    choices = metadata.get("choices")
    if isinstance(choices, list):  # the label is the correct choice's text
        for letter, choice in zip(letters, choices):
            if str(choice).strip() == label.strip():
                return letter
    return None


def chosen_letter(response: str, letters: str) -> Optional[str]:
    """The letter a response picks: "answer is (X)", "X is correct", else its last standalone valid capital."""
    text = response.split("</think>")[-1]
    group = f"[{re.escape(letters)}]"
    # the phrases are case-insensitive, the letter is not ("the answer is a ..." picks nothing)
    for pattern in (
        rf"(?i:answer\s*(?:is|:))\s*\(?\**({group})\b",
        rf"\(?\b({group})\)?\s+(?i:is\s+(?:the\s+)?correct)",
    ):
        found = re.findall(pattern, text)
        if found:
            return found[-1]
    standalone = re.findall(rf"\b({group})\b", text)
    return standalone[-1] if standalone else None


def gpqa_reward(response: str, label: str, metadata: Optional[dict] = None) -> float:
    """1.0 iff the chosen letter is the correct one (metadata `correct_letter`, a letter label, or the choice text)."""
    metadata = metadata or {}
    letters = _valid_letters(metadata)
    correct = _correct_letter(label, metadata, letters)
    if correct is None:
        raise ValueError(f"gpqa: cannot tell the correct letter from label {label!r} (valid letters {letters})")
    return float(chosen_letter(response, letters) == correct)
