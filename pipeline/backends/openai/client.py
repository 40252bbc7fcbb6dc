"""The client of the ``openai`` backend (its kind: `mentor.pipeline.backends.openai`): `vllm serve`, SGLang, or any
OpenAI-compatible server a team already runs; the only module that talks to a server.

Requests go to the server concurrently (at most ``max_concurrency`` in flight,
however many callers: the server batches them as vLLM's offline engine batches
a wave), through the official ``openai`` client. Each request keeps what the
in-process engine gives it: its own ``seed``, ``temperature``/``top_p``/``max_tokens``,
its JSON schema, and its chat-template variables (``extra_body.chat_template_kwargs``,
how vLLM and SGLang take e.g. ``enable_thinking``). A prompt already rendered with the
policy's chat template (placement ``assistant``: `pipeline.policy_template`) goes to the
completions API (``POST /completions``) as that text, with ``add_special_tokens: false``
(the text holds the template's BOS), so the server conditions on the very text the
trainers get; the chat API's ``continue_final_message`` would render the hint as a
finished past turn (Qwen3's template then closes an empty think block). ``max_tokens``
never exceeds the ``max_model_len`` the server reports for the model in ``GET /models``
(vLLM refuses more with a 400 on every request): it is capped there, with a warning. Results come back in request
order, paired by position, never by text. The backend is ``concurrent``: many
`generate` calls may run at once from threads (the hint stage runs each problem's
chain of requests on its own, so no wave waits for its slowest request).

Structured output, by ``structured_output``:

- ``response_format`` (default): OpenAI's ``{"type": "json_schema", ...}``,
  which vLLM (and SGLang) turn into the same grammar as the offline engine;
- ``structured_outputs``: vLLM's own extra body field (``{"json": schema}``);
- ``none``: no grammar. The agents' prompts still ask for JSON and their
  parsers read the first JSON object of the answer (after any ``<think>``
  block), so a server without structured output works, with more parse
  failures from a small model.

Waits. Every request waits at most ``timeout`` seconds (``--request-timeout``)
for its answer, connecting at most 10 s. Connection errors, 408/409, 429 and 5xx
are retried with exponential backoff (``max_retries``); a timeout is not: the
server took the request and said nothing for a whole ``timeout``. When nothing at
all came back from the server for the last half of that request's wait, the server is hung:
`EngineError` at once, naming the URL and the requests still pending (so a hung
server fails the stage within one ``timeout`` of silence, not ``timeout`` times
every retry); when other requests were answered meanwhile, only this one failed
(its result says so). A request left without an answer for `NOTICE_AFTER`
seconds says, once, how long it will still wait. The check at start
(``GET /models``) waits at most 30 s (never longer than ``timeout``), once;
a refused connection is tried twice.

Errors. What makes every request fail is one `EngineError` naming the URL: a
server that is down at start, a model it does not serve, a refused key, an
answer to ``GET /models`` that is not a model list. What happens to one request
stays with it: a request that still fails after the client's retries (a 400
for a prompt longer than the server's context, a timeout, an answer that is not
a chat completion: torn JSON, HTML, no ``choices``, no ``message``) is that
request's result with finish reason ``error`` and the reason in ``error``; the
stage decides (the hint stage moves the problem along as a failed model call
and counts it; a rollout without a response is never a failed rollout).
A server that answers nothing usable is still an error: every request of a wave
of two or more failing, or `FAIL_STREAK` requests in a row failing, raise
`EngineError` with the reason (and, when the server refused JSON schemas, the
way out: ``structured_output: none``).

Nothing to close but the connections: the server belongs to whoever started it.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from mentor.pipeline.backends import REQUEST_TIMEOUT
from mentor.pipeline.errors import ConfigError, EngineError
from mentor.pipeline.llm import CountingBackend, GenRequest, GenResult, OnDone, concurrently

log = logging.getLogger(__name__)

STRUCTURED_MODES = ("response_format", "structured_outputs", "none")
DEFAULT_TIMEOUT = REQUEST_TIMEOUT  # seconds per attempt of one request
CONNECT_TIMEOUT = 10.0
CHECK_TIMEOUT = 30.0  # GET /models at start
FAIL_STREAK = 16  # this many requests in a row without an answer: the server is broken, not the requests
NOTICE_AFTER = 30.0  # seconds without an answer before a request's wait is announced (with how long it may last)
HUNG_SILENCE = 0.5  # a timed-out request with no answer from the server for this share of a timeout: hung
RETRY_STATUS = (408, 409, 429)  # and 5xx: retried with backoff, as the openai client would
MAX_THREADS = 1024


def check_base_url(url: Any, where: str = "--base-url") -> str:
    """`url` without its trailing slash, or a `ConfigError` naming `where` and the form it should have."""
    example = "e.g. http://127.0.0.1:8000/v1"
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{where}: the server's URL is missing ({example})")
    if url != url.strip() or any(c.isspace() for c in url):
        raise ConfigError(f"{where} {url!r}: a URL has no spaces ({example})")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{where} {url!r}: not a URL ({exc}); {example}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where} {url!r}: not an http:// or https:// URL with a host; {example}")
    if parts.query or parts.fragment:
        raise ConfigError(f"{where} {url!r}: the server's base URL has no ?query or #fragment; {example}")
    if port == 0:
        raise ConfigError(f"{where} {url!r}: port 0 is not a server's port; {example}")
    return url.rstrip("/")


def _positive_seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}: must be a number of seconds > 0, got {value!r}")
    return float(value)


def _count(value: Any, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name}: must be a whole number >= {least}, got {value!r}")
    return value


def check_server_options(options: dict[str, Any], where: str = "") -> None:
    """The server backend's options (the one place they are checked: a workflow at load, `OpenAIBackend` when
    built), each error naming ``<where>.<option>`` (the option alone without `where`)."""
    def name(option: str) -> str:
        return f"{where}.{option}" if where else option

    if "base_url" in options:
        check_base_url(options["base_url"], name("base_url"))
    if "max_concurrency" in options:
        _count(options["max_concurrency"], name("max_concurrency"), 1)
    if "max_retries" in options:
        _count(options["max_retries"], name("max_retries"), 0)
    if "timeout" in options:
        _positive_seconds(options["timeout"], name("timeout"))
    if options.get("structured_output", "response_format") not in STRUCTURED_MODES:
        raise ConfigError(f"{name('structured_output')}: {options['structured_output']!r}: choose one of {', '.join(STRUCTURED_MODES)}")
    if "api_key" in options and not isinstance(options["api_key"], (str, type(None))):
        raise ConfigError(f"{name('api_key')}: must be text (or leave it out and set OPENAI_API_KEY)")


class OpenAIBackend(CountingBackend):
    """Chat completions from an OpenAI-compatible server, as many at once as ``max_concurrency`` allows."""

    name = "openai"
    concurrent = True

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        max_concurrency: int = 64,
        max_retries: int = 4,
        timeout: float = DEFAULT_TIMEOUT,
        structured_output: str = "response_format",
        check: bool = True,
    ) -> None:
        super().__init__(model)
        try:
            import openai  # optional (the server extra)
        except ImportError as exc:  # pragma: no cover - vllm depends on it
            raise ConfigError("the openai backend needs the openai client: pip install openai") from exc
        check_server_options({"base_url": base_url, "api_key": api_key, "max_concurrency": max_concurrency,
                              "max_retries": max_retries, "timeout": timeout, "structured_output": structured_output})
        self._openai = openai
        self.base_url = base_url.rstrip("/")
        # vLLM serve accepts any key unless started with --api-key; OPENAI_API_KEY when set.
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.max_concurrency, self.max_retries, self.timeout = max_concurrency, max_retries, float(timeout)
        self.structured_output = structured_output
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._lock = threading.Lock()
        self._http: Any = None
        self.answered = 0
        self.failed = 0
        self._streak = 0
        # The context the server reports for the model (vLLM's GET /models: max_model_len); None: not reported.
        self.max_model_len: int | None = None
        self._capped = False
        self._heard = time.monotonic()  # when the server last answered anything (start: when the backend was made)
        self._pending: dict[int, tuple[str, float]] = {}  # in-flight requests: key -> (request id, sent at)
        self._noticed = 0.0  # the silence (its start) already announced
        self._keys = itertools.count()
        self._watch: threading.Thread | None = None
        if check:
            self._check_model()
            self._heard = time.monotonic()

    # ------------------------------------------------------------------ setup

    def _new_client(self, timeout: float, max_retries: int):
        t = self._openai.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT))
        return self._openai.OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=max_retries, timeout=t)

    def _client(self):
        with self._lock:
            if self._http is None:  # retries are ours (`_post`): a timeout is never retried
                self._http = self._new_client(self.timeout, 0)
            return self._http

    def close(self) -> None:
        with self._lock:
            if self._http is not None:
                self._http.close()
                self._http = None

    def _check_model(self) -> None:
        """Fail now, with the URL, when the server is down, is not an OpenAI-compatible server, or does not serve the model."""
        openai = self._openai
        where = f"the server at {self.base_url}"
        try:
            with self._new_client(min(self.timeout, CHECK_TIMEOUT), 0) as client:
                try:
                    resp = client.models.with_raw_response.list().http_response
                except openai.APITimeoutError:
                    raise
                except openai.APIConnectionError:  # refused / reset: once more (a server still starting)
                    if self.max_retries < 1:
                        raise
                    time.sleep(0.5)
                    resp = client.models.with_raw_response.list().http_response
        except openai.AuthenticationError as exc:
            raise EngineError(f"{where} refused the API key (set OPENAI_API_KEY or api_key): {_one_line(exc)}") from exc
        except openai.APIStatusError as exc:
            raise EngineError(f"{where} answered GET /models with {_one_line(exc)}: is the URL the server's API root "
                              "(it usually ends in /v1)?") from exc
        except openai.APIError as exc:
            raise EngineError(f"{where} did not answer GET /models ({_one_line(exc)}): is it running, and is the URL right "
                              "(it ends in /v1)?") from exc
        served = _model_ids(resp)
        if served is not None:
            self.max_model_len = _max_model_len(resp, self.model)
        if served is None:
            raise EngineError(f"{where} answered GET /models with {_body_view(resp)}, not an OpenAI model list: is the URL "
                              "an OpenAI-compatible server's API root (e.g. http://HOST:8000/v1)?")
        if self.model not in served:
            raise EngineError(f"{where} does not serve model {self.model!r} (it serves: "
                              f"{', '.join(served) or 'nothing'}); pass one of those as --model")

    def _max_tokens(self, asked: int) -> int:
        """`asked`, at most the server's ``max_model_len`` (vLLM answers a request for more with a 400); said once."""
        limit = self.max_model_len
        if limit is None or asked <= limit:
            return asked
        with self._lock:
            first, self._capped = not self._capped, True
        if first:
            log.warning("the server at %s serves %s with max_model_len %d: requests for up to %d new tokens ask for %d "
                        "(prompt and answer share that context; serve the model with a larger --max-model-len, or lower "
                        "max_tokens, to make the limit yours)", self.base_url, self.model, limit, asked, limit)
        return limit

    def _body(self, req: GenRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model}
        if req.prompt is not None:  # rendered with the policy's template (placement assistant): the completions API
            body["prompt"] = req.prompt
        else:
            body["messages"] = req.messages
        body |= {"max_tokens": self._max_tokens(req.max_tokens), "temperature": req.temperature, "top_p": req.top_p}
        if req.seed is not None:
            body["seed"] = req.seed
        extra: dict[str, Any] = {}
        if req.prompt is not None:
            # The text already holds the template's BOS; vLLM would add another (its completions API adds special
            # tokens by default), as mentor's vLLM backend never does.
            extra["add_special_tokens"] = False
        elif req.chat_template_kwargs:
            extra["chat_template_kwargs"] = req.chat_template_kwargs
        if req.json_schema is not None:
            if self.structured_output == "response_format":
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": req.json_schema}}
            elif self.structured_output == "structured_outputs":
                extra["structured_outputs"] = {"json": req.json_schema}
        if extra:
            body["extra_body"] = extra
        return body

    # ------------------------------------------------------------------ one request

    def _ask(self, req: GenRequest) -> GenResult:
        """One request, its answer or its error result; a setup problem (or a broken server) raises `EngineError`."""
        openai = self._openai
        where = f"the server at {self.base_url}"
        with self._slots:
            key = self._sent(req)
            try:
                resp = self._post(self._body(req))
            except openai.APITimeoutError as exc:
                self._hung(exc)
                return self._failed(req, f"no answer within {self.timeout:g} s, while the server answered other "
                                         f"requests (raise --request-timeout if it is only slow) ({_one_line(exc)})")
            except openai.AuthenticationError as exc:
                raise EngineError(f"{where} refused the API key: {_one_line(exc)}") from exc
            except openai.PermissionDeniedError as exc:
                raise EngineError(f"{where} refused the request (403): {_one_line(exc)}") from exc
            except openai.NotFoundError as exc:
                raise EngineError(f"{where} has no model {self.model!r} any more ({_one_line(exc)})") from exc
            except openai.APIError as exc:
                return self._failed(req, _one_line(exc))
            finally:
                with self._lock:
                    self._pending.pop(key, None)
        result = _completion_result(req, resp)
        if result.finish_reason == "error":
            return self._failed(req, result.error or "no answer")
        with self._lock:
            self.answered += 1
            self._streak = 0
        return result

    # ------------------------------------------------------------------ waits and retries

    def _post(self, body: dict[str, Any]) -> Any:
        """POST one completion (a text prompt: the completions API; messages: the chat API): connection errors,
        408/409/429 and 5xx retried `max_retries` times with backoff (0.5, 1, 2, ... s, at most 8); a timeout raised
        at once (`_hung` decides what it means)."""
        openai = self._openai
        for attempt in range(self.max_retries + 1):
            api = self._client().completions if "prompt" in body else self._client().chat.completions
            try:
                resp = api.with_raw_response.create(**body).http_response
            except openai.APITimeoutError:
                raise
            except (openai.APIConnectionError, openai.APIStatusError) as exc:
                status = getattr(exc, "status_code", None)
                again = status is None or status in RETRY_STATUS or status >= 500
                if not again or attempt == self.max_retries:
                    raise
                if status is not None:
                    self._heard = time.monotonic()  # an error status is an answer: the server is alive
                time.sleep(min(8.0, 0.5 * 2**attempt))
                continue
            self._heard = time.monotonic()
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    def _sent(self, req: GenRequest) -> int:
        """Note `req` as pending (what a hung server's error lists), and start the watch on long waits."""
        now = time.monotonic()
        with self._lock:
            key = next(self._keys)
            self._pending[key] = (req.id, now)
            if self._watch is None:
                self._watch = threading.Thread(target=self._watch_silence, name="mentor-openai-watch", daemon=True)
                self._watch.start()
        return key

    def _pending_view(self) -> str:
        with self._lock:
            items = sorted(self._pending.values(), key=lambda p: p[1])
        now = time.monotonic()
        ids = ", ".join(f"{rid} ({now - t:.0f} s)" for rid, t in items[:3])
        more = f" and {len(items) - 3} more" if len(items) > 3 else ""
        return f"{len(items)} request(s) pending: {ids}{more}" if items else "no request pending"

    def _hung(self, exc: BaseException) -> None:
        """A request timed out: when the server has answered nothing for at least half a timeout (and so nothing
        since this request's wait was half over), it is hung, not busy: a busy server answers other requests
        while one long generation runs."""
        silent = time.monotonic() - self._heard
        if silent < HUNG_SILENCE * self.timeout:
            return  # others were answered meanwhile: only this request failed
        raise EngineError(
            f"the server at {self.base_url} accepted requests and answered nothing for {silent:.0f} s "
            f"(--request-timeout {self.timeout:g}); {self._pending_view()}. Is it hung or overloaded? Restart it, or "
            f"raise --request-timeout if it is only slow ({_one_line(exc)})") from exc

    def _watch_silence(self) -> None:
        """While requests are pending: say once per silence, after `NOTICE_AFTER` s without an answer, how long
        each request still waits."""
        while True:
            time.sleep(min(5.0, NOTICE_AFTER / 2))
            with self._lock:
                if not self._pending:
                    self._watch = None  # the next request starts a new watch
                    return
                oldest = min(t for _, t in self._pending.values())
            since = max(self._heard, oldest)
            if time.monotonic() - since >= NOTICE_AFTER and self._noticed != since:
                self._noticed = since
                log.warning("the server at %s has not answered for %.0f s (%s); each request waits up to %g s "
                            "(--request-timeout) for its answer, and a server silent that long fails the stage",
                            self.base_url, time.monotonic() - since, self._pending_view(), self.timeout)

    def _failed(self, req: GenRequest, reason: str) -> GenResult:
        with self._lock:
            self.failed += 1
            self._streak += 1
            streak, failed = self._streak, self.failed
        if streak >= FAIL_STREAK:
            raise EngineError(f"the server at {self.base_url} gave no usable answer to {streak} requests in a row "
                              f"(the last: {reason}){self._schema_hint(req, reason)}")
        if failed in (1, 10, 100) or failed % 1000 == 0:
            log.warning("the server at %s: %d request(s) without an answer so far (the latest: %s); each counts as a "
                        "failed model call", self.base_url, failed, reason)
        return GenResult(req.id, "", "error", error=reason)

    def _schema_hint(self, req: GenRequest, reason: str) -> str:
        if req.json_schema is not None and self.structured_output != "none" and "400" in reason:
            return "; if it does not support JSON schemas, use structured_output: none (--structured-output none)"
        return ""

    # ------------------------------------------------------------------ generation

    def _generate(self, requests: Sequence[GenRequest], on_done: OnDone | None) -> list[GenResult]:
        if len(requests) == 1:
            out = [self._ask(requests[0])]
            if on_done is not None:
                on_done(1)
        else:
            out = self._wave(requests, on_done)
        bad = [r for r in out if r.finish_reason == "error"]
        if len(out) > 1 and len(bad) == len(out):
            raise EngineError(f"the server at {self.base_url} gave no usable answer to any of the {len(out)} requests of a wave "
                              f"(e.g. {bad[0].error}){self._schema_hint(requests[0], bad[0].error or '')}")
        return out

    def _wave(self, requests: Sequence[GenRequest], on_done: OnDone | None) -> list[GenResult]:
        out: list[GenResult | None] = [None] * len(requests)
        width = min(self.max_concurrency, MAX_THREADS)
        for i, result in concurrently(self._ask, requests, width, "mentor-openai"):  # an EngineError ends the wave
            out[i] = result
            if on_done is not None:
                on_done(1)
        return out  # type: ignore[return-value]


