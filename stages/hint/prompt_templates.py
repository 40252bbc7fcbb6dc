"""The prompt templates of the hint agents: versioned files, jinja2 with ``{{ name }}`` placeholders.

Each agent's templates are ``<template>.txt`` files beside its module (the built-in
ones and the fallbacks in ``stages/hint/agents/``, `TEMPLATE_DIR`), each overridable
from a user directory (``templates_dir`` / ``--templates``); the hash of the effective
templates is the ``prompt_version`` of every hint row.

Layout for vLLM's prefix cache: the system message holds an agent's fixed
instructions (shared by every problem), the user message starts with the
problem text (shared by every wave of one problem), the variable parts come
last.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jinja2
import jinja2.meta
from jinja2.sandbox import SandboxedEnvironment

from mentor.pipeline.errors import ConfigError
from mentor.stages.hint.agents import AGENTS

TEMPLATE_DIR = Path(__file__).parent / "agents"  # the bundled templates (plugin agents keep theirs beside them)

# Templates no agent owns: the safe defaults a problem falls back to (`Agent.templates` holds the others).
FALLBACK_TEMPLATES: dict[str, frozenset[str]] = {
    "fallback_keywords": frozenset({"keywords"}),
    "fallback_math": frozenset(),
    "fallback_code": frozenset(),
}
# template name -> the placeholders it may use: every agent's, and the fallbacks'
TEMPLATE_VARS: dict[str, frozenset[str]] = {k: v for a in AGENTS.values() for k, v in a.templates.items()} | FALLBACK_TEMPLATES
# template name -> the folder of its bundled file
TEMPLATE_HOME: dict[str, Path] = {k: a.folder for a in AGENTS.values() for k in a.templates} | {k: TEMPLATE_DIR for k in FALLBACK_TEMPLATES}

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
            path = user / f"{name}.txt" if user is not None and (user / f"{name}.txt").is_file() else TEMPLATE_HOME[name] / f"{name}.txt"
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


__all__ = ["FALLBACK_TEMPLATES", "TEMPLATE_DIR", "TEMPLATE_VARS", "Templates"]
