"""Data generators (`data.generator`, `eval.datasets.<name>.generator`): `_target_` nodes that write one file.

slime/assets/prepare.py calls each as `fn()` (its `path` and other keys are bound in the node) before the run
starts; slime/assets/check.py loads each with that shape during validation.
"""

from __future__ import annotations

from typing import Any, Optional

GENERATOR_SHAPE = dict(signature=(), may_be_async=False)


def generated_file(prompt_data: Optional[str], generator: Any) -> Optional[str]:
    """The file a data generator will write for this run: its own `path`, when prompt_data is exactly that
    path; None otherwise (the generator then runs for nothing and writes nothing)."""
    if prompt_data is None or not isinstance(generator, dict) or generator.get("path") != prompt_data:
        return None
    return prompt_data
