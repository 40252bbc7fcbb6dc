"""The four hint agents, each one `Agent` record around the backend seam.

    messages(state, cfg, templates) -> chat messages     schema(cfg, limits) -> JSON schema
    parse(text, cfg) -> fields | None                    attempt, sampling, max_tokens

1. attribution  problem, reference, failed responses -> {keywords, error}
2. generation   problem, keywords, error (+ the last hint of an earlier round) -> {hint}
3. judgment     problem, reference, hint -> {check, correct, score, feedback}   (after the rules pass)
4. repair       problem, rejected hint, violations, feedback -> {hint}

Where the problem has a reference solution (`stages.solutions`), every agent sees it too
(``see_solution``): attribution compares the attempts with it, generation and repair take
the hint from it (its first step the student misses, never further), judgment checks the
hint's claims against it. Without one, the templates leave the block out.

Prompts come from versioned template files (``stages/hint/templates/*.txt``, jinja2
with ``{{ name }}`` placeholders), overridable per file from a user directory; the
hash of the effective templates is the ``prompt_version`` of every hint row.

Layout for vLLM's prefix cache: the system message holds an agent's fixed
instructions (shared by every problem), the user message starts with the
problem text (shared by every wave of one problem), the variable parts come
last.

A parse never raises: anything that is not the requested JSON gives None,
and the caller keeps the raw text.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import jinja2
import jinja2.meta
from jinja2.sandbox import SandboxedEnvironment

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.llm import GenRequest
from mentor.stages.rules import RuleLimits, describe
from mentor.stages.solutions import solution_text

if TYPE_CHECKING:  # (config.py builds its per-agent settings from `AGENTS`: the import runs the other way)
    from mentor.stages.hint.config import HintConfig

TEMPLATE_DIR = Path(__file__).parent / "templates"
CHECK_CHARS = 400  # longest "check" of a judgment: the hint's numbers and claims, one by one

# Templates no agent owns: the safe defaults a problem falls back to (`Agent.templates` holds the others).
FALLBACK_TEMPLATES: dict[str, frozenset[str]] = {
    "fallback_keywords": frozenset({"keywords"}),
    "fallback_math": frozenset(),
    "fallback_code": frozenset(),
}

# Prompts, not HTML: no escaping. A value the template uses but was not given is an error, not "".
# Sandboxed: a template from a user directory can format values but not reach into Python.
_JINJA = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
# What a template can do wrong while rendering (a StrictUndefined value, `{{ problem + 1 }}`, ...).
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, LookupError)


def _may_use(name: str) -> str:
    return f"{name} may use {sorted(TEMPLATE_VARS[name]) or 'none'}"


def _one_line(exc: Exception) -> str:
    return " ".join(str(getattr(exc, "message", None) or exc).split()).rstrip(".")


def _compile(name: str, text: str, where: str) -> jinja2.Template:
    """The template, checked: jinja2 syntax, only its own placeholders, and a trial render with every value given."""
    try:
        tree = _JINJA.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(
            f"{where}: line {exc.lineno}: {_one_line(exc)}; fix the jinja2 syntax "
            "({{ name }} inserts a value; {% raw %}...{% endraw %} keeps '{{' as it is)"
        ) from exc
    bad = sorted(jinja2.meta.find_undeclared_variables(tree) - TEMPLATE_VARS[name])
    if bad:
        raise ConfigError(f"{where}: unknown placeholder(s) {bad}; {_may_use(name)}")
    template = _JINJA.from_string(tree)
    try:
        template.render({v: "x" for v in TEMPLATE_VARS[name]})
    except _RENDER_ERRORS as exc:
        raise ConfigError(f"{where}: {_one_line(exc)}; {_may_use(name)}, each a string") from exc
    return template


class Templates:
    """The effective prompt templates (jinja2 with `StrictUndefined`), checked and compiled once.

    `texts` holds what callers use as it is: the source of a template that takes values (fill it
    with `render`), and the rendered text of one that takes none (system prompts, the generic
    fallbacks), so jinja2 syntax means the same in every file. `version` hashes the sources.
    """

    def __init__(self, texts: dict[str, str], sources: dict[str, str] | None = None) -> None:
        self.sources = sources or {}
        self._sources_text = dict(texts)
        self._compiled = {name: _compile(name, text, self.sources.get(name, name)) for name, text in texts.items()}
        self.texts = {name: text if TEMPLATE_VARS[name] else self.render(name) for name, text in texts.items()}
        blob = json.dumps(texts, sort_keys=True).encode()
        self.version = hashlib.sha256(blob).hexdigest()[:12]

    def __reduce__(self) -> tuple:  # compiled jinja2 templates do not pickle; a dask worker recompiles
        return (Templates, (self._sources_text, self.sources))

    @classmethod
    def load(cls, directory: str | Path | None = None) -> Templates:
        """Bundled templates, each replaced by ``DIR/<name>.txt`` when the user's directory has it."""
        texts, sources = {}, {}
        user = Path(directory) if directory else None
        if user is not None:
            if not user.is_dir():
                raise ConfigError(f"{user}: templates directory not found (templates_dir / --templates)")
            unknown = sorted(p.stem for p in user.glob("*.txt") if p.stem not in TEMPLATE_VARS)
            if unknown:
                raise ConfigError(
                    f"{user}: unknown template file(s) {unknown}; names are {sorted(TEMPLATE_VARS)} (+ .txt)"
                )
        for name in TEMPLATE_VARS:
            path = user / f"{name}.txt" if user is not None and (user / f"{name}.txt").is_file() else TEMPLATE_DIR / f"{name}.txt"
            try:
                texts[name] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from exc
            sources[name] = str(path)
        return cls(texts, sources)

    def render(self, name: str, **values: str) -> str:
        """The template with its placeholders filled; one it uses but was not given is a `ConfigError`."""
        template = self._compiled[name]
        try:
            # `Template.render` without its copy of jinja2's globals (a template may not use them:
            # `_compile` allows only its own placeholders): a third of the time, per request.
            return "".join(template.root_render_func(template.new_context(values, shared=True)))
        except _RENDER_ERRORS as exc:
            raise ConfigError(f"{self.sources.get(name, name)}: {_one_line(exc)}; {_may_use(name)}") from exc

    def lines(self, name: str) -> list[str]:
        return [ln.strip() for ln in self.texts[name].splitlines() if ln.strip()]


