"""Which config keys hold credentials: a key whose last dotted component matches *key*, *token*, *secret* or
*password* (case-insensitive), except the data keys that name record fields. slime/tracking/secrets.py redacts
them in every sink; a `Problem` never echoes their values."""

from __future__ import annotations

import re

REDACTED = "<redacted>"
_SECRET = re.compile(r"key|token|secret|password", re.IGNORECASE)
# Keys that match the pattern but name no secret (config fields of this project).
_NOT_SECRET = {"input_key", "label_key", "metadata_key", "reward_key", "tool_key"}


def is_secret_key(key: str) -> bool:
    """True for a (dotted) key whose last component looks like it names a credential."""
    last = str(key).rsplit(".", 1)[-1].lstrip("+~")
    return last not in _NOT_SECRET and bool(_SECRET.search(last))
