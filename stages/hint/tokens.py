"""The chat-control tokens a hint must not carry (rule ``special_token``): the built-in list, the hint
engine's tokenizer (a vllm engine's model) and the policy's (``vouch.tokenizer``, or a vllm vouching policy's
model), each where it is known. A tokenizer that cannot be loaded leaves the built-in list, with a warning."""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.prompts import load_tokenizer
from mentor.stages.rollout import policy_tokenizer
from mentor.stages.rules import control_tokens

log = logging.getLogger(__name__)


@lru_cache(maxsize=8)
def _tokens_of(names: tuple[str, ...]) -> tuple[str, ...]:
    toks = []
    for name in names:
        try:
            toks.append(load_tokenizer(name))
        except ConfigError as exc:
            log.warning("the chat-control tokens of %s are not known (%s); the hints are checked for the common "
                        "chat templates' tokens only", name, exc)
    return control_tokens(*toks)


def hint_control_tokens(cfg: Any, backend: Any) -> tuple[str, ...]:
    """The tokens of `special_tokens.control_tokens` for a run of `cfg` (a HintConfig) on `backend`."""
    names = [policy_tokenizer(backend)]
    vouch = getattr(cfg, "vouch", None)
    if vouch is not None:
        names.append(vouch.tokenizer or policy_tokenizer(vouch.policy.spec()))
    return _tokens_of(tuple(dict.fromkeys(n for n in names if n)))