# --------------------------------------------------------------------------- helpers


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def strip_thinking(text: str) -> str:
    """`text` without a reasoning model's thinking (``<think>…</think>``), so JSON is never read out of it.

    Qwen3 and the R1 family think before they answer; a reasoning parser or a
    backend without a JSON grammar passes the block through. Everything up to the
    last ``</think>`` is thinking (R1-style templates open the block in the
    prompt, so the output may hold only the closing tag); an unclosed
    ``<think>`` (the model ran out of tokens while thinking) leaves no answer.
    """
    if not text:
        return text
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        return text[close + len(_THINK_CLOSE):].lstrip()
    start = text.find(_THINK_OPEN)
    return text[:start].rstrip() if start >= 0 else text


def json_object(text: str) -> dict | None:
    """The JSON object in `text` (also when wrapped in prose or a code fence, or after a thinking block), else None."""
    text = strip_thinking(text)
    if not text:
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        i, j = text.find("{"), text.rfind("}")
        if i < 0 or j <= i:
            return None
        try:
            obj = json.loads(text[i : j + 1])
        except ValueError:
            return None
    return obj if isinstance(obj, dict) else None


def reference_text(row: dict, max_chars: int = 1500) -> str:
    """The reference as the attribution and judgment agents see it."""
    label = row.get("label") or ""
    if row.get("domain") != "code":
        return label or "(unknown)"
    try:
        obj = json.loads(label)
    except ValueError:
        return label[:max_chars]
    tests = (obj.get("tests") or "").strip()
    if len(tests) > max_chars:
        tests = tests[:max_chars] + "\n[...]"
    return f"entry point `{obj.get('entry_point')}`; tests:\n{tests}"


def solution_in_view(row: dict, cfg: HintConfig) -> str:
    """The reference solution the agents see ("" when there is none, or ``see_solution`` is off)."""
    return solution_text(row, cfg.solution_chars) if cfg.see_solution else ""