def _model_ids(resp: Any) -> list[str] | None:
    """The ids of an OpenAI model list (``{"data": [{"id": ...}, ...]}``), None when the answer is not one."""
    try:
        data = resp.json()
    except ValueError:
        return None
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in items):
        return None
    return [m["id"] for m in items]


def _max_model_len(resp: Any, model: str) -> int | None:
    """The ``max_model_len`` a model list reports for `model` (vLLM does; other servers may not): None if absent."""
    for m in resp.json()["data"]:
        n = m.get("max_model_len")
        if m["id"] == model and isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def _completion_result(req: GenRequest, resp: Any) -> GenResult:
    """A chat completion's (a text completion's, for a rendered prompt) first choice as a `GenResult`; an answer that is not one is an error result saying why."""
    try:
        data = resp.json()
    except ValueError:
        return GenResult(req.id, "", "error", error=f"the answer is not JSON: {_body_view(resp)}")
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        return GenResult(req.id, "", "error", error=f"the answer is not a chat completion (no 'choices' list): {_body_view(resp)}")
    if not choices:
        return GenResult(req.id, "", "error", error="the answer has no choices ('choices': [])")
    choice = choices[0]
    if req.prompt is not None:  # a text completion: the choice's text
        content = choice.get("text") if isinstance(choice, dict) else None
        if not isinstance(content, str):
            return GenResult(req.id, "", "error", error="the answer's choice has no 'text' (not a text completion)")
    else:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            return GenResult(req.id, "", "error", error="the answer's choice has no 'message'")
        content = message.get("content")
    if content is not None and not isinstance(content, str):
        return GenResult(req.id, "", "error", error=f"the answer's message content is not text ({type(content).__name__})")
    finish = choice.get("finish_reason")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return GenResult(req.id, content or "", finish if isinstance(finish, str) and finish else "stop",
                     _tokens(usage.get("prompt_tokens")), _tokens(usage.get("completion_tokens")))


def _tokens(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 else 0


def _body_view(resp: Any) -> str:
    kind = resp.headers.get("content-type", "no content type").split(";")[0]
    text = " ".join(resp.text[:120].split()) if resp.content else ""
    return f"{resp.status_code} {kind} {text!r}" if text else f"{resp.status_code} {kind}, empty body"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:240]}" if text else type(exc).__name__


__all__ = ["DEFAULT_TIMEOUT", "STRUCTURED_MODES", "OpenAIBackend", "check_base_url", "check_server_options"]
