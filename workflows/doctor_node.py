"""`mentor doctor`'s reading of the node itself: GPUs (through ``nvidia-smi``, bounded), ``CUDA_VISIBLE_DEVICES``
read the way CUDA reads it, ``/dev/shm``, the ``NCCL_*`` / ``VLLM_*`` settings and the trainer's Python version
(what one trainer needs of the node is its launcher's, `LauncherBase.node_checks`).

Each probe has a deadline (``--timeout``): an ``nvidia-smi`` that fails, hangs or prints ``[N/A]`` is a problem
named as such, never "a CPU node". Nothing here imports torch or touches CUDA.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mentor.pipeline.devices import visible_devices

OK, PROBLEM, SKIP = "ok", "problem", "skip"
PROBE_TIMEOUT_S = 10.0
MIN_SHM_GIB = 1.0  # NCCL, vLLM's multi-process engines and Ray's object store all live in /dev/shm
MIN_PYTHON = (3, 10)  # pyproject's requires-python
QUERY = "index,uuid,name,memory.total,memory.used,driver_version"


@dataclass
class Check:
    name: str
    status: str  # ok | problem | skip
    detail: str
    fix: str | None = None

    def line(self) -> str:
        return f"{self.status:<8} {self.name}: {self.detail}" + (f" -> {self.fix}" if self.fix else "")


@dataclass
class Gpu:
    index: str
    name: str
    total_mib: int
    used_mib: int
    driver: str
    uuid: str = ""


@dataclass
class NodeGpus:
    """What ``nvidia-smi`` says, and what of it CUDA will see.

    `visible`: the GPUs a CUDA process here sees (after ``CUDA_VISIBLE_DEVICES``); `why`: why there are none
    when that is not a problem (no ``nvidia-smi``: a CPU node); `problem`: what could not be read (``nvidia-smi``
    failed, hung, printed ``[N/A]``); `visible_problem`: what ``CUDA_VISIBLE_DEVICES`` hides or breaks.
    """

    visible: list[Gpu] = field(default_factory=list)
    listed: list[Gpu] = field(default_factory=list)
    driver_cuda: str | None = None
    why: str | None = None
    problem: str | None = None
    visible_problem: str | None = None


def _run(exe: str, args: list[str], timeout: float) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, why it gave nothing usable) within `timeout` seconds."""
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"`nvidia-smi {' '.join(args)}` did not answer within {timeout:g} s (a hung driver or GPU)"
    except OSError as exc:
        return None, f"nvidia-smi cannot run ({exc.strerror or exc})"
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        return None, f"nvidia-smi failed (exit {proc.returncode}: {said[0][:200] if said else 'no output'})"
    return proc.stdout, None