def format_failed(failed: list[str] | None, max_failed: int, max_chars: int) -> str:
    if not failed:
        return "(none recorded)"
    parts = []
    for i, text in enumerate(failed[:max_failed], 1):
        text = text if len(text) <= max_chars else text[: max_chars // 5] + " [...] " + text[-(max_chars - max_chars // 5) :]
        if "</attempt" in text:  # the delimiters are ours: a response cannot close them early
            text = text.replace("</attempt", "</ attempt")
        parts.append(f"<attempt {i}>\n{text}\n</attempt {i}>")
    return "\n".join(parts)


def _clean_str(v: Any, max_chars: int) -> str | None:
    if not isinstance(v, str):
        return None
    v = " ".join(v.split())
    return v[:max_chars] if v else None


# --------------------------------------------------------------------------- the agents


class State(Protocol):
    """What the agents read of a problem on its way through the stage (machine.py's `ProblemState`)."""

    row: dict  # the collapsed row
    keywords: list[str]  # the attribution's, screened
    error: str | None  # the attribution's diagnosis, screened
    retry: int  # regenerations used
    rejected: list[str]  # why the last regenerated candidate was rejected
    candidate: str | None  # the hint under judgment or repair
    last_violations: list[str]  # why the candidate was rejected
    feedback: str | None  # the judge's, on the candidate
    cand_no: int  # candidates produced so far (generation + repair)


class Agent(ABC):
    """One agent, declared once: how its request is built and how its answer is read.

    As distilabel's Task: `messages` builds the chat from a problem's state (format_input),
    `schema` is the JSON its answer must follow (get_structured_output), `parse` reads the
    raw text back into fields, or None when it is not the requested JSON (format_output;
    the stage keeps the raw text in the trace either way). hint.py calls these for every
    agent alike; what happens after an answer is its state machine.

    Everything about an agent is declared here, once: its name (the request ids, seeds,
    stats, trace, its `Phase` in hint.py, its ``max_tokens.<name>`` setting and its key in
    ``agent_chat_template_kwargs``), its templates and the placeholders each may use, its
    default token limit and sampling. A new agent is a subclass here, in `AGENTS`, and
    the transition that follows its answer in hint.py's state machine.
    """

    name: ClassVar[str]  # the request ids ("i:name:n"), seeds, stats, trace, max_tokens.<name>
    creative: ClassVar[bool] = False  # sampled at temperature/top_p, else at analysis_temperature (greedy by default)
    templates: ClassVar[dict[str, frozenset[str]]]  # its template files (``<name>_system``, ...) -> their placeholders
    max_tokens_default: ClassVar[int]  # the default of ``max_tokens.<name>``
    max_tokens_help: ClassVar[str]  # its description in the settings

    def attempt(self, s: State) -> int:
        """The n of the request id ``i:name:n`` and of its seed."""
        return s.cand_no

    def sampling(self, cfg: HintConfig) -> tuple[float, float]:
        """temperature, top_p."""
        return (cfg.temperature, cfg.top_p) if self.creative else (cfg.analysis_temperature, 1.0)

    def max_tokens(self, cfg: HintConfig) -> int:
        return getattr(cfg.max_tokens, self.name)

    @abstractmethod
    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]: ...

    @abstractmethod
    def schema(self, cfg: HintConfig, limits: RuleLimits) -> dict:
        """The answer's JSON schema for a problem of a domain with these hint limits."""

    def parse(self, text: str, cfg: HintConfig) -> dict | None:
        """The answer's fields, or None (no JSON object in `text`, or not the fields asked for)."""
        obj = json_object(text)
        return None if obj is None else self.fields(obj, cfg)

    @abstractmethod
    def fields(self, obj: dict, cfg: HintConfig) -> dict | None:
        """The answer's fields read from its JSON object, or None when they are not usable."""

    def _chat(self, t: Templates, user: str) -> list[dict]:
        return [{"role": "system", "content": t.texts[f"{self.name}_system"]}, {"role": "user", "content": user}]


def _text(max_chars: int) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": max_chars}


def _object(props: dict) -> dict:
    """A JSON object of exactly `props`, all required, in this order (the order the grammar writes them)."""
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


