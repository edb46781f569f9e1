"""Keeping secrets out of every sink: config keys, CLI overrides and environment values.

A value is secret when its key's last dotted component matches *key*, *token*, *secret* or *password*
(case-insensitive: `api_key`, `HF_TOKEN`, `db_password`, ...) and the value is text: credentials are
strings, so `max_tokens_per_gpu: 8192` or `stop_token_ids: [2]` stay visible. The data keys that name
record fields (`input_key`, `label_key`, ...) are no secrets. Secret values become `REDACTED`, and any
string containing the value of a secret environment variable (8+ characters) has that value replaced
too, so a token pasted into another field does not leak either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from slime.config.secret_keys import REDACTED, is_secret_key

__all__ = ["REDACTED", "is_secret_key", "redact", "redact_overrides", "scrub", "secret_env_values"]


def _is_secret(key: str, value: Any) -> bool:
    if not is_secret_key(key) or not isinstance(value, str) or not value:
        return False
    try:  # numbers and booleans given as text (CLI overrides) are no credentials
        float(value)
        return False
    except ValueError:
        return value.lower() not in ("true", "false", "null", "none")


def secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of secret-named environment variables long enough to be credentials, longest first."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if _is_secret(k, v) and len(v) >= 8}
    return sorted(values, key=len, reverse=True)


def scrub(value: str, secrets: list[str]) -> str:
    for secret in secrets:
        value = value.replace(secret, REDACTED)
    return value


def redact(obj: Any, secrets: list[str] | None = None) -> Any:
    """A copy of nested dicts/lists with secret keys' values and secret env values replaced."""
    secrets = secret_env_values() if secrets is None else secrets
    if isinstance(obj, Mapping):
        return {k: REDACTED if _is_secret(k, v) else redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        return scrub(obj, secrets)
    return obj


def redact_overrides(overrides: list[str], secrets: list[str] | None = None) -> list[str]:
    """CLI overrides (`key=value`, `+key=value`, `~key`) with secret keys' values replaced."""
    secrets = secret_env_values() if secrets is None else secrets
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and _is_secret(key, value):
            value = REDACTED
        out.append(scrub(f"{key}{sep}{value}", secrets))
    return out
