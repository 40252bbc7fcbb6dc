"""LoRA for a TRL round (``lora:`` in the round config): peft's ``LoraConfig`` for ``GRPOTrainer(peft_config=...)``.

A TRL user on a small-memory machine trains adapters instead of the whole policy: the optimizer state and the
weight gradients then cover the adapters only (full fine-tuning of a 0.5B policy in float32 holds about 2 GiB of
weights, 2 of gradients and 4 of AdamW state). ``lora`` is a mapping of `peft.LoraConfig` keyword arguments
(``{}``: peft's defaults, r 8 on the architecture's default modules); mentor sets ``task_type`` to
``CAUSAL_LM``. The keys and their types are checked against the installed peft's dataclass when the round config
is read (`check_lora`), so a typo is a `ConfigError` before anything starts.

The round's final model (``<train>/model``) stays a whole model, as the next round and ``mentor eval`` load it:
`save_merged` saves the adapters (``<train>/adapter``, through the trainer: every process takes part), then the
main process loads the start model, applies them, merges them into its weights and saves that.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
from pathlib import Path
from typing import Any

from mentor.pipeline.errors import ConfigError
from mentor.training.field_types import check_dataclass_values

INSTALL_PEFT = "pip install 'peft>=0.15'"
TASK_TYPE = "CAUSAL_LM"


def _lora_class():
    try:
        from peft import LoraConfig  # optional and slow to import (torch, transformers)
    except ImportError as exc:
        raise ConfigError(f"lora needs the peft package ({exc}); {INSTALL_PEFT}") from None
    return LoraConfig


def peft_version() -> str:
    try:
        return importlib.metadata.version("peft")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def lora_config(options: dict[str, Any], where: str = "round config"):
    """`peft.LoraConfig(task_type=CAUSAL_LM, **options)`; a bad key or value is a `ConfigError` naming ``lora.<key>``."""
    cls = _lora_class()
    owner = f"peft {peft_version()}'s LoraConfig"
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    for key in options:
        if key == "task_type":
            raise ConfigError(f"{where}: lora.task_type is set by mentor ({TASK_TYPE}: the policy is a causal LM)")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            raise ConfigError(f"{where}: lora.{key}: not a field of {owner}" + (f" (did you mean {close[0]}?)" if close else ""))
    check_dataclass_values(cls, options, f"{where}: lora", owner)
    if "r" in options and options["r"] < 1:
        raise ConfigError(f"{where}: lora.r {options['r']}: must be >= 1 (the adapters' rank)")
    try:
        return cls(task_type=TASK_TYPE, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: lora: {owner} rejects the settings: {exc}") from None


def check_lora(options: dict[str, Any] | None, where: str = "round config") -> None:
    if options is not None:
        lora_config(options, where)


def save_merged(trainer: Any, base_model: str, tokenizer: Any, adapter_dir: Path, out: Path) -> None:
    """Save the adapters to `adapter_dir` (every process calls this: the trainer gathers sharded weights), then on the
    main process merge them into `base_model`'s weights, in the dtype the trainer trained in, and save that to `out`."""
    trainer.save_model(str(adapter_dir))
    trainer.accelerator.wait_for_everyone()
    if not trainer.accelerator.is_main_process:
        return
    from peft import PeftModel  # slow to import
    from transformers import AutoModelForCausalLM  # likewise

    dtype = trainer.accelerator.unwrap_model(trainer.model).get_base_model().dtype
    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
