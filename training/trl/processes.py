"""How a TRL round's processes start: one plain process, or `accelerate launch` (the flags mentor sets, and
accelerate's own parser and launch checks on them), the GPUs they take on this machine, and a trainer
that dies with mentor (`die_with_parent`, also called by the round's own process, `mentor.training.trl.train`)."""

from __future__ import annotations

import contextlib
import io
import logging
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mentor.pipeline.errors import ConfigError
from mentor.training.gpus import GpuDemand, GpuShortage, local_gpus

if TYPE_CHECKING:
    from mentor.training.trl.launcher import TrlTrainConfig

INSTALL = "pip install 'mentor[trl]'"


# `accelerate launch` flags mentor sets itself (the field to use instead).
_ACCELERATE_OWNED = {"num_processes": "num_processes", "config_file": "accelerate_config", "module": "(always -m)",
                     "m": "(always -m)", "num_cpu_threads_per_process": "cpu_threads"}
# Flags that pick accelerate's launcher; without one (and without a config file) mentor adds --multi_gpu.
_LAUNCHER_FLAGS = ("multi_gpu", "use_deepspeed", "use_fsdp", "use_megatron_lm", "tpu", "cpu")


def on_gpu() -> bool:
    """Whether the round's processes will find a GPU here, asked without torch in mentor's interpreter.

    mentor's own environment (a hint node's venv, a CPU torch) says nothing about the trainer's, and torch's
    ``cuda.is_available()`` would initialise CUDA and poison fork for a hint engine `mentor run` starts
    after a TRL round. `mentor.training.gpus.local_gpus` reads ``MENTOR_FAKE_GPUS``, else
    ``CUDA_VISIBLE_DEVICES`` (as CUDA reads it), else ``nvidia-smi``: what accelerate's processes will see.
    """
    return local_gpus().total > 0


def uses_accelerate(cfg: TrlTrainConfig) -> bool:
    return cfg.num_processes > 1 or cfg.accelerate_config is not None or bool(cfg.accelerate_args)


def accelerate_argv(cfg: TrlTrainConfig, cpu_threads: int | None) -> list[str]:
    argv = ["--num_processes", str(cfg.num_processes)]
    if cfg.accelerate_config:
        argv += ["--config_file", str(Path(cfg.accelerate_config).resolve())]
    args = {k.lstrip("-").replace("-", "_"): v for k, v in cfg.accelerate_args.items()}
    for key in args:
        if key in _ACCELERATE_OWNED:
            raise ConfigError(f"accelerate_args: --{key} is set by mentor; use {_ACCELERATE_OWNED[key]} instead")
    # `--cpu` makes accelerate start one plain process whatever --num_processes says; torchrun (--multi_gpu)
    # starts them all, and on a machine without GPUs TRL's use_cpu makes them a gloo group.
    if cfg.num_processes > 1 and not cfg.accelerate_config and not any(args.get(f) for f in _LAUNCHER_FLAGS):
        argv.append("--multi_gpu")
    if cfg.num_processes > 1 and int(args.get("num_machines", 1) or 1) <= 1 and "main_process_port" not in args:
        argv += ["--main_process_port", str(free_port())]  # two rounds on one machine must not share torchrun's 29500
    if cpu_threads:
        argv += ["--num_cpu_threads_per_process", str(cpu_threads)]
    for key, value in args.items():
        if value is None or value is False:
            continue
        argv += [f"--{key}"] if value is True else [f"--{key}", str(value)]
    return argv


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_with_accelerate(cmd: list[str]) -> None:
    """`accelerate launch`'s own parser and launch checks on `cmd`'s flags; `ConfigError` with its message."""
    if cmd[1:3] != ["-m", "accelerate.commands.launch"]:
        return
    try:
        from accelerate.commands import launch as accelerate_launch  # optional (the trl extra)
    except ImportError as exc:
        raise ConfigError(f"num_processes > 1 needs the accelerate package ({exc}); {INSTALL}") from None
    err = io.StringIO()
    logging.disable(logging.WARNING)  # its "defaults used instead" notice: the launch itself prints it to train.log
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = accelerate_launch.launch_command_parser().parse_args(cmd[3:])
            check = getattr(accelerate_launch, "_validate_launch_command", None)
            if check is not None:  # accelerate's own consistency checks (launcher flags, process counts, config file)
                check(args)
    except SystemExit:
        said = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
        raise ConfigError(f"accelerate launch rejects the command: {said[-1].split('error:', 1)[1].strip() if said else err.getvalue().strip()}") from None
    except (ValueError, AssertionError, OSError) as exc:
        raise ConfigError(f"accelerate launch rejects the command: {exc}") from None
    finally:
        logging.disable(logging.NOTSET)


def gpu_demand(cfg: TrlTrainConfig, spec: dict[str, Any]):
    """One GPU per training process on this machine (None on CPU); a vLLM server (vllm_mode server) runs elsewhere."""
    if spec["grpo"].get("use_cpu"):
        return None

    machines = int(cfg.accelerate_args.get("num_machines", 1) or 1)
    per_machine = max(1, cfg.num_processes // machines)
    return GpuDemand.of_roles("trl", {"trainer processes": per_machine},
                              detail=f"{per_machine} of {cfg.num_processes} processes on this machine" if machines > 1 else "")


def check_gpus(demand) -> None:
    """accelerate starts the processes on this machine (each machine of a multi-machine run has its own launch)."""
    supply = local_gpus()
    why = demand.shortage(supply)
    if why:
        have = int(supply.usable)
        fixes = [f"set num_processes {have}"] if have > 0 else []
        fixes += ["spread the processes over machines (accelerate_args num_machines, machine_rank, main_process_ip; "
                  "one `mentor train` per machine)", "set use_cpu: true"]
        raise GpuShortage(f"{why}: {', or '.join(fixes)}")


def die_with_parent() -> None:
    """Linux: the trainer gets SIGKILL when mentor dies (kill -9 included), so no orphan keeps
    writing into the round's log while a rerun starts a new trainer."""
    try:
        import ctypes  # here, inside the try: a Python without ctypes just goes without the signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: a kill of mentor alone leaves the trainer running (kill its group)
        pass


__all__ = ["INSTALL", "accelerate_argv", "check_gpus", "check_with_accelerate", "die_with_parent", "free_port", "gpu_demand",
           "on_gpu", "uses_accelerate"]
