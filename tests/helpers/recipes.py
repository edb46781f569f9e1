"""recipes/ as the tests read it: the recipes, the options each selects and the values it sets, and the command
line that composes a GPU recipe on this CPU machine as a remote launch would."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.helpers.compose import CONF, ROOT, fake_hf_dir
from tests.helpers.images import png_file

RECIPES = ROOT / "recipes"
ALL = sorted(RECIPES.rglob("*.yaml"))
GPU = sorted((RECIPES / "gpu").glob("*.yaml"))


def recipe_name(path: Path) -> str:
    return path.relative_to(RECIPES).with_suffix("").as_posix()


def selected_options(path: Path) -> dict[str, str]:
    """group -> option of the recipe's `override /group: option` defaults (`group@package` keys kept whole)."""
    defaults = yaml.safe_load(path.read_text()).get("defaults", [])
    return {key.split("/", 1)[1]: value for entry in defaults for key, value in entry.items()}


def set_values(path: Path) -> dict:
    """The values the recipe sets itself (its YAML without the defaults list)."""
    values = yaml.safe_load(path.read_text())
    values.pop("defaults", None)
    return values


def flat(values: dict, prefix: str = "") -> dict:
    """{dotted key: value} of nested mappings (an empty mapping is a value of its own)."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def recipe_selecting(group: str, option: str) -> Path:
    """The first recipe whose defaults select `group`=`option`."""
    return next(path for path in ALL if selected_options(path).get(group) == option)


def prompt_file(tmp_path: Path, num_prompts: int = 256) -> str:
    """Records carrying the RL keys (prompt, label), the SFT key (messages) and a vision recipe's (images: one
    image file beside the records); an epoch of them fills a rollout step of every recipe (128 prompts at most)."""
    path = tmp_path / "train.jsonl"
    png_file(tmp_path / "image.png", ["red", None, None, "green"])
    lines = []
    for i in range(num_prompts):
        chat = [{"role": "user", "content": f"What is {i} + 1?"}]
        answer = str(i + 1)
        record = {"prompt": chat, "label": answer, "messages": [*chat, {"role": "assistant", "content": answer}]}
        record["images"] = ["image.png"]
        lines.append(json.dumps(record) + "\n")
    path.write_text("".join(lines))
    return str(path)


def recipe_overrides(path: Path, tmp_path: Path) -> list[str]:
    """`recipe=NAME`, and for a GPU recipe what a launch gives it: an HF directory holding the model's config.json
    (the teacher's too), a prompt file, and a remote cluster (cluster.ray_address=auto: this machine's GPUs and
    files are not checked)."""
    overrides = [f"recipe={recipe_name(path)}"]
    if path.parent == RECIPES:
        return overrides
    options = selected_options(path)
    missing = [f"conf/{g.split('@')[0]}/{o}.yaml" for g, o in options.items() if not _exists(g, o)]
    assert not missing, f"{recipe_name(path)} selects option file(s) that do not exist: {', '.join(missing)}"
    overrides += [
        f"model.hf_checkpoint={fake_hf_dir(tmp_path, options['model'])}",
        f"data.prompt_data={prompt_file(tmp_path)}",
        "cluster.ray_address=auto",  # validated for a remote cluster, not this machine's GPUs
    ]
    if "model@teacher" in options:  # the distillation teacher's own checkpoint
        (tmp_path / "teacher").mkdir()
        overrides.append(f"teacher.hf_checkpoint={fake_hf_dir(tmp_path / 'teacher', options['model@teacher'])}")
    return overrides


def _exists(group: str, option: str) -> bool:
    return (CONF / group.split("@")[0] / f"{option}.yaml").exists()
