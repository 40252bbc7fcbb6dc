"""The LLM backend seam: plain chat generation, one result per request, in request order.

Every stage that needs a language model (the hint agents, `mentor rollout`)
talks to a `Backend`:

    results = backend.generate([GenRequest(id=..., messages=[...], ...), ...])

- exactly one `GenResult` per request, in request order, carrying the
  request's id; results are never matched to requests by prompt text (two
  rows may share a prompt);
- structured output by JSON schema when ``json_schema`` is set (give strings
  ``maxLength`` and arrays ``maxItems``, or small models loop until
  ``max_tokens``);
- several samples of one prompt are several requests with different seeds.

Backends: ``vllm`` (`mentor.pipeline.backends._vllm_engine`, the only module that
imports vllm), ``openai`` (`mentor.pipeline.backends._openai_client`: an
OpenAI-compatible server such as ``vllm serve``) and ``fake`` (deterministic
and scriptable, for tests only). `make_backend` keeps one engine per process
and configuration, so a dask worker that runs many shards starts its engine
once; `release_engines` stops them when the stage that needed them ends.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mentor.pipeline.devices import check_engine_devices
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.models import MODEL_NAMES, NAMED_MAX_MODEL_LEN, resolve_model

log = logging.getLogger(__name__)
_COUNTING = threading.Lock()

FINISH_REASONS = ("stop", "length", "error")


@dataclass(slots=True)
class GenRequest:
    """One chat completion to generate."""

    id: str
    messages: list[dict]
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    json_schema: dict | None = None
    # Variables for the chat template (e.g. {"enable_thinking": False} for Qwen3); None: the template's defaults.
    chat_template_kwargs: dict | None = None
    # The prompt already rendered with the model's chat template (e.g. an answer left open to continue):
    # sent as it is, without the chat template; `messages` then only describe it.
    prompt: str | None = None


@dataclass(slots=True)
class GenResult:
    """The model's answer to one request; `text` is raw (never post-processed)."""

    id: str
    text: str
    finish_reason: str  # "stop" | "length" | "error" (backends may pass others through)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None  # why there is no answer (finish_reason "error"): the server's or engine's reason


# Told how many requests just finished, while an engine call runs (progress bars).
OnDone = Callable[[int], None]


@runtime_checkable
class Backend(Protocol):
    name: str
    model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int

    def generate(self, requests: Sequence[GenRequest], on_done: OnDone | None = None) -> list[GenResult]: ...


class CountingBackend:
    """Base class: checks the one-result-per-request contract and keeps the counters.

    Subclasses implement `_generate`. `calls` counts engine calls (an empty
    request list is not a call). `on_done(n)`, when given, is told as requests
    finish (n of them at a time) while the call runs, for progress bars; a
    backend that cannot tell reports them all at the end. ``concurrent``: the
    backend takes many `generate` calls at once from threads (a server does; an
    in-process engine wants one batch at a time).
    """

    name = "base"
    concurrent = False

    def __init__(self, model: str) -> None:
        self.model = model
        # A non-concurrent backend (an engine) takes one batch at a time, also from two threads of one dask worker.
        self._one_batch = threading.RLock()
        self.calls = 0
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def _generate(self, requests: Sequence[GenRequest], on_done: OnDone | None) -> list[GenResult]:  # pragma: no cover
        raise NotImplementedError

    def generate(self, requests: Sequence[GenRequest], on_done: OnDone | None = None) -> list[GenResult]:
        if not requests:
            return []
        if self.concurrent:
            results = self._generate(requests, on_done)
        else:
            with self._one_batch:
                results = self._generate(requests, on_done)
        if len(results) != len(requests):
            raise RuntimeError(f"{self.name} backend returned {len(results)} results for {len(requests)} requests")
        pt = ct = 0
        for req, res in zip(requests, results):
            if res.id != req.id:
                raise RuntimeError(f"{self.name} backend returned result {res.id!r} in the place of request {req.id!r}")
            pt += res.prompt_tokens
            ct += res.completion_tokens
        with _COUNTING:  # a concurrent backend is called from several threads
            self.calls += 1
            self.requests += len(requests)
            self.prompt_tokens += pt
            self.completion_tokens += ct
        return results


