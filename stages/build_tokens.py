"""Prompt lengths in the policy's tokens, as the trainer will tokenize the prompts.

`prompt_token_lengths` is what `mentor build` records as ``max_prompt_tokens`` (stats.json,
manifest.json) and what a launcher can call to size the trainer's prompt budget (verl's
``data.max_prompt_length``, OpenRLHF's ``max_len - max_tokens``): a chat-message prompt
through the tokenizer's chat template with the generation prompt (how OpenRLHF, verl and
TRL render it), a pre-rendered text prompt (placement ``assistant``) as it is; then
tokenized without added special tokens, as OpenRLHF and verl do (the template writes its
own). TRL tokenizes a text prompt with the tokenizer's default special tokens: the same
ids for tokenizers that add none (Qwen2.5, SmolLM2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mentor.pipeline.prompts import load_tokenizer


def prompt_token_lengths(prompts: Sequence[str | Sequence[dict]], tokenizer: Any) -> list[int]:
    """Tokens of each prompt (a list of chat messages, or a rendered string); `tokenizer` an HF tokenizer or a model name."""
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    texts = [p if isinstance(p, str) else
             tok.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in p], tokenize=False,
                                     add_generation_prompt=True)
             for p in prompts]
    if not texts:
        return []
    return [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]


__all__ = ["prompt_token_lengths"]
