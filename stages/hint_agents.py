"""The four hint agents, each a pure pair around the backend seam.

    build_messages(row, ...) -> chat messages        parse(text, row) -> fields | None

1. attribution  problem, reference, failed responses -> {keywords, error}
2. generation   problem, keywords, error (+ the last hint of an earlier round) -> {hint}
3. judgment     problem, reference, hint -> {score, feedback}   (after the rules pass)
4. repair       problem, rejected hint, violations, feedback -> {hint}

Prompts come from versioned template files (``stages/templates/*.txt``,
``{{name}}`` placeholders), overridable per file from a user directory; the
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
from pathlib import Path
from typing import Any

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.llm import GenRequest

TEMPLATE_DIR = Path(__file__).parent / "templates"

# template name -> the placeholders it may use
TEMPLATE_VARS: dict[str, frozenset[str]] = {
    "attribution_system": frozenset(),
    "attribution_user": frozenset({"problem", "answer", "failed"}),
    "generation_system": frozenset(),
    "generation_user": frozenset({"problem", "answer", "diagnosis", "keywords", "error", "escalation", "retry"}),
    "generation_diagnosis": frozenset({"keywords", "error"}),
    "generation_escalation": frozenset({"previous_hint"}),
    "generation_retry": frozenset({"violations"}),
    "judgment_system": frozenset(),
    "judgment_user": frozenset({"problem", "answer", "hint"}),
    "repair_system": frozenset(),
    "repair_user": frozenset({"problem", "answer", "hint", "violations", "feedback"}),
    "fallback_keywords": frozenset({"keywords"}),
    "fallback_math": frozenset(),
    "fallback_code": frozenset(),
}
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return ""


class Templates:
    """The effective prompt templates, compiled for fast rendering."""

    def __init__(self, texts: dict[str, str], sources: dict[str, str] | None = None) -> None:
        self.texts = texts
        self.sources = sources or {}
        # Each template becomes a str.format string (literal braces escaped), rendered in C.
        self._formats: dict[str, str] = {}
        for name, text in texts.items():
            pieces = _PLACEHOLDER.split(text)
            literals, names = pieces[0::2], pieces[1::2]
            bad = sorted(set(names) - TEMPLATE_VARS[name])
            if bad:
                where = self.sources.get(name, name)
                raise ConfigError(
                    f"{where}: unknown placeholder(s) {bad}; {name} may use {sorted(TEMPLATE_VARS[name]) or 'none'}"
                )
            fmt = [literals[0].replace("{", "{{").replace("}", "}}")]
            for var, lit in zip(names, literals[1:]):
                fmt.append("{" + var + "}")
                fmt.append(lit.replace("{", "{{").replace("}", "}}"))
            self._formats[name] = "".join(fmt)
        blob = json.dumps(texts, sort_keys=True).encode()
        self.version = hashlib.sha256(blob).hexdigest()[:12]

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
            texts[name] = path.read_text(encoding="utf-8")
            sources[name] = str(path)
        return cls(texts, sources)

    def render(self, name: str, **values: str) -> str:
        """The template with its placeholders filled (absent values render as "")."""
        return self._formats[name].format_map(_Blank(values))

    def lines(self, name: str) -> list[str]:
        return [ln.strip() for ln in self.texts[name].splitlines() if ln.strip()]


# --------------------------------------------------------------------------- JSON schemas


def attribution_schema(max_keywords: int, keyword_chars: int, error_chars: int) -> dict:
    return {
        "type": "object",
        "properties": {
            "keywords": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": keyword_chars},
                "minItems": 1,
                "maxItems": max_keywords,
            },
            "error": {"type": "string", "minLength": 1, "maxLength": error_chars},
        },
        "required": ["keywords", "error"],
        "additionalProperties": False,
    }


def hint_schema(max_chars: int, reasoning_chars: int = 0) -> dict:
    """``{"hint"}``, or ``{"reasoning", "hint"}``: the model works the problem out first, then writes the hint."""
    props: dict = {}
    if reasoning_chars:
        props["reasoning"] = {"type": "string", "minLength": 1, "maxLength": reasoning_chars}
    props["hint"] = {"type": "string", "minLength": 1, "maxLength": max_chars}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def judgment_schema(feedback_chars: int, correctness: bool = False) -> dict:
    """``{"score", "feedback"}``; with `correctness` a ``"correct"`` verdict comes first."""
    props: dict = {}
    if correctness:
        props["correct"] = {"type": "boolean"}
    props["score"] = {"type": "integer", "minimum": 1, "maximum": 10}
    props["feedback"] = {"type": "string", "minLength": 1, "maxLength": feedback_chars}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


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


# --------------------------------------------------------------------------- 1. attribution


def attribution_messages(row: dict, t: Templates, max_failed: int = 2, failed_chars: int = 1500) -> list[dict]:
    user = t.render(
        "attribution_user",
        problem=row["problem"],
        answer=reference_text(row),
        failed=format_failed(row.get("failed"), max_failed, failed_chars),
    )
    return [{"role": "system", "content": t.texts["attribution_system"]}, {"role": "user", "content": user}]


def parse_attribution(text: str, row: dict | None = None, max_keywords: int = 5, keyword_chars: int = 40, error_chars: int = 240) -> dict | None:
    """``{"keywords": [...], "error": str | None}`` or None when there is no usable keyword."""
    obj = json_object(text)
    if obj is None:
        return None
    kws = obj.get("keywords")
    if isinstance(kws, str):
        kws = [k for k in re.split(r"[,;]", kws)]
    if not isinstance(kws, list):
        return None
    keywords: list[str] = []
    for k in kws:
        k = _clean_str(k, keyword_chars)
        if k and k.lower() not in {x.lower() for x in keywords}:
            keywords.append(k)
    keywords = keywords[:max_keywords]
    if not keywords:
        return None
    return {"keywords": keywords, "error": _clean_str(obj.get("error"), error_chars)}


# --------------------------------------------------------------------------- 2. generation


def generation_messages(
    row: dict,
    keywords: list[str],
    error: str | None,
    t: Templates,
    rejected: list[str] | None = None,
    diagnosis: bool = True,
) -> list[dict]:
    """`diagnosis` False: the Attribution agent did not run (an ablation), the prompt has the problem alone."""
    previous = row.get("previous_hints") or []
    escalation = t.render("generation_escalation", previous_hint=previous[-1]) if previous else ""
    retry = t.render("generation_retry", violations=", ".join(rejected)) if rejected else ""
    kws, err = ", ".join(keywords) if keywords else "(none)", error or "(unknown)"
    user = t.render(
        "generation_user",
        problem=row["problem"],
        answer=reference_text(row),
        diagnosis=t.render("generation_diagnosis", keywords=kws, error=err) if diagnosis else "",
        keywords=kws,
        error=err,
        escalation=escalation,
        retry=retry,
    )
    return [{"role": "system", "content": t.texts["generation_system"]}, {"role": "user", "content": user}]


def parse_hint(text: str, row: dict | None = None, max_chars: int = 10_000) -> dict | None:
    """``{"hint": str}`` (plus the model's ``"reasoning"`` when it gave one) or None (not JSON, no hint, or blank)."""
    obj = json_object(text)
    if obj is None:
        return None
    hint = obj.get("hint")
    if not isinstance(hint, str):
        return None
    hint = " ".join(hint.split())
    if not hint:
        return None
    out = {"hint": hint[:max_chars]}
    if isinstance(obj.get("reasoning"), str):
        out["reasoning"] = obj["reasoning"]
    return out


# --------------------------------------------------------------------------- 3. judgment


def judgment_messages(row: dict, hint: str, t: Templates) -> list[dict]:
    user = t.render("judgment_user", problem=row["problem"], answer=reference_text(row), hint=hint)
    return [{"role": "system", "content": t.texts["judgment_system"]}, {"role": "user", "content": user}]


def parse_judgment(text: str, row: dict | None = None, feedback_chars: int = 240) -> dict | None:
    """``{"score": float in [1, 10], "feedback": str}`` or None."""
    obj = json_object(text)
    if obj is None:
        return None
    score = obj.get("score")
    if isinstance(score, str):
        try:
            score = float(score.strip())
        except ValueError:
            return None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 1 <= score <= 10:
        return None
    out = {"score": float(score), "feedback": _clean_str(obj.get("feedback"), feedback_chars) or ""}
    if isinstance(obj.get("correct"), bool):
        out["correct"] = obj["correct"]
    return out


# --------------------------------------------------------------------------- 4. repair


def repair_messages(row: dict, hint: str, violations: list[str], feedback: str | None, t: Templates) -> list[dict]:
    from mentor.stages.hint_rules import DESCRIPTIONS

    reasons = "\n".join(f"- {DESCRIPTIONS.get(v, v)}" for v in violations) or "- (none given)"
    user = t.render("repair_user", problem=row["problem"], answer=reference_text(row), hint=hint, violations=reasons,
                    feedback=feedback or "(none)")
    return [{"role": "system", "content": t.texts["repair_system"]}, {"role": "user", "content": user}]


# --------------------------------------------------------------------------- demo fake


def fake_script(req: GenRequest) -> str:
    """The `--backend fake` model: well-formed, answer-free JSON for each agent (tests and demos only)."""
    props = (req.json_schema or {}).get("properties", {})
    if "keywords" in props:
        return '{"keywords": ["quantities asked for", "units"], "error": "The attempts answer a different quantity than the one asked."}'
    if "score" in props:
        return '{"score": 8, "feedback": "Specific and answer-free."}'
    return '{"hint": "Work out exactly which quantity the question asks for, then relate the given quantities to it one at a time."}'