def read_gpus(timeout: float = PROBE_TIMEOUT_S) -> NodeGpus:
    """This node's GPUs through ``nvidia-smi`` (NVML: CUDA stays untouched), each call bounded by `timeout`."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return NodeGpus(why="no nvidia-smi on PATH")
    rows, failed = _run(exe, [f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"], timeout)
    if failed:
        return NodeGpus(problem=failed)
    banner, failed = _run(exe, [], timeout)
    if failed:
        return NodeGpus(problem=failed)
    gpus, unreadable = [], []
    for line in rows.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 6 and parts[3].isdigit() and parts[4].isdigit():
            gpus.append(Gpu(parts[0], parts[2], int(parts[3]), int(parts[4]), parts[5], parts[1]))
        else:
            unreadable.append(line.strip())
    m = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    if unreadable:
        return NodeGpus(listed=gpus, problem=f"nvidia-smi printed {len(unreadable)} GPU row(s) it could not read "
                        f"({'; '.join(unreadable)[:200]}): the driver does not report them")
    if not gpus:
        return NodeGpus(driver_cuda=m.group(1) if m else None,
                        problem="nvidia-smi is installed but lists no GPU (a driver without devices?)")
    node = NodeGpus(visible=gpus, listed=gpus, driver_cuda=m.group(1) if m else None)
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        node.visible, node.visible_problem = _visible(gpus, value, exe, timeout)
    return node


def _visible(gpus: list[Gpu], value: str, exe: str, timeout: float) -> tuple[list[Gpu], str | None]:
    """The GPUs ``CUDA_VISIBLE_DEVICES=value`` leaves a CUDA process, as CUDA reads it, and what is wrong with it."""
    ids, why = visible_devices(value)
    mig = _mig_parents(exe, timeout) if any(i.startswith("MIG-") for i in ids) else {}
    out: list[Gpu] = []
    for n, dev in enumerate(ids):
        if dev.startswith("GPU-"):
            found = [g for g in gpus if g.uuid.startswith(dev)]
            gpu = found[0] if len(found) == 1 else None
        elif dev.startswith("MIG-"):
            parent = mig.get(dev) or next((p for u, p in mig.items() if u.startswith(dev)), None)
            gpu = next((g for g in gpus if g.index == parent), None)
        else:
            gpu = next((g for g in gpus if g.index == dev), None)
        if gpu is None:  # CUDA stops at a device it does not find, as at any invalid entry
            rest = ", ".join(ids[n:])
            seen = f"only GPU {', '.join(g.index for g in out)} visible" if out else "no GPU visible"
            return out, (f"CUDA_VISIBLE_DEVICES={value!r}: {dev} is not a GPU nvidia-smi lists here (indices "
                         f"{', '.join(g.index for g in gpus)}), and CUDA stops there: {seen}, {rest} ignored")
        out.append(gpu)
    return out, (f"CUDA_VISIBLE_DEVICES={value!r}: {why}" if why else None)


def _mig_parents(exe: str, timeout: float) -> dict[str, str]:
    """MIG device UUID -> the index of its GPU, from ``nvidia-smi -L``."""
    text, _ = _run(exe, ["-L"], timeout)
    parents: dict[str, str] = {}
    current = None
    for line in (text or "").splitlines():
        g = re.match(r"\s*GPU (\d+):", line)
        if g:
            current = g.group(1)
        m = re.search(r"UUID:\s*(MIG-[^)\s]+)", line)
        if m and current is not None:
            parents[m.group(1)] = current
    return parents


# --------------------------------------------------------------------------- the node's checks


def check_shm() -> Check:
    """/dev/shm: NCCL between GPUs, vLLM's engine processes and Ray's object store need room there."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError as exc:
        return Check("shared memory", PROBLEM, f"/dev/shm cannot be read ({exc.strerror or exc})",
                     "mount a tmpfs at /dev/shm (a container: docker run --ipc=host or --shm-size=16g)")
    size, free = st.f_blocks * st.f_frsize / 2**30, st.f_bavail * st.f_frsize / 2**30
    detail = f"/dev/shm is {size:.2f} GiB ({free:.2f} GiB free)"
    if size < MIN_SHM_GIB:
        return Check("shared memory", PROBLEM, detail + f", under {MIN_SHM_GIB:g} GiB: NCCL and vLLM's workers fail "
                     "or crash with bus errors there (a container's default is 64 MiB)",
                     "run the container with --ipc=host or --shm-size=16g (Kubernetes: an emptyDir with medium: Memory)")
    return Check("shared memory", OK, detail)


ENV_PREFIXES = ("NCCL_", "VLLM_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RAY_ADDRESS", "TORCH_NCCL_",
                "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS")


def check_env_settings() -> Check:
    """The NCCL_* / VLLM_* (and other GPU-placement) variables set here: what vLLM's ``collect-env`` lists."""
    found = sorted(k for k in os.environ if k.startswith(ENV_PREFIXES))
    if not found:
        return Check("settings", OK, "no NCCL_*, VLLM_*, CUDA_VISIBLE_DEVICES or RAY_ADDRESS set (the libraries' defaults)")
    listing = ", ".join(f"{k}={os.environ[k]}" for k in found)
    return Check("settings", OK, f"{len(found)} set, every engine and trainer started from here inherits them: {listing}")


def python_version(python: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[tuple[int, ...] | None, str]:
    """(major, minor, micro) of the interpreter `python` (any Python, 2 included), or None and why not."""
    code = "import sys; sys.stdout.write('%d.%d.%d' % tuple(sys.version_info[:3]))"
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{python} did not answer within {timeout:g} s"
    except OSError as exc:
        return None, f"{python} cannot run ({exc.strerror or exc})"
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", proc.stdout.strip())
    if proc.returncode != 0 or not m:
        said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return None, f"{python} is not a Python that answers ({said})"
    return tuple(int(x) for x in m.groups()), proc.stdout.strip()


def check_trainer_python(python: str | None, timeout: float = PROBE_TIMEOUT_S) -> Check:
    """The trainer's interpreter (``--python``): it runs, and is new enough for mentor's reward files."""
    if python is None:
        return Check("trainer Python", SKIP, f"no --python: the trainer's environment is this one ({sys.executable})")
    got, text = python_version(python, timeout)
    if got is None:
        return Check("trainer Python", PROBLEM, text, "--python the interpreter of the trainer's environment")
    need = ".".join(map(str, MIN_PYTHON))
    if got[:2] < MIN_PYTHON:
        return Check("trainer Python", PROBLEM, f"{python} is Python {text}, too old: mentor's reward files need "
                     f"Python {need} or newer", f"--python a Python >= {need} (the trainer's own venv)")
    return Check("trainer Python", OK, f"{python} is Python {text}")


__all__ = ["Check", "Gpu", "NodeGpus", "PROBE_TIMEOUT_S", "check_env_settings", "check_shm", "check_trainer_python", "python_version", "read_gpus"]
