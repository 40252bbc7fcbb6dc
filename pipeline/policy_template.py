"""The text a policy conditions on, as its own chat template writes it: a hinted prompt is the unhinted prompt
plus the hint, in the same mode.

`render_prompt` renders a chat for the policy. A chat that ends with an open assistant message (placement
``assistant``: the hint opens the policy's answer) is rendered as

    <the template's rendering of the chat before it, add_generation_prompt=True, the round's kwargs>
    + <the opener the policy would write itself first, if the template does not write it>
    + <the opening of the answer (the hint through the answer template)>

so the text before the hint is byte for byte what every trainer renders for the same chat without a hint,
under the same template variables (``chat_template_kwargs``: Qwen3's ``enable_thinking``, ...). Transformers'
``continue_final_message`` is not used: it renders the assistant message as a *finished* past turn, which
Qwen3's template writes with an empty ``<think>\\n\\n</think>\\n\\n`` block (its non-thinking mode) and
DeepSeek-R1's without the ``<think>\\n`` its generation prompt writes.

What goes between the generation prompt and the hint (`answer_opener`), read from the template, not from
model names:

- the generation prompt ends inside an open ``<think>`` block (DeepSeek-R1 and its distilled models, QwQ,
  Qwen3-*-Thinking-2507: ``<｜Assistant｜><think>\\n``): nothing; the hint opens the reasoning;
- the generation prompt closes an empty block (Qwen3 with ``enable_thinking: false``): nothing; the hint opens
  the answer, after the closed block, as in every unhinted row;
- a template that knows ``enable_thinking`` and leaves the block to the policy (Qwen3 in thinking mode, the
  default): ``<think>\\n``, what the policy writes first; the hint opens its reasoning;
- a template with no thinking block (SmolLM2, Qwen2.5, Llama-3.x): nothing; the hint opens the answer.

The leading BOS stays as the template writes it (Llama-3.x, the DeepSeek family): OpenRLHF's agent executor
and mentor's vLLM backends tokenize the text without special tokens. A trainer that tokenizes text with special
tokens (TRL's GRPOTrainer) gets the text without it where its tokenizer adds one itself (`text_for_tokenizer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mentor.pipeline.errors import ConfigError

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# The variable a hybrid template (Qwen3) switches thinking with; a template that knows it leaves the block to the
# policy in thinking mode.
THINKING_SWITCH = "enable_thinking"


def tokenizer_name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def template_source(tokenizer: Any) -> str:
    """The chat template's text (all named templates of a tokenizer that has several)."""
    tpl = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(map(str, tpl.values())) if isinstance(tpl, Mapping) else str(tpl)


def apply_template(tokenizer: Any, messages: list[dict], kwargs: Mapping[str, Any] | None,
                   add_generation_prompt: bool = True) -> str:
    """`tokenizer.apply_chat_template` to text; a template that raises is a `ConfigError` naming it and the fix."""
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                            **dict(kwargs or {}))
    except Exception as exc:  # jinja2's TemplateError (raise_exception), TypeError, ... from the user's template
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        roles = "/".join(m["role"] for m in messages)
        raise ConfigError(f"the chat template of tokenizer {tokenizer_name(tokenizer)} fails on a {roles} chat "
                          f"({type(exc).__name__}: {first}); fix the template (tokenizer_config.json 'chat_template'), give "
                          "the policy's own tokenizer (--tokenizer), or use another placement (--placement after)") from None
    if not isinstance(out, str):
        raise ConfigError(f"the chat template of tokenizer {tokenizer_name(tokenizer)} did not render text "
                          f"({type(out).__name__}); give a chat model's tokenizer (--tokenizer)")
    return out


