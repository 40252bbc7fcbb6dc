"""Which trainer reads which prompt shards: chat messages (placements before / after / system) or text
rendered with the policy's chat template (placement assistant: the hint opens the answer).

- OpenRLHF 0.11.2 reads text prompts as they are without ``--data.apply_chat_template``
  (`PromptDataset` then takes the ``prompt`` column verbatim and `SingleTurnAgentExecutor`
  tokenizes it without added special tokens); with the flag it would wrap the text in a new
  user turn. `openrlhf_data_flags` gives the flags for a round's shards.
- TRL 1.16's GRPOTrainer reads a string prompt as a standard (non-conversational) prompt:
  tokenized as it is, no chat template.
- verl 0.9.1 cannot: `RLHFDataset` hands ``prompt`` on as messages and every agent loop renders
  them through the Continuous Token builder with ``add_generation_prompt=True``
  (``verl/utils/tokenizer/continuous_token.py``), which has no open-answer form; a string
  prompt is not messages. `check_readable` refuses such shards for verl.

Template variables (``chat_template_kwargs``: Qwen3's ``enable_thinking``, ...) must be the same in the
prompts and in the trainer: `mentor build` records its own in the shards' ``manifest.json``
(placement assistant renders every prompt with them), TRL takes ``chat_template_kwargs`` (a
``GRPOConfig`` field), verl ``data.apply_chat_template_kwargs``, mentor's offline rollouts
``rollout.chat_template_kwargs``; OpenRLHF 0.11.2 has no such setting (its ``PromptDataset`` renders
chat prompts with the template's defaults). `check_template_kwargs` refuses a round whose two
differ, or chat prompts built with variables for OpenRLHF; a workflow's build takes the trainer's
(`trainer_template_kwargs`) when it sets none.

The workflow runner and `workflows.config` use these, and so do the launchers (`mentor train`): the
OpenRLHF one picks its data flags with `openrlhf_data_flags`, the verl one refuses text shards.
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

# Trainers a workflow hands text prompts to (mentor's own offline rollouts send them as they are; mentor's
# OpenRLHF launch leaves out --data.apply_chat_template for them, `openrlhf_data_flags`).
TEXT_READERS = ("offline", "trl", "openrlhf")
# Trainers that need chat messages.
MESSAGE_ONLY = ("verl",)
VERL_WHY = ("verl 0.9.1 renders every prompt from chat messages with add_generation_prompt=True (its agent loop's "
            "Continuous Token builder), so it cannot continue an answer opened with the hint")


def prompt_files_are_text(sources: Sequence[str]) -> bool:
    """Whether prompt shards (files, folders, globs) hold pre-rendered text prompts."""
    paths: list[Path] = []
    for source in sources:  # an existing path as it is (its name may hold glob characters), else a pattern
        p = Path(source)
        paths += [p] if p.is_file() else sorted(p.glob("part-*.parquet")) if p.is_dir() else resolve_inputs([source])
    paths = [p for p in paths if p.suffix == ".parquet"]
    return bool(paths) and prompts_are_text(read_parquet_schema(paths[0]))


def check_readable(kind: str, sources: Sequence[str]) -> None:
    """`ConfigError` when trainer `kind` cannot read these prompt shards (verl and text prompts)."""
    if kind in MESSAGE_ONLY and prompt_files_are_text(sources):
        raise ConfigError(f"prompts {', '.join(map(str, sources))}: built with placement assistant (text prompts); {VERL_WHY}. "
                          "Rebuild them with `mentor build --placement after` (or before/system) for verl")


def openrlhf_data_flags(sources: Sequence[str]) -> list[str]:
    """OpenRLHF's prompt-data flags for these shards: the chat template only for chat-message prompts."""
    flags = ["--data.input_key", "prompt", "--data.label_key", "label"]
    return flags if prompt_files_are_text(sources) else [*flags, "--data.apply_chat_template"]


# Where each trainer takes the template variables (None: it has no such setting).
TEMPLATE_KWARGS_KEY = {"trl": "chat_template_kwargs", "verl": "overrides.data.apply_chat_template_kwargs",
                       "offline": "rollout.chat_template_kwargs", "openrlhf": None}


def trainer_template_kwargs(kind: str, config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The template variables a trainer's round config passes to the chat template (None: it sets none)."""
    config = config or {}
    if kind == "trl":
        value = config.get("chat_template_kwargs")
    elif kind == "verl":  # whole, or key by key (+data.apply_chat_template_kwargs.enable_thinking=false)
        key = "data.apply_chat_template_kwargs"
        overrides = {str(k).lstrip("+~"): v for k, v in (config.get("overrides") or {}).items()}
        value = overrides.get(key)
        keys = {k[len(key) + 1:]: v for k, v in overrides.items() if k.startswith(key + ".")}
        if keys:
            if isinstance(value, str):
                value = _json_mapping(kind, value)
            value = {**(value or {}), **keys}
    elif kind == "offline":
        value = (config.get("rollout") or {}).get("chat_template_kwargs")
    else:
        return None
    if isinstance(value, str):  # TRL and Hydra take a JSON text too
        value = _json_mapping(kind, value)
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(f"{TEMPLATE_KWARGS_KEY[kind]}: {value!r} is not a mapping of template variables "
                          "(e.g. {enable_thinking: false})")
    return dict(value) if value else None


def _json_mapping(kind: str, value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        raise ConfigError(f"{TEMPLATE_KWARGS_KEY[kind]} {value!r}: not a mapping (write e.g. {{enable_thinking: false}})") from None


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
    would think and the other not), or OpenRLHF gets chat prompts built with variables it cannot pass."""
    built = built_template_kwargs(sources)
    if built is None:
        return
    where = f"prompts {', '.join(map(str, sources))}"
    if kind == "openrlhf":
        if built and not prompt_files_are_text(sources):
            raise ConfigError(f"{where}: built with chat_template_kwargs {built}, but OpenRLHF 0.11.2 renders chat prompts "
                              "with its template's defaults (it has no setting for template variables); build them with "
                              "placement assistant (mentor renders every prompt with the variables) or without "
                              "chat_template_kwargs")
        return
    mine = dict(trainer_kwargs or {})
    if mine != built:
        raise ConfigError(f"{where}: built with chat_template_kwargs {built}, but the trainer passes {mine} "
                          f"({TEMPLATE_KWARGS_KEY.get(kind)}); set the same variables in both (build's "
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


def text_prompts_refused(kind: str) -> str | None:
    """Why a workflow's trainer `kind` cannot be given text prompts (None: it can, or it is not mentor's to say)."""
    return {"verl": VERL_WHY}.get(kind)


__all__ = ["MESSAGE_ONLY", "TEMPLATE_KWARGS_KEY", "TEXT_READERS", "built_template_kwargs", "check_template_kwargs",
           "sampling_template_kwargs",
           "trainer_template_kwargs", "text_prompts_refused", "check_readable", "openrlhf_data_flags", "prompt_files_are_text"]
