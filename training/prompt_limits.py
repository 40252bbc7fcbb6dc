"""The round's longest prompt in the policy's tokens: each launcher sets its trainer's prompt limit from it.

A hint makes a prompt longer, and the trainers cut long prompts quietly: verl's
``data.max_prompt_length`` is 512 unless set (its dataset drops or its agent loop
left-truncates longer prompts, with a warning); OpenRLHF 0.11 keeps the last
``data.max_len - rollout.max_new_tokens`` tokens of a prompt. A cut hinted prompt
loses its problem's start, and the round trains on it. So before every round (and
in ``--dry-run``) the launcher measures the longest prompt of the round's shards
the way the trainers tokenize it (the chat template with
``add_generation_prompt=True`` for message prompts, the text as it is for a
pre-rendered one, no special tokens added) with the tokenizer of the model the
round starts from (`mentor.pipeline.prompts.prompt_token_lengths`, what `mentor build` counts too), and sets
the trainer's limit to it, or refuses a round whose
own limit is smaller, naming both numbers. Where the tokenizer cannot be loaded
(an HF name not in the local cache) a dry run says so and a real round is refused.

`mentor build --tokenizer` records the same figure (``max_prompt_tokens``,
``prompt_tokenizer``) in the shards' stats.json; it is reused when the tokenizer
is the same, else measured again (and cached under mentor's cache folder, keyed by the
shards' paths, sizes and times and the tokenizer).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.ids import content_hash
from mentor.pipeline.io import write_json_atomic
from mentor.pipeline.models import cache_dir
from mentor.pipeline.prompts import prompt_token_lengths

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class LongestPrompt:
    """The round's longest prompt: `tokens` (None when it could not be measured, `why` says why)."""

    tokens: int | None
    rows: int
    tokenizer: str
    how: str  # "stats.json of the build" | "measured" | "cached"
    why: str | None = None

    def describe(self) -> str:
        if self.tokens is None:
            return f"not measured ({self.why})"
        return f"{self.tokens} tokens ({self.tokenizer}, {self.rows} prompts, {self.how})"


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


def _cache_file(files: list[Path], tokenizer: str) -> tuple[Path, dict[str, Any]]:
    key = {"tokenizer": tokenizer, "files": [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]}
    return cache_dir() / "prompt-tokens" / f"{content_hash(json.dumps(key, sort_keys=True))}.json", key


def longest_prompt(files: list[Path] | list[str], tokenizer: str, cache: bool = True) -> LongestPrompt:
    """The longest prompt of `files` (``prompt`` column of `mentor build`'s shards) in `tokenizer`'s tokens."""
    files = [Path(f) for f in files]
    found = _from_build_stats(files, tokenizer)
    if found is not None:
        return found
    cache_path, key = _cache_file(files, tokenizer)
    cache = cache_path if cache else None
    if cache is not None and cache.is_file():
        try:
            saved = json.loads(cache.read_text())
            if saved.get("key") == key:
                return LongestPrompt(int(saved["tokens"]), int(saved["rows"]), tokenizer, "cached")
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        from transformers import AutoTokenizer  # optional and slow to import

        tok = AutoTokenizer.from_pretrained(tokenizer)
    except Exception as exc:  # offline and not cached, no tokenizer files, transformers missing
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return LongestPrompt(None, 0, tokenizer, "measured", f"cannot load the tokenizer of {tokenizer}: {first[:200]}")
    longest, rows = 0, 0
    for f in files:
        column = pq.read_table(f, columns=["prompt"]).column("prompt").to_pylist()
        if column:
            longest = max(longest, max(prompt_token_lengths(column, tok)))
        rows += len(column)
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic({"key": key, "tokens": longest, "rows": rows}, cache)
        except OSError as exc:  # a cache that cannot be written costs a measurement next time, nothing else
            log.debug("prompt length cache not written: %s", exc)
    return LongestPrompt(longest, rows, tokenizer, "measured")


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


__all__ = ["LongestPrompt", "longest_prompt", "model_context", "refuse", "require"]