def concurrently(fn: Callable[[Any], Any], items: Sequence[Any], width: int, name: str = "mentor") -> Iterator[tuple[int, Any]]:
    """``(index, fn(item))`` for each item as it finishes, at most `width` running at once.

    The threads are daemons: when the caller stops (an error, Ctrl-C) it returns at once, and
    what is still running (a request waiting on a server) is abandoned, not awaited until its
    timeout. An exception in `fn` is raised here; no further item is started after it.
    """
    todo: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()
    for pair in enumerate(items):
        todo.put(pair)
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                i, item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((i, fn(item), None))
            except BaseException as exc:  # handed to the caller
                done.put((i, None, exc))

    for _ in range(max(1, min(width, len(items)))):
        threading.Thread(target=work, name=name, daemon=True).start()
    try:
        for _ in range(len(items)):
            while True:
                try:
                    i, result, exc = done.get(timeout=0.5)  # a blocking get would not see Ctrl-C
                    break
                except queue.Empty:
                    continue
            if exc is not None:
                raise exc
            yield i, result
    finally:
        stop.set()


# --------------------------------------------------------------------------- fake

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
        out = []
        script = self.script
        for req in requests:
            ans = script(req)
            if isinstance(ans, GenResult):
                out.append(GenResult(req.id, ans.text, ans.finish_reason, ans.prompt_tokens, ans.completion_tokens, ans.error))
                continue
            text = str(ans)
            ct = _approx_tokens(text)
            finish = "stop"
            if ct > req.max_tokens:
                text, ct, finish = text[: req.max_tokens * 4], req.max_tokens, "length"
            pt = _approx_tokens(req.prompt) if req.prompt is not None else sum(_approx_tokens(m.get("content", "")) for m in req.messages)
            out.append(GenResult(req.id, text, finish, pt, ct))
        if on_done is not None:
            on_done(len(out))
        return out


def resolve_callable(spec: str) -> Callable:
    """``"package.module:attr"`` -> the object (lets picklable specs name a script)."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ConfigError(f"{spec!r}: expected 'module:attribute'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{spec!r}: cannot import ({exc})") from exc


# --------------------------------------------------------------------------- factory

_ENGINES: dict[str, Backend] = {}
_ENGINE_LOCK = threading.RLock()  # guards _ENGINES: one engine per configuration, also with threads
_STARTS = 0  # engines this process has started


def engine_starts() -> int:
    """How many engines this process has started so far (a worker that reuses its engine starts one)."""
    return _STARTS


def _exit_on_sigterm() -> None:
    """Make SIGTERM (kill, a scheduler's cancel) exit through atexit, so the engine's processes are stopped too.

    By default SIGTERM ends Python without running atexit, and vLLM's engine
    processes outlive their parent. Only where nobody installed a handler.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def handler(signum, frame):  # noqa: ARG001
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, handler)


def close_backends() -> None:
    """Stop every engine this process started (registered at exit; call it to free memory between models)."""
    with _ENGINE_LOCK:
        while _ENGINES:
            _, engine = _ENGINES.popitem()
            close = getattr(engine, "close", None)
            if close is not None:
                close()


def _cache_key(kind: str, model: str | None, options: dict[str, Any]) -> str:
    return json.dumps([kind, model, options], sort_keys=True, default=repr)