class Attribution(Agent):
    """1. problem, reference, failed responses -> {keywords, error}."""

    name = "attribution"
    templates = {"attribution_system": frozenset(),
                 "attribution_user": frozenset({"problem", "answer", "solution", "failed"})}
    max_tokens_default, max_tokens_help = 200, "max_tokens of an attribution call."

    def attempt(self, s: State) -> int:
        return 0

    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]:
        row = s.row
        return self._chat(t, t.render("attribution_user", problem=row["problem"], answer=reference_text(row),
                                      solution=solution_in_view(row, cfg),
                                      failed=format_failed(row.get("failed"), cfg.max_failed, cfg.failed_chars)))

    def schema(self, cfg: HintConfig, limits: RuleLimits) -> dict:
        keywords = {"type": "array", "items": _text(cfg.keyword_chars), "minItems": 1, "maxItems": cfg.max_keywords}
        return _object({"keywords": keywords, "error": _text(cfg.error_chars)})

    def fields(self, obj: dict, cfg: HintConfig) -> dict | None:
        """``{"keywords": [...], "error": str | None}`` or None when there is no usable keyword."""
        kws = obj.get("keywords")
        if isinstance(kws, str):
            kws = [k for k in re.split(r"[,;]", kws)]
        if not isinstance(kws, list):
            return None
        keywords: list[str] = []
        for k in kws:
            k = _clean_str(k, cfg.keyword_chars)
            if k and k.lower() not in {x.lower() for x in keywords}:
                keywords.append(k)
        keywords = keywords[: cfg.max_keywords]
        if not keywords:
            return None
        return {"keywords": keywords, "error": _clean_str(obj.get("error"), cfg.error_chars)}


_MAX_PARSED_HINT = 10_000


class Generation(Agent):
    """2. problem, keywords, error (+ the last hint of an earlier round, + why the last try failed) -> {hint}."""

    name = "generation"
    creative = True
    templates = {
        "generation_system": frozenset(),
        "generation_user": frozenset({"problem", "answer", "solution", "diagnosis", "keywords", "error", "escalation", "retry"}),
        "generation_diagnosis": frozenset({"keywords", "error"}),
        "generation_escalation": frozenset({"previous_hint"}),
        "generation_retry": frozenset({"violations"}),
    }
    max_tokens_default, max_tokens_help = 360, "max_tokens of a generation call (reasoning + hint)."

    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]:
        """Without attribution (an ablation: cfg.attribution off) the prompt has the problem alone."""
        row = s.row
        previous = row.get("previous_hints") or []
        escalation = t.render("generation_escalation", previous_hint=previous[-1]) if previous else ""
        retry = t.render("generation_retry", violations=", ".join(s.rejected)) if s.retry and s.rejected else ""
        kws, err = ", ".join(s.keywords) if s.keywords else "(none)", s.error or "(unknown)"
        diagnosis = t.render("generation_diagnosis", keywords=kws, error=err) if cfg.attribution else ""
        return self._chat(t, t.render("generation_user", problem=row["problem"], answer=reference_text(row),
                                      solution=solution_in_view(row, cfg), diagnosis=diagnosis,
                                      keywords=kws, error=err, escalation=escalation, retry=retry))

    def schema(self, cfg: HintConfig, limits: RuleLimits) -> dict:
        """``{"hint"}``, or ``{"reasoning", "hint"}``: the model works the problem out first, then writes the hint."""
        reasoning = {"reasoning": _text(cfg.reasoning_chars)} if cfg.reasoning_chars else {}
        return _object(reasoning | {"hint": _text(limits.max_chars)})

    def fields(self, obj: dict, cfg: HintConfig) -> dict | None:
        """``{"hint": str}`` (plus the model's ``"reasoning"`` when it gave one) or None (no hint, or blank)."""
        hint = obj.get("hint")
        if not isinstance(hint, str):
            return None
        hint = " ".join(hint.split())
        if not hint:
            return None
        out = {"hint": hint[:_MAX_PARSED_HINT]}  # the rules judge its length; this only bounds a runaway answer
        if isinstance(obj.get("reasoning"), str):
            out["reasoning"] = obj["reasoning"]
        return out


