"""The ``fake`` backend: deterministic, scriptable answers for tests and demos of the plumbing (no model runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mentor.pipeline.backends import BackendKind
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.llm import CountingBackend, GenRequest, GenResult, OnDone, resolve_callable

Script = Callable[[GenRequest], "str | GenResult"]


def echo_script(req: GenRequest) -> str:
    """Default fake answer: valid JSON `{}` for schema requests, else the last user message echoed."""
    if req.json_schema is not None:
        return "{}"
    return next((m.get("content", "") for m in reversed(req.messages) if m.get("role") == "user"), "")


def _approx_tokens(text: str) -> int:
    # A cheap, deterministic stand-in for a tokenizer (≈4 characters a token).
    return (len(text) + 3) // 4


class FakeBackend(CountingBackend):
    """Deterministic backend for tests: answers come from `script(request)`.

    `script` returns the text (finish reason "stop", or "length" when the text
    is cut at ``max_tokens`` approximate tokens), or a full `GenResult` to
    script finish reasons and token counts; its `id` is replaced by the
    request's id. Every request is recorded in `log` when `record=True`.
    """

    name = "fake"

    def __init__(self, script: Script | str | None = None, model: str = "fake", record: bool = True) -> None:
        super().__init__(model)
        self.script: Script = resolve_callable(script) if isinstance(script, str) else (script or echo_script)
        self.record = record
        self.log: list[list[GenRequest]] = []

    def _generate(self, requests: Sequence[GenRequest], on_done: OnDone | None) -> list[GenResult]:
        if self.record:
            self.log.append(list(requests))
        return super()._generate(requests, on_done)

    def _answer(self, req: GenRequest) -> GenResult:
        ans = self.script(req)
        if isinstance(ans, GenResult):
            return GenResult(req.id, ans.text, ans.finish_reason, ans.prompt_tokens, ans.completion_tokens, ans.error)
        text = str(ans)
        ct = _approx_tokens(text)
        finish = "stop"
        if ct > req.max_tokens:
            text, ct, finish = text[: req.max_tokens * 4], req.max_tokens, "length"
        pt = _approx_tokens(req.prompt) if req.prompt is not None else sum(_approx_tokens(m.get("content", "")) for m in req.messages)
        return GenResult(req.id, text, finish, pt, ct)


class Fake(BackendKind):
    """Options: ``script`` (a callable or ``"module:attr"``; default `echo_script`), ``record``."""

    name = "fake"
    what = "tests"
    help = "canned answers (tests, demos of the plumbing)"

    def check(self, model: str | None, options: dict[str, Any], where: str) -> None:
        super().check(model, options, where)
        if isinstance(options.get("script"), str):
            try:
                resolve_callable(options["script"])
            except ConfigError as exc:
                raise ConfigError(f"{where}.options.script: {exc}") from None

    def make(self, model: str | None, options: dict[str, Any]) -> FakeBackend:
        options = dict(options)
        return FakeBackend(script=options.pop("script", None), model=model or "fake", **options)

    def from_flags(self, model: str | None, flags: dict[str, Any]) -> dict[str, Any]:
        return {"script": flags["script"]} if flags.get("script") else {}


BACKEND = Fake()

__all__ = ["BACKEND", "FakeBackend", "echo_script"]