def make_backend(kind: str, model: str | None = None, **options: Any) -> Backend:
    """A backend of `kind` ("vllm" | "openai" | "fake"); vllm engines are created once per process and reused.

    `model` None means the embedded demo model (SmolLM2-135M-Instruct); a
    name from `mentor.pipeline.models.MODEL_NAMES` means that CPU model (both
    get ``max_model_len`` 4096 unless given). vllm options: ``tensor_parallel_size``,
    ``gpu_memory_utilization``, ``max_model_len``, ``enforce_eager``,
    ``dtype``, ``seed`` (others are passed to ``vllm.LLM``). openai options:
    ``base_url`` (required), ``api_key``, ``max_concurrency``, ``max_retries``,
    ``timeout``, ``structured_output``; `model` is the served name. fake options:
    ``script`` (a callable or ``"module:attr"``).
    """
    if kind == "fake":
        return FakeBackend(script=options.pop("script", None), model=model or "fake", **options)
    if kind == "openai":
        return _server_backend(model, options)
    if kind != "vllm":
        raise ConfigError(f"unknown backend {kind!r}; use 'vllm', 'openai' (a server) or 'fake' (tests)")
    if model is None or model in MODEL_NAMES:
        options.setdefault("max_model_len", NAMED_MAX_MODEL_LEN)
    with _ENGINE_LOCK:  # two tasks of one dask worker (two threads) find one engine, never start two
        return _cached_engine(model, options)


def _cached_engine(model: str | None, options: dict[str, Any]) -> Backend:
    key = _cache_key("vllm", model, options)
    engine = _ENGINES.get(key)
    if engine is not None and getattr(engine, "dead", None):
        # A failed engine is never reused, and its processes (and GPU memory) are gone before the next one starts.
        del _ENGINES[key]
        close = getattr(engine, "close", None)
        if close is not None:
            close()
        engine = None
    if engine is None:
        _check_can_start_engine()
        check_engine_devices(options.get("tensor_parallel_size") or 1)  # this process's devices, before vLLM's own checks
        from mentor.pipeline.backends._vllm_engine import VLLMBackend  # circular: vllm_backend imports llm

        engine = VLLMBackend(resolve_model(model), **options)
        global _STARTS
        _STARTS += 1
        if not _ENGINES:
            atexit.register(close_backends)
            _exit_on_sigterm()
        _ENGINES[key] = engine
    return engine


def _check_can_start_engine() -> None:
    """vLLM runs its EngineCore in a child process, which a daemonic process (a default dask worker) may not start."""
    if multiprocessing.current_process().daemon:
        raise ConfigError(
            "this dask worker is a daemonic process and cannot start a vLLM engine (its EngineCore is a child process): "
            "start the workers with DASK_DISTRIBUTED__WORKER__DAEMON=False and --nthreads 1 "
            "(e.g. `DASK_DISTRIBUTED__WORKER__DAEMON=False dask worker ADDRESS --nthreads 1`), see docs/gpus.md")


SERVER_OPTIONS = ("base_url", "api_key", "max_concurrency", "max_retries", "timeout", "structured_output")


def _server_backend(model: str | None, options: dict[str, Any]) -> Backend:
    """An `OpenAIBackend` (nothing to start or cache: the server is someone else's)."""
    from mentor.pipeline.backends._openai_client import OpenAIBackend  # circular: openai_backend imports llm

    if not model:
        raise ConfigError("the openai backend needs the model name the server serves (--model NAME; GET BASE_URL/models lists them)")
    if not options.get("base_url"):
        raise ConfigError("the openai backend needs the server's URL (--base-url http://HOST:PORT/v1, or base_url in the config)")
    unknown = sorted(set(options) - set(SERVER_OPTIONS))
    if unknown:
        raise ConfigError(f"the openai backend has no option {', '.join(unknown)} (engine settings belong to the server); "
                          f"options: {', '.join(SERVER_OPTIONS)}")
    return OpenAIBackend(model, **options)