class Judgment(Agent):
    """3. problem, reference, hint -> {check, correct, score, feedback} (after the rules pass)."""

    name = "judgment"
    templates = {"judgment_system": frozenset(), "judgment_user": frozenset({"problem", "answer", "solution", "hint"})}
    max_tokens_default, max_tokens_help = 260, "max_tokens of a judgment call (check + verdict + feedback)."

    def attempt(self, s: State) -> int:
        return s.cand_no - 1  # the candidate it judges

    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]:
        row = s.row
        return self._chat(t, t.render("judgment_user", problem=row["problem"], answer=reference_text(row),
                                      solution=solution_in_view(row, cfg), hint=s.candidate or ""))

    def schema(self, cfg: HintConfig, limits: RuleLimits) -> dict:
        """``{"check", "score", "feedback"}``; with judge_correctness a ``"correct"`` verdict after the check.

        The check comes first: the judge goes through the hint's numbers and claims before its verdict. Asked
        for the verdict first, the 1.5B judged completeness ("the hint does not provide the total") and
        accepted 13 of 51 reference first steps on the dev problems; checking first, 47 of 51
        (docs/hint-pipeline.md, "Models")."""
        correct = {"correct": {"type": "boolean"}} if cfg.judge_correctness else {}
        return _object({"check": _text(CHECK_CHARS)} | correct
                       | {"score": {"type": "integer", "minimum": 1, "maximum": 10}, "feedback": _text(cfg.feedback_chars)})

    def parse(self, text: str, cfg: HintConfig) -> dict | None:
        """As `Agent.parse`; a verdict cut off inside its feedback (max_tokens reached) still gives its verdict:
        the grammar writes ``check``, ``correct`` and ``score`` first, so the string is closed and the feedback
        kept as far as it got. One cut off before its score gives none."""
        obj = json_object(text)
        if obj is None:
            cut = strip_thinking(text).rstrip()
            head = cut.split('"feedback"', 1)
            if len(head) == 2 and cut.lstrip().startswith("{") and head[1].lstrip().startswith(":"):
                obj = json_object(cut.rstrip("\\") + '"}')
        return None if obj is None else self.fields(obj, cfg)

    def fields(self, obj: dict, cfg: HintConfig) -> dict | None:
        """``{"score": float in [1, 10], "feedback": str}`` (+ ``"correct"`` when given) or None."""
        score = obj.get("score")
        if isinstance(score, str):
            try:
                score = float(score.strip())
            except ValueError:
                return None
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 1 <= score <= 10:
            return None
        out = {"score": float(score), "feedback": _clean_str(obj.get("feedback"), cfg.feedback_chars) or ""}
        if isinstance(obj.get("correct"), bool):
            out["correct"] = obj["correct"]
        return out


class Repair(Generation):
    """4. problem, rejected hint, violations, feedback -> {hint} (the schema and parse of generation)."""

    name = "repair"
    templates = {"repair_system": frozenset(),
                 "repair_user": frozenset({"problem", "answer", "solution", "hint", "violations", "feedback"})}
    max_tokens_default, max_tokens_help = 360, "max_tokens of a repair call (reasoning + hint)."

    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]:
        row = s.row
        reasons = "\n".join(f"- {describe(v)}" for v in s.last_violations) or "- (none given)"
        return self._chat(t, t.render("repair_user", problem=row["problem"], answer=reference_text(row),
                                      solution=solution_in_view(row, cfg), hint=s.candidate or "",
                                      violations=reasons, feedback=s.feedback or "(none)"))


ATTRIBUTION, GENERATION, JUDGMENT, REPAIR = Attribution(), Generation(), Judgment(), Repair()
AGENTS: dict[str, Agent] = {a.name: a for a in (ATTRIBUTION, GENERATION, JUDGMENT, REPAIR)}
# template name -> the placeholders it may use: every agent's, and the fallbacks'
TEMPLATE_VARS: dict[str, frozenset[str]] = {k: v for a in AGENTS.values() for k, v in a.templates.items()} | FALLBACK_TEMPLATES


# --------------------------------------------------------------------------- demo fake


def fake_script(req: GenRequest) -> str:
    """The `--backend fake` model: well-formed, answer-free JSON for each agent (tests and demos only)."""
    props = (req.json_schema or {}).get("properties", {})
    if "keywords" in props:
        return '{"keywords": ["quantities asked for", "units"], "error": "The attempts answer a different quantity than the one asked."}'
    if "score" in props:
        return '{"score": 8, "feedback": "Specific and answer-free."}'
    return '{"hint": "Work out exactly which quantity the question asks for, then relate the given quantities to it one at a time."}'
