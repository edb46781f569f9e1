"""The command line's overrides checked against the config tree before Hydra composes a run.

Hydra answers a mistyped key (`algo.kl_coeff=0.1`) with "To append to your config use +algo.kl_coeff=0.1"
(hydra/_internal/config_loader_impl.py, `_apply_overrides_to_config`), the wrong fix for a typo, and adds a
`+key` to any node; an unknown option of a group gets the list of every option. Here each override, parsed by
Hydra's own OverridesParser, is looked up in Hydra's config repository (a group's options) or in the config
composed from the command line's group choices (a key), and a mistake is answered with the nearest names:

    algo.kl_coeff=0.1: no such key (did you mean algo.kl_coef?). Fix: algo.kl_coef=0.1
    model=qwen3_5b: no such option of group model (did you mean qwen3_8b, qwen3_4b, qwen3_1_7b?). Fix: ...

A key under a free-form dict (`rollout.sglang.*`, `parallelism.megatron.*`, `data.generator.*`, ...) is
the user's to add with `+` (its own validation checks it later); a dataclass node has exactly its fields.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator

from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from omegaconf import DictConfig, OmegaConf

from slime.config.secret_keys import REDACTED, is_secret_key

LISTED_OPTIONS = 12  # a fix names this many of a group's options, then how many more there are


@dataclasses.dataclass(frozen=True)
class OverrideProblem:
    """One command-line override that cannot be applied: `override` as typed (a secret's value redacted),
    `message` what is wrong, `fix` the override to type instead; `line` the override exactly as typed."""

    override: str
    message: str
    fix: str
    line: str = dataclasses.field(default="", repr=False)

    def __str__(self) -> str:
        return f"{self.override}: {self.message}. Fix: {self.fix}"


def parse(lines: list[str]) -> list[Override]:
    """Hydra's own parse of the command line's overrides (OverrideParseException on bad syntax)."""
    return OverridesParser.create().parse_overrides(lines)


def searched_repository(loader, config_name: str, overrides: list[Override]):
    """Hydra's config repository with the command line's `hydra.searchpath` (a folder of the user's own options)
    among its sources, as Hydra's composition builds it (ConfigLoaderImpl._parse_overrides_and_create_caching_repo,
    hydra/_internal/config_loader_impl.py; `loader` is Hydra's ConfigLoader)."""
    return loader._parse_overrides_and_create_caching_repo(config_name, searchpath_lines(overrides))[1]


def searchpath_lines(overrides: list[Override]) -> list[str]:
    """The command line's `hydra.searchpath=[...]` override, as typed (none or one)."""
    return [o.input_line for o in overrides if o.get_key_element() == "hydra.searchpath"]


def split_groups(overrides: list[Override], repo) -> tuple[list[Override], list[Override]]:
    """(group overrides, key overrides), as Hydra tells them apart: by whether the config repository `repo`
    (`searched_repository`) has a group of that name."""
    groups = [o for o in overrides if repo.group_exists(o.key_or_group)]
    return groups, [o for o in overrides if o not in groups]


def group_problems(groups: list[Override], keys: list[Override], repo) -> list[OverrideProblem]:
    """An unknown option of a group (every choice of a sweep checked), and a `name@package=option` whose
    group does not exist."""
    problems = []
    for override in groups:
        options = group_options(repo, override.key_or_group)
        for choice in _choices(override):
            if choice is not None and choice not in options:
                problems.append(
                    dataclasses.replace(_unknown_option(override, choice, options), line=override.input_line)
                )
    for override in keys:
        if override.package is not None:  # `group@package=option` of a group that does not exist
            names = sorted(_all_groups(repo))
            close = difflib.get_close_matches(override.key_or_group, names, n=3, cutoff=0.6)
            fix = f"{close[0]}@{override.package}={override.get_value_string()}" if close else f"one of {names}"
            message = f"no such group{_did_you_mean(close)}"
            problems.append(OverrideProblem(_shown(override), message, fix, line=override.input_line))
    return problems


def group_options(repo, group: str) -> list[str]:
    """Every option of `group`, those in its subfolders as `sub/option` (recipe=gpu/deepseek_v3_grpo)."""
    options = list(repo.get_group_options(group, results_filter=ObjectType.CONFIG))
    for sub in repo.get_group_options(group, results_filter=ObjectType.GROUP):
        options += [f"{sub}/{option}" for option in group_options(repo, f"{group}/{sub}")]
    return sorted(options)


def analysis_overrides(groups: list[Override]) -> list[str]:
    """The group overrides as one composition takes them: a sweep's first choice (a glob sweep left out)."""
    lines = []
    for override in groups:
        if not override.is_sweep_override():
            lines.append(override.input_line)
        elif override.value_type != ValueType.GLOB_CHOICE_SWEEP:
            prefix = "++" if override.is_force_add() else "+" if override.is_add() else ""
            package = f"@{override.package}" if override.package is not None else ""
            lines.append(f"{prefix}{override.key_or_group}{package}={next(iter(override.sweep_string_iterator()))}")
    return lines


def key_problems(keys: list[Override], tree: DictConfig) -> list[OverrideProblem]:
    """Each key override checked against `tree`, the config composed from the same group choices (with its
    `hydra` node): an unknown key (with or without +), a + onto a key that is set, a ~ of nothing, and a new
    key under a free-form dict without its +."""
    problems = []
    for override in keys:
        if override.package is None and "[" not in override.key_or_group:  # list indices: Hydra's to judge
            problem = _key_problem(override, tree)
            if problem is not None:
                problems.append(dataclasses.replace(problem, line=override.input_line))
    return problems


def _key_problem(override: Override, tree: DictConfig) -> OverrideProblem | None:
    parts = override.key_or_group.split(".")
    node = tree
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
            return None  # under a value that is not a mapping (null, a list): Hydra's own message says why
        if part not in node.keys():
            return _absent(override, node, parts, depth, tree)
        node = node._get_node(part)
    if override.is_add() and not (node._is_none() or node._is_missing()) and not override.is_sweep_override():
        if not isinstance(override.value(), (dict, list)):  # Hydra merges a mapping or list into the key
            return OverrideProblem(
                _shown(override),
                f"{override.key_or_group} is already set; a leading + only adds a key that is not",
                _shown(override, line=override.input_line[1:]),
            )
    return None


def _absent(override: Override, parent: DictConfig, parts: list[str], depth: int, tree: DictConfig):
    """The override names `parts[depth]` under `parent`, which lacks it."""
    parent_key = ".".join(parts[:depth]) or "the config"
    if OmegaConf.get_type(parent) is dict:  # a free-form dict: new keys are the user's, added with +
        if override.is_add() or override.is_force_add():
            return None
        if override.is_delete():
            close = [".".join([*parts[:depth], c]) for c in _close(parts[depth], list(parent.keys()))]
            return OverrideProblem(_shown(override), f"nothing to delete{_did_you_mean(close)}", _fix(override, close))
        return OverrideProblem(
            _shown(override),
            f"{parent_key} holds free-form keys and has no {parts[depth]} yet",
            _shown(override, line=f"+{override.input_line}"),
        )
    siblings = [str(k) for k in parent.keys()]
    close = [".".join([*parts[:depth], c, *parts[depth + 1 :]]) for c in _close(parts[depth], siblings)]
    if not close:  # the right name in another node (train.kl_coef -> algo.kl_coef)
        close = _elsewhere(parts, tree)
    message = f"no such key{_did_you_mean(close)}"
    if close:
        return OverrideProblem(_shown(override), message, _fix(override, close))
    return OverrideProblem(_shown(override), message, f"remove it; the keys of {parent_key}: {_listed(siblings)}")


def _elsewhere(parts: list[str], tree: DictConfig) -> list[str]:
    """Dotted keys anywhere in `tree` (its hydra node only for a hydra key) whose last name is close to the
    override's."""
    by_name: dict[str, list[str]] = {}
    for key in _dotted_keys(tree, "", skip_hydra=parts[0] != "hydra"):
        by_name.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    names = difflib.get_close_matches(parts[-1], list(by_name), n=3, cutoff=0.8)
    return [key for name in names for key in by_name[name]][:3]


def _dotted_keys(node: DictConfig, prefix: str, skip_hydra: bool) -> Iterator[str]:
    for key in node.keys():
        if skip_hydra and not prefix and key == "hydra":
            continue
        child = node._get_node(key)
        yield f"{prefix}{key}"
        if isinstance(child, DictConfig) and not (child._is_none() or child._is_missing()):
            yield from _dotted_keys(child, f"{prefix}{key}.", skip_hydra)


def _close(name: str, choices: list[str]) -> list[str]:
    return difflib.get_close_matches(name, choices, n=3, cutoff=0.6)


def _did_you_mean(close: list[str]) -> str:
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _fix(override: Override, close: list[str]) -> str:
    """The override retyped with the nearest key (a + dropped: that key exists); none near: remove it."""
    if not close:
        return "remove it"
    if override.is_delete():
        return f"~{close[0]}"
    return _shown(override, line=f"{close[0]}={override.get_value_string()}")


def _unknown_option(override: Override, choice: str, options: list[str]) -> OverrideProblem:
    group = override.key_or_group
    close = _close(choice, options)
    listed = _listed(options)
    package = f"@{override.package}" if override.package is not None else ""
    fix = f"{group}{package}={close[0]}" if close else f"{group}{package}=<one of {listed}>"
    if close and len(options) > 1:
        fix += f" (the options: {listed})"
    return OverrideProblem(f"{group}{package}={choice}", f"no such option of group {group}{_did_you_mean(close)}", fix)


def _listed(names: list[str]) -> str:
    """The first LISTED_OPTIONS of `names`, then how many more there are."""
    more = len(names) - LISTED_OPTIONS
    return ", ".join(names[:LISTED_OPTIONS]) + (f", ... ({more} more)" if more > 0 else "")


def _choices(override: Override) -> list[str | None]:
    """The options a group override names: one, or each of a choice/range sweep's (a glob sweep: none)."""
    if override.is_delete():
        return []
    if not override.is_sweep_override():
        return [override.value()]
    if override.value_type == ValueType.GLOB_CHOICE_SWEEP:
        return []
    return list(override.sweep_string_iterator())


def _all_groups(repo, parent: str = "") -> Iterator[str]:
    for group in repo.get_group_options(parent, results_filter=ObjectType.GROUP):
        name = f"{parent}/{group}" if parent else group
        yield name
        yield from _all_groups(repo, name)


def _shown(override: Override, line: str | None = None) -> str:
    """`line` (default: the override as typed), its value redacted when the key names a secret."""
    line = override.input_line if line is None else line
    if is_secret_key(override.key_or_group) and "=" in line:
        return f"{line.split('=', 1)[0]}={REDACTED}"
    return line
