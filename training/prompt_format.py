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

The workflow runner and `workflows.config` use these, and so do the launchers (`mentor train`): the
OpenRLHF one picks its data flags with `openrlhf_data_flags`, the verl one refuses text shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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


def text_prompts_refused(kind: str) -> str | None:
    """Why a workflow's trainer `kind` cannot be given text prompts (None: it can, or it is not mentor's to say)."""
    return {"verl": VERL_WHY}.get(kind)


__all__ = ["MESSAGE_ONLY", "TEXT_READERS", "text_prompts_refused", "check_readable", "openrlhf_data_flags", "prompt_files_are_text"]