# vLLM options mentor passes by name, and what each must be (others go to ``vllm.LLM`` as they are).
_VLLM_OPTIONS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tensor_parallel_size": (lambda v: _whole(v) and v >= 1, "a whole number >= 1"),
    "max_model_len": (lambda v: _whole(v) and v >= 16, "a whole number >= 16"),
    "gpu_memory_utilization": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
                               "a number in (0, 1]"),
    "enforce_eager": (lambda v: isinstance(v, bool), "true or false"),
    "dtype": (lambda v: isinstance(v, str) and bool(v), "a dtype name (auto, bfloat16, float16, float32)"),
    "seed": (lambda v: _whole(v) and v >= 0, "a whole number >= 0"),
}


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_backend(kind: Any, model: Any, options: Any, where: str = "backend", base_url: Any = None) -> None:
    """What building the backend would refuse, refused now (a workflow at load, before any stage runs).

    `where` names the settings in errors (``hint.backend``): ``<where>.options.<name>: ...``;
    `base_url`, when the settings hold it beside the options, is ``<where>.base_url``.
    The server is not contacted and no engine starts.
    """
    if base_url is not None:
        from mentor.pipeline.backends._openai_client import check_base_url  # circular: openai_backend imports llm

        check_base_url(base_url, f"{where}.base_url")
        options = {**options, "base_url": base_url} if isinstance(options, dict) else options
    if kind not in ("vllm", "openai", "fake"):
        raise ConfigError(f"{where}.backend {kind!r}: choose vllm (an engine here), openai (a server) or fake (tests)")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"{where}.model: must be text (a model name or folder), got {model!r}")
    if not isinstance(options, dict):
        raise ConfigError(f"{where}.options: must be a mapping, got {options!r}")
    if kind == "openai":
        from mentor.pipeline.backends._openai_client import check_server_options  # circular: openai_backend imports llm

        if not model:
            raise ConfigError(f"{where}.model: backend openai needs the name the server serves (GET BASE_URL/models lists them)")
        if not options.get("base_url"):
            raise ConfigError(f"{where}: backend openai needs base_url, the server's URL (e.g. http://HOST:8000/v1)")
        unknown = sorted(set(options) - set(SERVER_OPTIONS))
        if unknown:
            raise ConfigError(f"{where}.options.{unknown[0]}: not an option of the openai backend (engine settings belong "
                              f"to the server); options: {', '.join(SERVER_OPTIONS)}")
        check_server_options(options, f"{where}.options")
    elif kind == "vllm":
        for name, (ok, what) in _VLLM_OPTIONS.items():
            if name in options and not ok(options[name]):
                raise ConfigError(f"{where}.options.{name}: must be {what}, got {options[name]!r}")
        if "base_url" in options:
            raise ConfigError(f"{where}.options.base_url: is for backend openai, not vllm")
    elif isinstance(options.get("script"), str):
        try:
            resolve_callable(options["script"])
        except ConfigError as exc:
            raise ConfigError(f"{where}.options.script: {exc}") from None


_HELD = 0


@contextmanager
def hold_engines() -> Iterator[None]:
    """Keep engines open across stages inside the block (a benchmark that hints several arms with one model).

    Outside such a block every stage releases what it started when it ends (`release_engines`).
    """
    global _HELD
    _HELD += 1
    try:
        yield
    finally:
        _HELD -= 1


def release_engines(executor: Any = None) -> None:
    """End of a stage: stop the engines of this process and of the executor's workers, unless `hold_engines` is on.

    A trainer that starts after a stage must find the GPU memory free; an idle CPU
    engine still spins on the cores.
    """
    if _HELD:
        return
    close_backends()
    close_remote = getattr(executor, "close_engines", None)
    if close_remote is not None:
        close_remote()


