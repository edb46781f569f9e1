"""Create what the config says is made on first use: the tiny model (or a model imported from a GGUF file), the
same for the distillation teacher, and synthetic prompt files."""

from __future__ import annotations

import logging
from pathlib import Path

from slime.assets.check import generates_checkpoint, generator_outputs
from slime.assets.files import creation_lock
from slime.assets.generators import GENERATOR_SHAPE, generated_file
from slime.assets.made import is_made
from slime.config.hooks import load_callable
from slime.config.schema import ModelConfig, RunConfig

logger = logging.getLogger(__name__)


def prepare_assets(cfg: RunConfig) -> list[str]:
    """Build missing generated assets; return the paths created (empty when all existed).

    A data generator writes only its own `path`, and only when the run reads that very file
    (prompt_data == generator.path): a prompt_data pointing elsewhere is never created here.
    """
    created = []
    for model in (cfg.model, cfg.teacher):
        if model is not None and generates_checkpoint(model) and not is_made(model) and _make_model(model):
            created.append(model.hf_checkpoint)
    for key, prompt_data, generator in generator_outputs(cfg):
        path = generated_file(prompt_data, generator)
        if path is None or Path(path).exists():
            continue
        with creation_lock(path):  # runs starting together write it once, never under a reader
            if not Path(path).exists():
                load_callable(generator, key=key, **GENERATOR_SHAPE)()  # path and the rest are bound in the node
                created.append(path)
    for path in created:
        logger.info("created %s", path)
    return created


def _make_model(model: ModelConfig) -> bool:
    """Generate or import `model` (a run starting beside this one may have just made it: then False)."""
    # torch and transformers take ~9 CPU-seconds to import: only the run that makes a model loads them here
    from slime.assets import gguf_import, tiny_model

    ensure = tiny_model.ensure_tiny_model if model.import_gguf is None else gguf_import.ensure_imported_model
    return ensure(model)
