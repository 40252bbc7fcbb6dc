"""Rule checks of a candidate hint: named violations, no model involved.

The judge runs these first; only a hint that passes every rule goes to the
LLM judge. Each violation has a stable name, kept in the hint row's
``violations`` and counted in stats.json.

- `checks`: the rules, each declared once with its name, the repair agent's
  message, whether trimming can cure it, and its check; `check_hint`,
  `trim_to_rules` and `check` (``mentor check-hint``) run them.
- `registry`: `RuleRegistry` (declare once, look up by name; every module of this folder and of
  ``MENTOR_PLUGIN_PATH``'s ``rules/`` is found from the folder, so a new rule is one new file) and `describe`.
- `judge_verdicts`: the verdict rules (what in the LLM judge's verdict rejects a hint).
- `context`: `RuleContext` (what the rules know about one problem), `RuleLimits`.
- `numbers`: numbers as exact rationals and `AnswerMatcher` (the answer in any form).
- `words`: numbers in English words; `arithmetic`: a bounded parser for arithmetic
  that evaluates to the answer; `bare_answer`: a hint that is only an answer.
- `instructions`: attribution output that parrots the agent's own instructions.
- `special_tokens`: the ``special_token`` rule (chat-control tokens of the policy's template, which
  would turn a hint into chat turns; ``order=100``: it runs last) and the token lists `mentor build` screens with.

This file only re-exports the rules' API: no module needs to be listed here to take part.
"""

from mentor.stages.rules.bare_answer import answer_only
from mentor.stages.rules.checks import (
    MIN_TRIMMED_WORDS,
    RuleReport,
    check,
    check_hint,
    indirect_leak,
    text_leaks_answer,
    trim_to_rules,
)
from mentor.stages.rules.context import RuleContext, RuleLimits
from mentor.stages.rules.instructions import Instructions, copies_instructions
from mentor.stages.rules.numbers import AnswerMatcher, matcher_for
from mentor.stages.rules.registry import DEFAULT_ORDER, Rule, RuleRegistry, VerdictRule, describe
from mentor.stages.rules.special_tokens import (
    COMMON_CONTROL_TOKENS,
    control_tokens,
    control_tokens_in,
    tokenizer_control_tokens,
)

__all__ = [
    "COMMON_CONTROL_TOKENS",
    "DEFAULT_ORDER",
    "MIN_TRIMMED_WORDS",
    "AnswerMatcher",
    "Instructions",
    "Rule",
    "RuleContext",
    "RuleLimits",
    "RuleRegistry",
    "RuleReport",
    "VerdictRule",
    "answer_only",
    "check",
    "check_hint",
    "control_tokens",
    "control_tokens_in",
    "copies_instructions",
    "describe",
    "indirect_leak",
    "matcher_for",
    "text_leaks_answer",
    "tokenizer_control_tokens",
    "trim_to_rules",
]
