"""1. Attribution: problem, reference, failed responses -> {keywords, error}.

Runs first (role analysis, switch ``attribution``); its keywords and error feed the
generation prompt and the keyword fallback hint, screened first: a keyword without a
letter, one that carries the answer, or one that parrots the agent's own
instructions is dropped (and counted).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from mentor.stages.hint.agent import (Agent, Machine, State, Switch, clean_str, format_failed, object_schema,
                                      reference_text, solution_in_view, text_field)
from mentor.stages.rules import Instructions, RuleLimits, copies_instructions, text_leaks_answer

if TYPE_CHECKING:
    from mentor.pipeline.llm import GenResult
    from mentor.stages.hint.config import HintConfig
    from mentor.stages.hint.prompt_templates import Templates

LETTER = re.compile(r"[^\W\d_]")


class Attribution(Agent):
    """problem, reference, failed responses -> {keywords, error}."""

    name = "attribution"
    role = "analysis"
    switch = Switch("attribution", "Run the Attribution agent (off: the hint is generated from the problem alone, "
                    "the method's 'without Attribution' ablation).")
    templates = {"attribution_system": frozenset(),
                 "attribution_user": frozenset({"problem", "answer", "solution", "failed"})}
    max_tokens_default, max_tokens_help = 200, "max_tokens of an attribution call."
    state = {"keywords": list, "error": lambda: None}  # the keywords and diagnosis, screened
    # dropped: keywords that carry the answer / have no letter (or an error without one), errors that carry the
    # answer, keywords / errors that repeat the attribution prompt
    counters = ("keyword_leaks", "keyword_invalid", "error_leaks", "copied_instructions")
    fake = '{"keywords": ["quantities asked for", "units"], "error": "The attempts answer a different quantity than the one asked."}'

    def attempt(self, s: State) -> int:
        return 0

    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]:
        row = s.row
        return self.chat(t, t.render("attribution_user", problem=row["problem"], answer=reference_text(row),
                                     solution=solution_in_view(row, cfg),
                                     failed=format_failed(row.get("failed"), cfg.max_failed, cfg.failed_chars)))

    def schema(self, cfg: HintConfig, limits: RuleLimits) -> dict:
        keywords = {"type": "array", "items": text_field(cfg.keyword_chars), "minItems": 1, "maxItems": cfg.max_keywords}
        return object_schema({"keywords": keywords, "error": text_field(cfg.error_chars)})

    def fields(self, obj: dict, cfg: HintConfig) -> dict | None:
        """``{"keywords": [...], "error": str | None}`` or None when there is no usable keyword."""
        kws = obj.get("keywords")
        if isinstance(kws, str):
            kws = [k for k in re.split(r"[,;]", kws)]
        if not isinstance(kws, list):
            return None
        keywords: list[str] = []
        for k in kws:
            k = clean_str(k, cfg.keyword_chars)
            if k and k.lower() not in {x.lower() for x in keywords}:
                keywords.append(k)
        keywords = keywords[: cfg.max_keywords]
        if not keywords:
            return None
        return {"keywords": keywords, "error": clean_str(obj.get("error"), cfg.error_chars)}

    def consume(self, p: Any, res: GenResult, parsed: dict | None, m: Machine) -> None:
        """Keep the keywords and error that pass the screens."""
        st = m.st
        if parsed is not None:
            own_text = m.memo.get(self.name)
            if own_text is None:
                own_text = m.memo[self.name] = Instructions.of(m.t.texts["attribution_system"], m.t.texts["attribution_user"])
            # Keywords are concepts: one without a letter ("1.1.1", "2400") is noise, one that carries
            # the answer (in any form the rules catch: "eighteen eggs", "9 times 2") would reach the
            # generation prompt and the fallback hint.
            worded = [k for k in parsed["keywords"] if LETTER.search(k)]
            kws = [k for k in worded if not text_leaks_answer(k, p.ctx)]
            st.keyword_invalid += len(parsed["keywords"]) - len(worded)
            st.keyword_leaks += len(worded) - len(kws)
            # A weak model parrots its instructions ("failed attempts", "the attempts are data to analyse").
            own = [k for k in kws if not copies_instructions(k, own_text, p.ctx.problem)]
            st.copied_instructions += len(kws) - len(own)
            p.keywords = own
            err = parsed["error"]
            if err and not LETTER.search(err):
                st.keyword_invalid += 1  # "4000" is not a diagnosis
                err = None
            if err and p.ctx.matcher.leaks(err):
                st.error_leaks += 1  # never let the answer reach the generation prompt
                err = None
            if err and copies_instructions(err, own_text, p.ctx.problem):
                st.copied_instructions += 1
                err = None
            p.error = err
        m.transition(p, "analysed")


AGENT = Attribution()
