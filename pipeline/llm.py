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

The kinds of backend are the modules of `mentor.pipeline.backends` (one file
each, plugins included): each owns its settings, their checks and how it is
built. `make_backend` keeps one engine per process and configuration for the
kinds that start one, so a dask worker that runs many shards starts its engine
once; `release_engines` stops them when the stage that needed them ends.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import queue
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mentor.pipeline.backends import DEFAULT as DEFAULT_BACKEND
from mentor.pipeline.backends import BackendKind
from mentor.pipeline.backends import choices as backend_choices
from mentor.pipeline.backends import kind as backend_kind
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.models import EMBEDDED_ALIAS

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

    Subclasses implement `_generate` (a batch), or `_answer` (one request at a time). `calls` counts
    engine calls (an empty request list is not a call). `on_done(n)`, when given, is told as requests
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

    def _answer(self, request: GenRequest) -> GenResult:  # pragma: no cover
        raise NotImplementedError

    def _generate(self, requests: Sequence[GenRequest], on_done: OnDone | None) -> list[GenResult]:
        """`_answer` each request in turn; all are reported done at the end."""
        out = [self._answer(req) for req in requests]
        if on_done is not None:
            on_done(len(out))
        return out

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


# --------------------------------------------------------------------------- factory


def resolve_callable(spec: str) -> Callable:
    """``"package.module:attr"`` -> the object (lets picklable specs name a script)."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ConfigError(f"{spec!r}: expected 'module:attribute'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{spec!r}: cannot import ({exc})") from exc

_ENGINES: dict[str, Backend] = {}
_ENGINE_LOCK = threading.RLock()  # guards _ENGINES: one engine per configuration, also with threads
_STARTS = 0  # engines this process has started


def engine_starts() -> int:
    """How many engines this process has started so far (a worker that reuses its engine starts one)."""
    return _STARTS


def engine_to_terminal() -> bool:
    """Whether an engine's own logs go to the terminal: ``mentor -v`` (the root logger at INFO), not a command that
    only raises mentor's own logger to show its progress (then they go to its engine log)."""
    return logging.getLogger().isEnabledFor(logging.INFO)


def open_engines() -> int:
    """How many engines this process holds open now (`release_engines` and `close_backends` stop them)."""
    return len(_ENGINES)


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
    """A backend of `kind` (a module of `mentor.pipeline.backends`: its docstring lists its options);
    a kind that starts an engine starts it once per process, model and options, and reuses it."""
    k = backend_kind(kind)
    options = k.settle(model, options)
    if not k.engine:
        return k.make(model, options)
    with _ENGINE_LOCK:  # two tasks of one dask worker (two threads) find one engine, never start two
        return _cached_engine(k, model, options)


def _cached_engine(k: BackendKind, model: str | None, options: dict[str, Any]) -> Backend:
    key = _cache_key(k.name, model, options)
    engine = _ENGINES.get(key)
    if engine is not None and getattr(engine, "dead", None):
        # A failed engine is never reused, and its processes (and GPU memory) are gone before the next one starts.
        del _ENGINES[key]
        close = getattr(engine, "close", None)
        if close is not None:
            close()
        engine = None
    if engine is None:
        engine = k.make(model, options)
        global _STARTS
        _STARTS += 1
        if not _ENGINES:
            atexit.register(close_backends)
            _exit_on_sigterm()
        _ENGINES[key] = engine
    return engine


def check_backend(kind: Any, model: Any, options: Any, where: str = "backend", base_url: Any = None) -> None:
    """What building the backend would refuse, refused now (a workflow at load, before any stage runs).

    `where` names the settings in errors (``hint.backend``): ``<where>.options.<name>: ...``;
    `base_url`, when the settings hold it beside the options, is ``<where>.base_url``.
    The server is not contacted and no engine starts.
    """
    try:
        k = backend_kind(kind)
    except ConfigError:
        raise ConfigError(f"{where}.backend {kind!r}: choose {backend_choices()}") from None
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"{where}.model: must be text (a model name or folder), got {model!r}")
    if not isinstance(options, dict):
        raise ConfigError(f"{where}.options: must be a mapping, got {options!r}")
    k.check(model, {**options, "base_url": base_url} if base_url is not None else options, where)


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

    kind: str = DEFAULT_BACKEND
    model: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Backend:
        """A new backend each call (a fake's call log starts empty; engines are shared by `make_backend`)."""
        return make_backend(self.kind, self.model, **dict(self.options))

    def describe(self) -> dict[str, Any]:
        """The parts of the spec that change outputs (for done-marker keys and provenance)."""
        opts = {k: v for k, v in self.options.items() if k in ("dtype", "max_model_len", "seed", "script", "structured_output")}
        embedded = not backend_kind(self.kind).server and self.model in (None, "", EMBEDDED_ALIAS)
        return {"kind": self.kind, "model": "embedded:SmolLM2-135M-Instruct" if embedded else self.model, "options": opts}

    @property
    def engine(self) -> bool:
        """Its kind starts an engine in the process that calls it (a dask worker must be able to)."""
        return backend_kind(self.kind).engine

    @property
    def gpus(self) -> int:
        """GPUs one of its engines takes."""
        return backend_kind(self.kind).gpus(self.options)


class BackendSettings(BaseModel):
    """An LLM backend's settings: the one model every backend is built from (a workflow's ``hint.backend`` and
    ``trainer.policy``, vouching's ``policy``, and the commands' --backend/--model/--base-url/engine flags).

    `check` refuses what building the backend would refuse, naming the settings (no server is contacted and no
    engine starts); `spec` is the picklable `BackendSpec` the stages take.
    """

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(  # checked by `check`, whose error names the settings and the choices
        DEFAULT_BACKEND, description="The kind: a module of pipeline/backends/ or a plugin's backends/<name>.py "
        "(`mentor hint --help` lists them).")
    model: str | None = Field(None, description="HF model folder or id in the local cache, or a mentor CPU model name; none = the "
                              "embedded SmolLM2-135M-Instruct; a server backend: the name the server serves.")
    base_url: str | None = Field(None, description="A server backend: the server's URL, e.g. http://HOST:8000/v1 "
                                 "(key: $OPENAI_API_KEY).")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="The kind's options, as its module's docstring lists them (an engine's tensor_parallel_size, "
        "max_model_len, ...; a server's max_concurrency, timeout, ...). Checked when the settings are loaded.",
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
    def _kind_rules(self) -> "BackendSettings":
        """What the kind refuses of the settings by themselves (an unknown kind: `check` names the choices)."""
        try:
            k = backend_kind(self.backend)
        except ConfigError:
            return self
        problem = k.problem(self.model, self.base_url)
        if problem:
            raise ValueError(problem)
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
    "DEFAULT_BACKEND",
    "GenRequest",
    "GenResult",
    "check_backend",
    "close_backends",
    "concurrently",
    "describe_backend",
    "engine_starts",
    "engine_to_terminal",
    "hold_engines",
    "release_engines",
    "make_backend",
    "open_engines",
    "resolve_callable",
]
