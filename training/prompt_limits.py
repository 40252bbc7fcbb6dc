"""The round's prompt and response limits, in the policy's tokens: each launcher sets its trainer's limits from them.

A hint makes a prompt longer, and the trainers cut long prompts quietly: verl's
``data.max_prompt_length`` is 512 unless set (its dataset drops or its agent loop
left-truncates longer prompts, with a warning); OpenRLHF 0.11 keeps the last
``data.max_len - rollout.max_new_tokens`` tokens of a prompt. A cut hinted prompt
loses its problem's start, and the round trains on it. So before every round (and
in ``--dry-run``) the launcher measures the longest prompt of the round's shards
the way the trainers tokenize it (the chat template with
``add_generation_prompt=True`` for message prompts, the text as it is for a
pre-rendered one, no special tokens added, the trainer's template kwargs passed) with
the tokenizer of the model the round starts from (`rendered_lengths`; without kwargs the
count `mentor build` makes), and sets the trainer's limit to it plus a margin
(`prompt_room`), or refuses a round whose own limit is smaller, naming both numbers. Where the tokenizer cannot be loaded
(an HF name not in the local cache) a dry run says so and a real round is refused.

`mentor build --tokenizer` records the same figure (``max_prompt_tokens``,
``prompt_tokenizer``) in the shards' stats.json; it is reused when the tokenizer
is the same and the trainer passes no template kwargs, else measured again (and cached
under mentor's cache folder, keyed by the shards' paths, sizes and times, the tokenizer
and the kwargs).

Template kwargs. verl renders message prompts with ``data.apply_chat_template_kwargs``
(its dataset's length filter and its agent loop's ``build_initial_tokens`` both pass them to
``apply_chat_template``, then the agent loop keeps the last ``rollout.prompt_length`` tokens);
TRL 1.16 with ``chat_template_kwargs``. They change the text: Qwen3's template with
``enable_thinking: false`` closes an empty think block after the generation prompt. The
measurement renders with the same kwargs (`template_kwargs`).

Margin. The limit a launcher sets is the longest prompt plus `PROMPT_MARGIN` (5%, at least
16 tokens; `prompt_room`), not the longest prompt exactly: a template can write text that
changes between renderings (a date in a system prompt), and the trainer's environment can
hold another tokenizer or transformers version than the one that measured. verl pads every
prompt to its limit, so the margin is kept small.

Response limits (`response_limit`). Each round says how long a response may be: the round
config's own value (verl ``data.max_response_length``, TRL ``max_completion_length``,
OpenRLHF ``rollout.max_new_tokens``), else `RESPONSE_DEFAULT` (4096 tokens), never a
trainer's own default (verl and TRL: 512; OpenRLHF 0.11.2: ``data.max_len`` 2048 minus the
prompt). A reasoning policy (R1-Distill, Qwen3 thinking, Llama-3 with a long chain of
thought) cut at 512 tokens mid-thought scores 0 on nearly every problem, and mentor would
then mine the cut as a collapse; 4096 holds most GSM8K and MATH-level reasoning traces of
1.5B-4B reasoning models while a GRPO step stays affordable on one GPU. Longer-context
recipes set their own value. ``--dry-run`` prints the limit and where it came from.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.ids import content_hash
from mentor.pipeline.io import write_json_atomic
from mentor.pipeline.models import cache_dir

log = logging.getLogger(__name__)

PROMPT_MARGIN = 0.05  # share of the longest prompt added to the limit a launcher sets (at least MIN_MARGIN tokens)
MIN_MARGIN = 16
RESPONSE_DEFAULT = 4096  # mentor's response limit where the round config sets none (see the module docstring)


def prompt_room(tokens: int) -> int:
    """The prompt limit a launcher sets for a longest prompt of `tokens`: it plus the margin."""
    return tokens + max(MIN_MARGIN, math.ceil(tokens * PROMPT_MARGIN))


def response_limit(given: object, key: str) -> tuple[int, str]:
    """(the round's response limit, where it came from): the config's `given` value of `key`, else RESPONSE_DEFAULT."""
    if given is None:
        return RESPONSE_DEFAULT, f"{key}={RESPONSE_DEFAULT} (mentor's default for reasoning policies; set {key} to change it)"
    value = positive_int(given, key, "tokens")
    return value, f"{key}={value} (the round config)"


def positive_int(given: object, key: str, unit: str) -> int:
    """`given` (a round config's or override's value, maybe text) as a whole number >= 1; else a `ConfigError`."""
    try:
        value = int(str(given))
    except ValueError:
        raise ConfigError(f"{key} {given!r}: not a whole number of {unit}") from None
    if value < 1:
        raise ConfigError(f"{key} {given!r}: must be at least 1")
    return value


def rendered_lengths(prompts: Sequence[str | Sequence[dict]], tok: Any, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Tokens of each prompt as the trainer renders it: messages through the chat template with the generation
    prompt and `template_kwargs`, a rendered text as it is; no special tokens added (the template writes its own)."""
    kwargs = dict(template_kwargs or {})
    for key in ("tokenize", "return_dict", "return_tensors", "add_generation_prompt"):
        kwargs.pop(key, None)
    texts = [p if isinstance(p, str) else
             tok.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in p], tokenize=False,
                                     add_generation_prompt=True, **kwargs)
             for p in prompts]
    return [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]] if texts else []



