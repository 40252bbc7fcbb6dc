"""The ``openai`` backend: an OpenAI-compatible server someone else runs (``vllm serve``, SGLang) at base_url.

The client itself is `mentor.pipeline.backends.openai.client` (the only module that talks to a server);
this module owns the kind's settings: what it needs (base_url and the served model name), the options it
takes, and what the command line's server flags give it.
"""

from __future__ import annotations

from typing import Any

from mentor.pipeline.backends import BackendKind
from mentor.pipeline.backends.openai.client import (DEFAULT_TIMEOUT, STRUCTURED_MODES, OpenAIBackend, check_base_url,
                                                     check_server_options)
from mentor.pipeline.errors import ConfigError

SERVER_OPTIONS = ("base_url", "api_key", "max_concurrency", "max_retries", "timeout", "structured_output")


class OpenAI(BackendKind):
    """Options: ``base_url`` (required), ``api_key``, ``max_concurrency``, ``max_retries``, ``timeout``,
    ``structured_output``; the model is the name the server serves (engine settings belong to the server)."""

    name = "openai"
    what = "a server"
    help = "an OpenAI-compatible server (vllm serve, SGLang) at --base-url, --model being the name it serves"
    server = True
    schema_fix = "a server without structured output needs structured_output: none"

    def problem(self, model: str | None, base_url: str | None) -> str | None:
        missing = ([] if base_url else ["base_url, the server's URL (--base-url http://HOST:PORT/v1)"]) + \
            ([] if model else ["model, the name the server serves (--model NAME; GET BASE_URL/models lists them)"])
        return f"backend {self.name} needs {' and '.join(missing)}" if missing else None

    def check(self, model: str | None, options: dict[str, Any], where: str) -> None:
        if options.get("base_url"):
            check_base_url(options["base_url"], f"{where}.base_url")
        super().check(model, options, where)
        unknown = sorted(set(options) - set(SERVER_OPTIONS))
        if unknown:
            raise ConfigError(f"{where}.options.{unknown[0]}: not an option of the {self.name} backend (engine settings "
                              f"belong to the server); options: {', '.join(SERVER_OPTIONS)}")
        check_server_options(options, f"{where}.options")

    def make(self, model: str | None, options: dict[str, Any]) -> OpenAIBackend:
        """An `OpenAIBackend` (nothing to start or keep: the server is someone else's)."""
        self.check(model, options, "backend")
        return OpenAIBackend(model, **options)

    def from_flags(self, model: str | None, flags: dict[str, Any]) -> dict[str, Any]:
        """The server's options from --base-url, --max-concurrency, --structured-output, --request-timeout;
        an engine flag given is refused (a server's engine is set where it is started)."""
        problem = self.problem(model, flags.get("base_url"))
        if problem:
            raise ConfigError(problem)
        given = [flag for flag, (_, v) in (flags.get("engine") or {}).items() if v is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: engine settings of a server are set where it is started (vllm serve ...), "
                              f"not by mentor; drop them with --backend {self.name}")
        return {"base_url": check_base_url(flags["base_url"], "--base-url"),
                "max_concurrency": flags.get("max_concurrency", 64),
                "structured_output": flags.get("structured_output", STRUCTURED_MODES[0]),
                "timeout": flags.get("request_timeout", DEFAULT_TIMEOUT)}

    def probe(self, model: str | None, base_url: str | None, settings: dict[str, Any]) -> dict[str, Any]:
        # One attempt, bounded by --timeout: a server that accepts and never answers is a problem in seconds.
        return {"base_url": base_url, "timeout": settings["timeout"], "max_retries": 0}


BACKEND = OpenAI()

__all__ = ["BACKEND", "DEFAULT_TIMEOUT", "SERVER_OPTIONS", "OpenAIBackend", "check_base_url"]
