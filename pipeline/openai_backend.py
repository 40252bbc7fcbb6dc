"""The OpenAI-compatible server backend: `vllm serve`, SGLang, or any server a team already runs.

A wave of requests goes to the server concurrently (at most ``max_concurrency``
in flight; the server batches them as vLLM's offline engine would), through the
official ``openai`` client. Each request keeps what the in-process engine gives
it: its own ``seed``, ``temperature``/``top_p``/``max_tokens``, its JSON schema,
and its chat-template variables (``extra_body.chat_template_kwargs``, how vLLM
and SGLang take e.g. ``enable_thinking``). Results come back in request order,
paired by position, never by text.

Structured output, by ``structured_output``:

- ``response_format`` (default): OpenAI's ``{"type": "json_schema", ...}``,
  which vLLM (and SGLang) turn into the same grammar as the offline engine;
- ``structured_outputs``: vLLM's own extra body field (``{"json": schema}``);
- ``none``: no grammar. The agents' prompts still ask for JSON and their
  parsers read the first JSON object of the answer (after any ``<think>``
  block), so a server without structured output works, with more parse
  failures from a small model. A server that rejects the schema answers 400 to
  every request; the wave then fails with one error that says to use ``none``.

Errors. The client retries connection errors, timeouts, 429 and 5xx with
exponential backoff (``max_retries``); a server still down after that, a model
it does not serve or a refused key is one `EngineError` naming the URL, which
the stage turns into a message that keeps the finished shards (a rerun resumes).
A 400 for one request (its prompt is longer than the server's context) is that
request's ``error`` result; 400 for every request of a wave is a setup problem
and fails the wave.

Nothing to close: the server belongs to whoever started it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import Any

from mentor.pipeline.errors import ConfigError, EngineError
from mentor.pipeline.llm import CountingBackend, GenRequest, GenResult, OnDone

log = logging.getLogger(__name__)

STRUCTURED_MODES = ("response_format", "structured_outputs", "none")


class OpenAIBackend(CountingBackend):
    """Chat completions from an OpenAI-compatible server, a wave at a time, concurrently."""

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        max_concurrency: int = 64,
        max_retries: int = 4,
        timeout: float = 3600.0,
        structured_output: str = "response_format",
        check: bool = True,
    ) -> None:
        super().__init__(model)
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - vllm depends on it
            raise ConfigError("the openai backend needs the openai client: pip install openai") from exc
        if structured_output not in STRUCTURED_MODES:
            raise ConfigError(f"structured_output {structured_output!r}: choose one of {', '.join(STRUCTURED_MODES)}")
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self._openai = openai
        self.base_url = base_url.rstrip("/")
        # vLLM serve accepts any key unless started with --api-key; OPENAI_API_KEY when set.
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout = timeout
        self.structured_output = structured_output
        if check:
            self._check_model()

    # ------------------------------------------------------------------ setup

    def _client(self, asynchronous: bool):
        cls = self._openai.AsyncOpenAI if asynchronous else self._openai.OpenAI
        return cls(base_url=self.base_url, api_key=self.api_key, max_retries=self.max_retries, timeout=self.timeout)

    def _check_model(self) -> None:
        """Fail now, with the URL, when the server is down or does not serve the model."""
        openai = self._openai
        try:
            with self._client(asynchronous=False) as client:
                served = [m.id for m in client.models.list()]
        except openai.AuthenticationError as exc:
            raise EngineError(f"the server at {self.base_url} refused the API key (set OPENAI_API_KEY or api_key): {exc}") from exc
        except openai.APIError as exc:
            raise EngineError(f"the server at {self.base_url} did not answer ({_one_line(exc)}) after {self.max_retries} "
                              "retries: is it running, and is the URL right (it ends in /v1)?") from exc
        if self.model not in served:
            raise EngineError(f"the server at {self.base_url} does not serve model {self.model!r} (it serves: "
                              f"{', '.join(served) or 'nothing'}); pass one of those as --model")

    def _body(self, req: GenRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": req.messages,
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
        }
        if req.seed is not None:
            body["seed"] = req.seed
        extra: dict[str, Any] = {}
        if req.chat_template_kwargs:
            extra["chat_template_kwargs"] = req.chat_template_kwargs
        if req.json_schema is not None:
            if self.structured_output == "response_format":
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": req.json_schema}}
            elif self.structured_output == "structured_outputs":
                extra["structured_outputs"] = {"json": req.json_schema}
        if extra:
            body["extra_body"] = extra
        return body

    # ------------------------------------------------------------------ generation

    async def _one(self, client, sem: asyncio.Semaphore, req: GenRequest, on_done: OnDone | None) -> GenResult | Exception:
        openai = self._openai
        async with sem:
            try:
                resp = await client.chat.completions.create(**self._body(req))
            except openai.BadRequestError as exc:
                return exc  # this request's problem, unless every request of the wave has it
            finally:
                if on_done is not None:
                    on_done(1)
        choice = resp.choices[0] if resp.choices else None
        usage = resp.usage
        pt = usage.prompt_tokens if usage else 0
        ct = usage.completion_tokens if usage else 0
        if choice is None:
            return GenResult(req.id, "", "error", pt, ct)
        return GenResult(req.id, choice.message.content or "", choice.finish_reason or "stop", pt, ct)

    async def _wave(self, requests: Sequence[GenRequest], on_done: OnDone | None) -> list[GenResult | Exception]:
        sem = asyncio.Semaphore(self.max_concurrency)
        async with self._client(asynchronous=True) as client:
            return await asyncio.gather(*(self._one(client, sem, r, on_done) for r in requests))

    def _generate(self, requests: Sequence[GenRequest], on_done: OnDone | None) -> list[GenResult]:
        if any(r.prompt is not None for r in requests):
            raise ConfigError("prompts rendered to text (placement assistant) go to the vllm backend; through a server "
                              "use another placement (--placement after)")
        openai = self._openai
        try:
            outs = _run(self._wave(requests, on_done))
        except openai.AuthenticationError as exc:
            raise EngineError(f"the server at {self.base_url} refused the API key: {_one_line(exc)}") from exc
        except openai.NotFoundError as exc:
            raise EngineError(f"the server at {self.base_url} has no model {self.model!r} any more ({_one_line(exc)})") from exc
        except openai.APIError as exc:
            raise EngineError(f"the server at {self.base_url} failed on a wave of {len(requests)} requests "
                              f"({_one_line(exc)}) after {self.max_retries} retries") from exc
        bad = [o for o in outs if isinstance(o, Exception)]
        if bad and len(bad) == len(outs):
            hint = "; if it does not support JSON schemas, use structured_output: none" if any(r.json_schema for r in requests) else ""
            raise EngineError(f"the server at {self.base_url} rejected all {len(outs)} requests of a wave "
                              f"({_one_line(bad[0])}){hint}")
        if bad:
            log.warning("the server at %s rejected %d of %d requests (e.g. %s): they count as errors",
                        self.base_url, len(bad), len(outs), _one_line(bad[0]))
        return [GenResult(r.id, "", "error") if isinstance(o, Exception) else o for r, o in zip(requests, outs)]


def _run(coro):
    """Run `coro` to completion from sync code, also where an event loop is already running (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:240]}" if text else type(exc).__name__


__all__ = ["STRUCTURED_MODES", "OpenAIBackend"]