@dataclass(frozen=True)
class BackendSpec:
    """A small picklable description of a backend; calling it returns the (per-process cached) backend.

    This is what travels to dask workers: each worker builds its own engine
    from the spec the first time it runs a shard, then reuses it.
    """

    kind: str = "vllm"
    model: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Backend:
        """A new backend each call (a fake's call log starts empty; engines are shared by `make_backend`)."""
        return make_backend(self.kind, self.model, **dict(self.options))

    def describe(self) -> dict[str, Any]:
        """The parts of the spec that change outputs (for done-marker keys and provenance)."""
        opts = {k: v for k, v in self.options.items() if k in ("dtype", "max_model_len", "seed", "script", "structured_output")}
        embedded = self.kind != "openai" and self.model in (None, "", "smollm2-135m")
        return {"kind": self.kind, "model": "embedded:SmolLM2-135M-Instruct" if embedded else self.model, "options": opts}


class BackendSettings(BaseModel):
    """An LLM backend's settings: the one model every backend is built from (a workflow's ``hint.backend`` and
    ``trainer.policy``, vouching's ``policy``, and the commands' --backend/--model/--base-url/engine flags).

    `check` refuses what building the backend would refuse, naming the settings (no server is contacted and no
    engine starts); `spec` is the picklable `BackendSpec` the stages take.
    """

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(  # checked by `check`, whose error names the settings and the choices
        "vllm", description="vllm (an engine here, or one per dask worker), openai (a server at base_url), or fake (tests only).")
    model: str | None = Field(None, description="HF model folder or id in the local cache, or a mentor CPU model name; none = the "
                              "embedded SmolLM2-135M-Instruct; openai: the name the server serves.")
    base_url: str | None = Field(None, description="openai: the server's URL, e.g. http://HOST:8000/v1 (key: $OPENAI_API_KEY).")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="vllm: tensor_parallel_size, gpu_memory_utilization, max_model_len, enforce_eager, dtype; openai: "
        "max_concurrency, max_retries, timeout (seconds one attempt of a request may wait, 600), structured_output; "
        "fake: script (module:function). Checked when the settings are loaded.",
    )

    @model_validator(mode="before")
    @classmethod
    def _url_beside_options(cls, data: Any) -> Any:
        """A server's URL may be given among its options (``options: {base_url: ...}``): it is the same setting."""
        if isinstance(data, dict) and isinstance(data.get("options"), dict) and "base_url" in data["options"]:
            options = dict(data["options"])
            url = options.pop("base_url")
            if data.get("base_url") not in (None, url):
                raise ValueError("base_url is given twice, with two values (base_url and options.base_url)")
            data = {**data, "options": options, "base_url": url}
        return data

    @model_validator(mode="after")
    def _server(self) -> "BackendSettings":
        if self.backend == "openai" and not (self.base_url and self.model):
            raise ValueError("backend openai needs base_url (http://HOST:PORT/v1) and model (the served name)")
        if self.backend != "openai" and self.base_url:
            raise ValueError(f"base_url is for backend openai, not {self.backend}")
        return self

    def check(self, where: str = "backend") -> None:
        check_backend(self.backend, self.model, self.options, where, base_url=self.base_url)

    def spec(self) -> BackendSpec:
        options = dict(self.options) | ({"base_url": self.base_url} if self.base_url else {})
        return BackendSpec(self.backend, self.model, options)


def describe_backend(backend: Backend | Callable[[], Backend]) -> Any:
    """What a backend or a backend factory contributes to a resume key: its ``describe()`` (a
    `BackendSpec`'s), else a backend's model name, else the factory's name."""
    if hasattr(backend, "describe"):
        return backend.describe()
    if hasattr(backend, "generate"):
        return {"model": getattr(backend, "model", type(backend).__name__)}
    return {"factory": getattr(backend, "__qualname__", type(backend).__name__)}


__all__ = [
    "Backend",
    "BackendSettings",
    "BackendSpec",
    "CountingBackend",
    "FakeBackend",
    "GenRequest",
    "GenResult",
    "check_backend",
    "close_backends",
    "concurrently",
    "describe_backend",
    "engine_starts",
    "hold_engines",
    "release_engines",
    "echo_script",
    "make_backend",
    "resolve_callable",
]
