"""Keys the schema does not know: `+train.lr_schedulr=cosine` is a typo, never a silent no-op.

Hydra's `+key=value` adds a key even to a structured config, and OmegaConf.to_object then sets it as a
stray attribute on the dataclass; here every such attribute is reported with the nearest real field.
Free-form dict fields (passthrough args, generator nodes) are not dataclasses and are checked elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from slime.config.problems import Problem, did_you_mean


def check_unknown_keys(cfg: Any, prefix: str = "") -> Iterator[Problem]:
    names = [f.name for f in dataclasses.fields(cfg)]
    for extra in sorted(set(vars(cfg)) - set(names)):
        key = f"{prefix}{extra}"
        yield Problem(
            key,
            getattr(cfg, extra),
            f"no such option{did_you_mean(extra, names)}",
            f"remove +{key}; the options of {prefix.rstrip('.') or 'the run'} are {', '.join(names)}",
        )
    for name in names:
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from check_unknown_keys(value, f"{prefix}{name}.")
