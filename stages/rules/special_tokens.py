"""`special_token`: a hint that carries a chat-control token of the policy's tokenizer (``<|im_end|>``,
``<|start_header_id|>``, ``<｜User｜>``, ...).

Every trainer tokenizes the rendered prompt with the tokenizer's added tokens split out, so such a hint
closes the turn it sits in and opens new ones (a user turn, an assistant turn with a program) in the
prompt the policy trains on. The rule rejects it; `mentor build` drops such hints and problems
(`stages/build_guard.py`) with the same token list.

Which tokens: every added token of the tokenizers that are known (the policy's, ``--tokenizer``; the
hint engine's; `tokenizer_control_tokens`), and always `COMMON_CONTROL_TOKENS` plus anything shaped like
``<|name|>`` or ``<｜name｜>`` (`CONTROL_SHAPE`): the built-in list that applies when no tokenizer is known,
kept beside a known one because the hints may train another policy later.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mentor.stages.rules.registry import RuleRegistry

if TYPE_CHECKING:
    from mentor.stages.rules.context import RuleContext

# The chat-control tokens of the common chat templates, matched when no tokenizer is known (and always).
COMMON_CONTROL_TOKENS: tuple[str, ...] = (
    # ChatML (Qwen, SmolLM, Hermes, ...)
    "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    # Llama 3.x
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
    "<|python_tag|>",
    # DeepSeek V3 / R1 and the R1 distills (fullwidth bars, U+2581 for spaces)
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
    # Llama 2 / Mistral
    "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "<s>", "</s>",
    # Gemma
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
    # Phi-3 and others of its shape
    "<|user|>", "<|assistant|>", "<|system|>", "<|end|>",
    # thinking blocks (Qwen3, R1): a hint that opens or closes one rewrites the policy's answer
    "<think>", "</think>",
)
# Any token shaped like the ChatML / Llama 3 / DeepSeek ones, of a tokenizer not listed above.
# (Written so that Python's re and polars' (Rust) regex read it the same.)
CONTROL_SHAPE = r"<\|[A-Za-z0-9_.\-]{1,48}\|>|<｜[^｜<>\s]{1,48}｜>"


def tokenizer_control_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokens a Hugging Face tokenizer splits out of any text as control ids: its special tokens and every
    added token (DeepSeek's ``<｜User｜>`` is an added token that is not marked special). Tokens without a
    punctuation mark or shorter than 3 characters (an added plain word) are left out: prose carries them."""
    found: set[str] = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found.update(getattr(t, "content", str(t)) for t in decoder.values())
    return tuple(sorted(t for t in found if isinstance(t, str) and len(t.strip()) >= 3
                        and any(not c.isalnum() and not c.isspace() for c in t)))


def control_tokens(*tokenizers: Any) -> tuple[str, ...]:
    """`COMMON_CONTROL_TOKENS` and the control tokens of each tokenizer given (None: skipped), longest first."""
    out = set(COMMON_CONTROL_TOKENS)
    for tok in tokenizers:
        if tok is not None:
            out.update(tokenizer_control_tokens(tok))
    return tuple(sorted(out, key=lambda t: (-len(t), t)))


@lru_cache(maxsize=16)
def _pattern(tokens: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join([*(re.escape(t) for t in tokens), CONTROL_SHAPE]))


def control_tokens_in(text: str, tokens: Sequence[str] | None = None) -> list[str]:
    """The distinct control tokens in `text`, in order of appearance (`tokens`: default `COMMON_CONTROL_TOKENS`)."""
    if not text or ("<" not in text and "[" not in text):
        return []
    pat = _pattern(tuple(tokens) if tokens is not None else COMMON_CONTROL_TOKENS)
    return list(dict.fromkeys(m.group(0) for m in pat.finditer(text)))


def describe_tokens(tokens: Iterable[str], limit: int = 3) -> str:
    """``'<|im_end|>', '<|im_start|>'`` for a message."""
    toks = list(tokens)
    return ", ".join(repr(t) for t in toks[:limit]) + (f" and {len(toks) - limit} more" if len(toks) > limit else "")


@RuleRegistry.add("special_token", "the hint contains a chat-control token of the model's template (such as <|im_end|> "
                  "or <|start_header_id|>); write plain text without any such token", order=100)  # runs last
def special_token(text: str, ctx: RuleContext) -> bool:
    """A chat-control token (`control_tokens_in` with the context's `control_tokens`)."""
    return bool(control_tokens_in(text, ctx.control_tokens))
