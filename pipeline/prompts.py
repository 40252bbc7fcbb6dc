"""The pieces of the prompt layout every stage shares: the hint templates, the per-domain
instructions, the openings of the answer, the policy's tokenizer.

`stages/build_render.py` puts them together (`messages_expr`): `mentor build` writes the
next round's prompts with it, `mentor rollout` / `mentor rescue` sample with it, and
`mentor ingest` strips `HINT_PREFIX` again to recover the original problem from a logged
prompt. Only {hint}, {problem} and {instruction} are placeholders (other braces, e.g.
LaTeX, stay as they are); a template without {instruction} gets a non-empty instruction
after INSTRUCTION_SEPARATOR.

A hint can also open the policy's answer (placement ``assistant``, as QuestA puts a
solution prefix): the chat is then an unfinished assistant turn that the policy
continues, which no trainer renders from messages (they all close the last turn and
open a new one). `render_prompt` (`pipeline.policy_template`) renders it once with the
policy's own chat template (`load_tokenizer`) and the round's template variables: the
unhinted prompt with the generation prompt, then the hint, in the same (thinking or not)
mode; the text is what build hands the trainers and what rollout / rescue send.
`prompt_token_lengths` counts a prompt's tokens as the trainers will tokenize it: what build
records as ``max_prompt_tokens`` and what the launchers size the trainers' prompt limits by.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.models import resolve_model
from mentor.pipeline.policy_template import apply_template, render_prompt


# The placements build offers (docs/data.md#where-the-hint-goes). before/after/system are chat
# messages, read the same way by OpenRLHF's PromptDataset (--data.apply_chat_template), verl's
# RLHFDataset and TRL's GRPOTrainer, which all render them with add_generation_prompt=True.
# "assistant" opens the policy's answer with the hint (a solution prefix, as QuestA): every
# trainer would close a final assistant message, so these prompts are rendered once with the
# policy's chat template and handed over as text (`render_prompt`).
PLACEMENTS = ("before", "after", "system", "assistant")
TEXT_PLACEMENTS = ("assistant",)  # rendered to text: they need the policy's tokenizer
DEFAULT_PLACEMENT = "after"  # without a tokenizer, and for any set with code tasks

# User message of a hinted problem: placeholders {hint}, {problem}, optional {instruction}.
HINT_TEMPLATE = "Hint: {hint}\n\n{problem}"
PLAIN_TEMPLATE = "{problem}"
# What starts mentor's hint block (ingest looks for it in logged prompts).
HINT_PREFIX = HINT_TEMPLATE.split("{hint}")[0].strip()
# Appended to the user message per domain, after INSTRUCTION_SEPARATOR, unless the template places {instruction}.
INSTRUCTIONS = {
    "math": "Please reason step by step, and put your final answer within \\boxed{}.",
    "code": "Write the complete solution in Python inside one ```python code block.",
}
INSTRUCTION_SEPARATOR = "\n\n"
PLACEHOLDER_RE = re.compile(r"\{(hint|problem|instruction)\}")



# How a hint opens the policy's answer (placement "assistant"): the start of the assistant turn
# the policy continues. "bare" is the default: measured best with "labelled" on 53 dev problems
# (the hint continued as the policy's own first step, as QuestA's prefix; docs/benchmarks.md).
ANSWER_TEMPLATES = {
    "bare": "{hint}\n\n",
    "labelled": "Hint: {hint}\n\n",
    "first_person": "Let me start from this idea: {hint}\n\n",
}
DEFAULT_ANSWER = "bare"


def answer_template(spec: str | None) -> str:
    """A named opening (`ANSWER_TEMPLATES`) or the user's own text with {hint}; None: the default."""
    spec = DEFAULT_ANSWER if spec is None else spec
    text = ANSWER_TEMPLATES.get(spec, spec)
    if "{hint}" not in text:
        raise ConfigError(f"answer template {spec!r}: name one of {', '.join(ANSWER_TEMPLATES)} or give a text with {{hint}}")
    return text


@lru_cache(maxsize=8)
def load_tokenizer(name: str) -> Any:
    """The Hugging Face tokenizer (and chat template) of a model: a mentor CPU model name, a folder or a hub name."""
    path = resolve_model(name)
    try:
        from transformers import AutoTokenizer  # optional and slow to import

        tok = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a missing or odd tokenizer
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"--tokenizer {name}: cannot load its tokenizer ({first}); give the policy's folder or hub name") from exc
    if not getattr(tok, "chat_template", None):
        raise ConfigError(f"--tokenizer {name}: the tokenizer has no chat template, so the policy's prompt cannot be "
                          "rendered; give an instruct (chat) model's tokenizer")
    return tok


def prompt_token_lengths(prompts: Sequence[str | Sequence[dict]], tokenizer: Any,
                         chat_template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Tokens of each prompt (a list of chat messages, rendered with the generation prompt and
    `chat_template_kwargs`, or a rendered string); `tokenizer` an HF tokenizer or a model name."""
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    texts = [p if isinstance(p, str) else
             apply_template(tok, [{"role": m["role"], "content": m["content"]} for m in p], chat_template_kwargs)
             for p in prompts]
    if not texts:
        return []
    return [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]


__all__ = ["prompt_token_lengths", "ANSWER_TEMPLATES", "DEFAULT_ANSWER", "DEFAULT_PLACEMENT", "PLACEMENTS", "TEXT_PLACEMENTS", "HINT_PREFIX", "HINT_TEMPLATE", "INSTRUCTIONS", "INSTRUCTION_SEPARATOR", "PLACEHOLDER_RE", "PLAIN_TEMPLATE",
           "answer_template", "load_tokenizer", "render_prompt"]
