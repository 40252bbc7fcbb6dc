"""Which trainer reads which prompt shards: chat messages (placements before / after / system) or text
rendered with the policy's chat template (placement assistant: the hint opens the answer).

Each trainer says it in its launcher (`mentor.training.launcher.LauncherBase`): whether it reads text
prompts (``text_prompts_refused``: why not; OpenRLHF 0.11.2 without ``--data.apply_chat_template`` and
TRL 1.16 read them as they are, verl 0.9.1 cannot) and where its round config takes the chat template's
variables (``template_kwargs_key``, ``template_kwargs``). What is asked here is asked of the launchers;
the train stage's own kinds (mentor's offline rollouts, an external trainer) answer for themselves
(`mentor.stages.train.OwnKind`).

Template variables (``chat_template_kwargs``: Qwen3's ``enable_thinking``, ...) must be the same in the
prompts and in the trainer: `mentor build` records its own in the shards' ``manifest.json``
(placement assistant renders every prompt with them). `check_template_kwargs` refuses a round whose
two differ, or chat prompts built with variables for a trainer that has no such setting (it renders
chat prompts with its template's defaults); a workflow's build takes the trainer's
(`trainer_template_kwargs`) when it sets none.

The workflow runner and `workflows.config` use these, and so do the launchers (`mentor train`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import read_parquet_schema
from mentor.pipeline.schemas import prompts_are_text
from mentor.training.launcher import get_launcher, trainer_kinds

def text_prompts_refused(kind: str) -> str | None:
    """Why a workflow's trainer `kind` cannot be given text prompts (None: it can, or it is not mentor's to say)."""
    return get_launcher(kind).text_prompts_refused if kind in trainer_kinds() else None


def prompt_files_are_text(sources: Sequence[str]) -> bool:
    """Whether prompt shards (files, folders, globs) hold pre-rendered text prompts."""
    paths: list[Path] = []
    for source in sources:  # an existing path as it is (its name may hold glob characters), else a pattern
        p = Path(source)
        paths += [p] if p.is_file() else sorted(p.glob("part-*.parquet")) if p.is_dir() else resolve_inputs([source])
    paths = [p for p in paths if p.suffix == ".parquet"]
    return bool(paths) and prompts_are_text(read_parquet_schema(paths[0]))


def check_readable(kind: str, sources: Sequence[str]) -> None:
    """`ConfigError` when trainer `kind` cannot read these prompt shards (text prompts for one that reads only messages)."""
    why = text_prompts_refused(kind)
    if why and prompt_files_are_text(sources):
        raise ConfigError(f"prompts {', '.join(map(str, sources))}: built with placement assistant (text prompts); {why}. "
                          f"Rebuild them with `mentor build --placement after` (or before/system) for {kind}")


def template_kwargs_key(kind: str) -> str | None:
    """Where trainer `kind`'s round config takes the template variables (None: it has no such setting)."""
    return get_launcher(kind).template_kwargs_key if kind in trainer_kinds() else None


def trainer_template_kwargs(kind: str, config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The template variables a trainer's round config passes to the chat template (None: it sets none)."""
    if kind not in trainer_kinds():
        return None
    return kwargs_mapping(template_kwargs_key(kind), get_launcher(kind).template_kwargs(config or {}))


def kwargs_mapping(where: str | None, value: Any) -> dict[str, Any] | None:
    """Template variables as given in setting `where` (a mapping, or JSON text) as a dict (None: none); a `ConfigError`
    naming `where` when they are not a mapping."""
    if isinstance(value, str):  # TRL and Hydra take a JSON text too
        value = json_mapping(where, value)
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {value!r} is not a mapping of template variables (e.g. {{enable_thinking: false}})")
    return dict(value) if value else None


def json_mapping(where: str | None, value: str) -> Any:
    """Template variables given as JSON text in setting `where`; a `ConfigError` naming it when it is not JSON."""
    try:
        return json.loads(value)
    except ValueError:
        raise ConfigError(f"{where} {value!r}: not a mapping (write e.g. {{enable_thinking: false}})") from None


def built_template_kwargs(sources: Sequence[str]) -> dict[str, Any] | None:
    """The template variables `mentor build` rendered and counted these shards with (their folder's manifest.json;
    None: not recorded, e.g. shards from before the setting or from elsewhere)."""
    for source in sources:
        p = Path(source)
        manifest = (p if p.is_dir() else p.parent) / "manifest.json"
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("chat_template_kwargs"), dict):
            return data["chat_template_kwargs"]
    return None


def check_template_kwargs(kind: str, sources: Sequence[str], trainer_kwargs: Mapping[str, Any] | None) -> None:
    """`ConfigError` when the prompts were built with other template variables than the trainer passes (one arm
    would think and the other not), or a trainer with no such setting gets chat prompts built with variables."""
    built = built_template_kwargs(sources)
    if built is None:
        return
    where = f"prompts {', '.join(map(str, sources))}"
    if kind in trainer_kinds() and get_launcher(kind).template_kwargs_key is None:
        if built and not prompt_files_are_text(sources):
            raise ConfigError(f"{where}: built with chat_template_kwargs {built}, but {get_launcher(kind).name} renders chat "
                              "prompts with its template's defaults (it has no setting for template variables); build them "
                              "with placement assistant (mentor renders every prompt with the variables) or without "
                              "chat_template_kwargs")
        return
    mine = dict(trainer_kwargs or {})
    if mine != built:
        raise ConfigError(f"{where}: built with chat_template_kwargs {built}, but the trainer passes {mine} "
                          f"({template_kwargs_key(kind)}); set the same variables in both (build's "
                          "--chat-template-kwarg / build.chat_template_kwargs, and the trainer's)")


def sampling_template_kwargs(given: Mapping[str, Any], sources: Sequence[Any]) -> dict[str, Any]:
    """The template variables `mentor rollout` samples chat prompts with: `given` (``--chat-template-kwarg``), else
    those the prompts were built with (their manifest); two that differ are a `ConfigError`."""
    built = built_template_kwargs([str(s) for s in sources])
    if not built or dict(given) == built:
        return dict(given or built or {})
    if not given:
        return dict(built)
    raise ConfigError(f"prompts {', '.join(map(str, sources))}: built with chat_template_kwargs {built}, sampled with "
                      f"{dict(given)} (--chat-template-kwarg); give the same variables, or none to use the build's")


__all__ = ["built_template_kwargs", "check_readable", "check_template_kwargs", "json_mapping", "kwargs_mapping",
           "prompt_files_are_text", "sampling_template_kwargs", "template_kwargs_key", "text_prompts_refused",
           "trainer_template_kwargs"]