@dataclass(frozen=True)
class LongestPrompt:
    """The round's longest prompt: `tokens` (None when it could not be measured, `why` says why)."""

    tokens: int | None
    rows: int
    tokenizer: str
    how: str  # "stats.json of the build" | "measured" | "cached"
    why: str | None = None
    template_kwargs: dict[str, Any] | None = None

    @property
    def limit(self) -> int | None:
        """The prompt limit to set: the longest prompt plus the margin (`prompt_room`)."""
        return prompt_room(self.tokens) if self.tokens is not None else None

    def describe(self) -> str:
        if self.tokens is None:
            return f"not measured ({self.why})"
        kw = f", template kwargs {json.dumps(self.template_kwargs, sort_keys=True)}" if self.template_kwargs else ""
        return f"{self.tokens} tokens ({self.tokenizer}, {self.rows} prompts, {self.how}{kw})"


def _from_build_stats(files: list[Path], tokenizer: str) -> LongestPrompt | None:
    """The build's own figure, when every shard comes from builds that measured with this tokenizer."""
    folders = {f.parent for f in files}
    best, rows = 0, 0
    for folder in folders:
        try:
            stats = json.loads((folder / "stats.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(stats, dict) or stats.get("prompt_tokenizer") != tokenizer or not isinstance(stats.get("max_prompt_tokens"), int):
            return None
        best, rows = max(best, stats["max_prompt_tokens"]), rows + int(stats.get("rows") or 0)
    return LongestPrompt(best, rows, tokenizer, "stats.json of the build")


def _cache_file(files: list[Path], tokenizer: str, template_kwargs: dict[str, Any] | None = None) -> tuple[Path, dict[str, Any]]:
    key = {"tokenizer": tokenizer, "files": [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]}
    if template_kwargs:
        key["template_kwargs"] = template_kwargs
    return cache_dir() / "prompt-tokens" / f"{content_hash(json.dumps(key, sort_keys=True))}.json", key


def longest_prompt(files: list[Path] | list[str], tokenizer: str, cache: bool = True,
                   template_kwargs: dict[str, Any] | None = None) -> LongestPrompt:
    """The longest prompt of `files` (``prompt`` column of `mentor build`'s shards) in `tokenizer`'s tokens, rendered
    with the trainer's chat template kwargs (`template_kwargs`)."""
    files = [Path(f) for f in files]
    kwargs = dict(template_kwargs or {}) or None
    found = _from_build_stats(files, tokenizer) if kwargs is None else None
    if found is not None:
        return found
    cache_path, key = _cache_file(files, tokenizer, kwargs)
    cache = cache_path if cache else None
    if cache is not None and cache.is_file():
        try:
            saved = json.loads(cache.read_text())
            if saved.get("key") == key:
                return LongestPrompt(int(saved["tokens"]), int(saved["rows"]), tokenizer, "cached", template_kwargs=kwargs)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        from transformers import AutoTokenizer  # optional and slow to import

        tok = AutoTokenizer.from_pretrained(tokenizer)
    except Exception as exc:  # offline and not cached, no tokenizer files, transformers missing
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return LongestPrompt(None, 0, tokenizer, "measured", f"cannot load the tokenizer of {tokenizer}: {first[:200]}",
                             kwargs)
    longest, rows = 0, 0
    for f in files:
        column = pq.read_table(f, columns=["prompt"]).column("prompt").to_pylist()
        if column:
            try:
                longest = max(longest, max(rendered_lengths(column, tok, kwargs)))
            except TypeError as exc:  # a kwarg the template's renderer refuses
                raise ConfigError(f"the chat template of {tokenizer} refuses the trainer's template kwargs "
                                  f"{json.dumps(kwargs, sort_keys=True)}: {exc}") from None
        rows += len(column)
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic({"key": key, "tokens": longest, "rows": rows}, cache)
        except OSError as exc:  # a cache that cannot be written costs a measurement next time, nothing else
            log.debug("prompt length cache not written: %s", exc)
    return LongestPrompt(longest, rows, tokenizer, "measured", template_kwargs=kwargs)


def model_context(model: str) -> int | None:
    """The model's context length from its config.json (``max_position_embeddings``); None when unknown."""
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    value = cfg.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


def require(found: LongestPrompt, dry_run: bool) -> int | None:
    """The measured length; a real round without one is refused (it could cut prompts unseen)."""
    if found.tokens is None and not dry_run:
        raise ConfigError(f"the round's prompts could not be measured in the policy's tokens ({found.why}), so the "
                          "trainer's prompt limit cannot be set: make the tokenizer loadable here (the model folder, or "
                          "the HF cache with HF_HOME), or build with `mentor build --tokenizer`")
    return found.tokens


def refuse(trainer_key: str, limit: int, found: LongestPrompt, what: str) -> None:
    """The trainer's limit is below the longest prompt: refuse with both numbers."""
    raise ConfigError(f"the round's longest prompt is {found.tokens} tokens ({found.tokenizer}), over {trainer_key}="
                      f"{limit}: {what}; raise {trainer_key} to at least {found.tokens} (or leave it unset and mentor "
                      "sets it from the prompts), or make the hints shorter")


__all__ = ["MIN_MARGIN", "PROMPT_MARGIN", "RESPONSE_DEFAULT", "LongestPrompt", "longest_prompt", "model_context",
           "prompt_room", "refuse", "rendered_lengths", "require", "response_limit"]