def answer_opener(tokenizer: Any, generation: str, before: str) -> str:
    """What the policy writes at the start of its answer before the hint can open it, when its template does not
    write it: ``<think>\\n`` for a hybrid template in thinking mode, else nothing (module docstring). `generation`
    is the chat rendered with the generation prompt, `before` without it."""
    source = template_source(tokenizer)
    if THINK_OPEN not in source:
        return ""  # no thinking block: the hint opens the answer
    prompt = generation[len(before):] if generation.startswith(before) else generation
    opened, closed = prompt.rfind(THINK_OPEN), prompt.rfind(THINK_CLOSE)
    if opened >= 0 or closed >= 0:
        return ""  # the template opened the reasoning (R1) or closed an empty block (non-thinking mode)
    return THINK_OPEN + "\n" if THINKING_SWITCH in source else ""


def policy_mode(tokenizer: Any, kwargs: Mapping[str, Any] | None = None) -> str:
    """How the policy answers under these template variables, for manifests and dry runs: ``thinking`` (the
    template opens the block, or the policy does), ``non-thinking`` (the template closes an empty one), or
    ``no thinking block``. A template that writes no assistant turn is a `ConfigError` (`generation_prompt`)."""
    gen, bare = generation_prompt(tokenizer, None, kwargs)
    if THINK_OPEN not in template_source(tokenizer):
        return "no thinking block"
    prompt = gen[len(bare):] if gen.startswith(bare) else gen
    if prompt.rfind(THINK_CLOSE) > prompt.rfind(THINK_OPEN):
        return "non-thinking"
    return "thinking" if THINK_OPEN in prompt or answer_opener(tokenizer, gen, bare) else "no thinking block"


def render_prompt(tokenizer: Any, messages: list[dict[str, str]], chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The text the policy conditions on: its chat template over `messages` with the generation prompt and
    `chat_template_kwargs` (what every trainer renders itself); a final assistant message is the opening of the
    answer, written after the generation prompt and the opener the policy would write (module docstring)."""
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    if not msgs or msgs[-1]["role"] != "assistant":
        return apply_template(tokenizer, msgs, chat_template_kwargs)
    head, opening = msgs[:-1], msgs[-1]["content"]
    generation, before = generation_prompt(tokenizer, head, chat_template_kwargs)
    return generation + answer_opener(tokenizer, generation, before) + opening


def generation_prompt(tokenizer: Any, messages: list[dict] | None = None,
                      chat_template_kwargs: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """`messages` (default: a one-question chat) rendered with and without the generation prompt; a template that
    writes no assistant turn is a `ConfigError` naming the tokenizer and the fix. Stages that render text prompts
    call it once before rendering (an unhinted text prompt would silently end at the user's turn)."""
    messages = messages if messages is not None else [{"role": "user", "content": "1+1?"}]
    generation = apply_template(tokenizer, messages, chat_template_kwargs)
    before = apply_template(tokenizer, messages, chat_template_kwargs, add_generation_prompt=False)
    if generation == before:
        raise ConfigError(f"the chat template of tokenizer {tokenizer_name(tokenizer)} writes no assistant turn for "
                          "add_generation_prompt=True, so the policy's answer cannot start in the prompt (placement "
                          "assistant); give a chat model's tokenizer whose template starts the assistant's turn "
                          "(--tokenizer), or use another placement (--placement after)")
    return generation, before


def adds_bos(tokenizer: Any) -> bool:
    """Whether the tokenizer itself puts its BOS in front of a text tokenized with special tokens."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == bos


def text_for_tokenizer(text: str, tokenizer: Any) -> str:
    """A rendered prompt for a trainer that tokenizes it *with* special tokens (TRL's GRPOTrainer): without the
    template's leading BOS when the tokenizer adds one itself, so the tokens start with one BOS, not two."""
    bos = getattr(tokenizer, "bos_token", None)
    if isinstance(bos, str) and bos and text.startswith(bos) and adds_bos(tokenizer):
        return text[len(bos):]
    return text


__all__ = ["THINK_CLOSE", "THINK_OPEN", "THINKING_SWITCH", "adds_bos", "answer_opener", "apply_template", "generation_prompt",
           "policy_mode", "render_prompt", "template_source", "text_for_tokenizer", "tokenizer_name"]
