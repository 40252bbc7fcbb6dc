"""2. Generation: problem, keywords, error (+ the last hint of an earlier round, + why the last try failed) -> {hint}.

The candidate writer (role generate, switch ``generation``): its hint goes through the rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mentor.stages.hint.agent import Agent, State, Switch, object_schema, reference_text, solution_in_view, text_field
from mentor.stages.rules import RuleLimits

if TYPE_CHECKING:
    from mentor.stages.hint.config import HintConfig
    from mentor.stages.hint.prompt_templates import Templates

MAX_PARSED_HINT = 10_000


class Generation(Agent):
    """problem, keywords, error (+ the last hint of an earlier round, + why the last try failed) -> {hint}."""

    name = "generation"
    role = "generate"
    switch = Switch("generation", "Run the Generation agent (off: the hint is the keyword template filled with the "
                    "attribution's keywords, the 'without Generation' ablation; with attribution off too, the generic default hint).")
    creative = True
    templates = {
        "generation_system": frozenset(),
        "generation_user": frozenset({"problem", "answer", "solution", "diagnosis", "keywords", "error", "escalation", "retry"}),
        "generation_diagnosis": frozenset({"keywords", "error"}),
        "generation_escalation": frozenset({"previous_hint"}),
        "generation_retry": frozenset({"violations"}),
    }
    max_tokens_default, max_tokens_help = 360, "max_tokens of a generation call (reasoning + hint)."
    violations = {"parse_error": "the output was not the requested JSON",
                  "truncated": "the output was cut at the token limit"}
    fake = '{"hint": "Work out exactly which quantity the question asks for, then relate the given quantities to it one at a time."}'

    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]:
        """Without attribution (an ablation: cfg.attribution off) the prompt has the problem alone."""
        row = s.row
        previous = row.get("previous_hints") or []
        escalation = t.render("generation_escalation", previous_hint=previous[-1]) if previous else ""
        retry = t.render("generation_retry", violations=", ".join(s.rejected)) if s.retry and s.rejected else ""
        keywords, error = getattr(s, "keywords", None), getattr(s, "error", None)
        kws, err = ", ".join(keywords) if keywords else "(none)", error or "(unknown)"
        diagnosis = t.render("generation_diagnosis", keywords=kws, error=err) if getattr(cfg, "attribution", False) else ""
        return self.chat(t, t.render("generation_user", problem=row["problem"], answer=reference_text(row),
                                     solution=solution_in_view(row, cfg), diagnosis=diagnosis,
                                     keywords=kws, error=err, escalation=escalation, retry=retry))

    def schema(self, cfg: HintConfig, limits: RuleLimits) -> dict:
        """``{"hint"}``, or ``{"reasoning", "hint"}``: the model works the problem out first, then writes the hint."""
        reasoning = {"reasoning": text_field(cfg.reasoning_chars)} if cfg.reasoning_chars else {}
        return object_schema(reasoning | {"hint": text_field(limits.max_chars)})

    def fields(self, obj: dict, cfg: HintConfig) -> dict | None:
        """``{"hint": str}`` (plus the model's ``"reasoning"`` when it gave one) or None (no hint, or blank)."""
        hint = obj.get("hint")
        if not isinstance(hint, str):
            return None
        hint = " ".join(hint.split())
        if not hint:
            return None
        out = {"hint": hint[:MAX_PARSED_HINT]}  # the rules judge its length; this only bounds a runaway answer
        if isinstance(obj.get("reasoning"), str):
            out["reasoning"] = obj["reasoning"]
        return out


AGENT = Generation()
