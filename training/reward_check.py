"""Before a round: the trainer's own Python loads the reward function the way the trainer will.

The trainer's environment is often not mentor's (another image, another Python,
its own pins): a reward file that cannot import mentor there fails at load (see
the reward files), but only once the trainer has started its engines. So every
launcher runs, before launch and in ``--dry-run``, the trainer's interpreter
(``python`` of the round config) on the trainer's own loading code:

- OpenRLHF and verl load a reward *file* by path (``importlib.util.spec_from_file_location``,
  then ``exec_module``; OpenRLHF's ``SingleTurnAgentExecutor``, verl's
  ``get_custom_reward_fn``) and take a function from it;
- TRL's round (``mentor.training.trl.train``) imports a *module*.

A failure is a `ConfigError` (exit 2) with the interpreter's last line, which for
mentor's reward files says which Python it was and how to install mentor there.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from mentor.pipeline.errors import ConfigError

TIMEOUT_S = 300.0

_LOAD = {
    "file": (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('reward_func', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "getattr(module, sys.argv[2])\n"
    ),
    "module": "import importlib, sys\ngetattr(importlib.import_module(sys.argv[1]), sys.argv[2])\n",
}


def run_trainer_python(cmd: list[str], env: dict[str, str] | None, timeout_s: float, purpose: str,
                       timeout_message: str) -> subprocess.CompletedProcess:
    """Run `cmd` (``cmd[0]``: the trainer's Python; `purpose`: what for, e.g. " to check the Ray cluster"), its output
    captured as text; a ConfigError when it cannot start (naming the fix) or runs past `timeout_s` (`timeout_message`)."""
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except OSError as exc:
        raise ConfigError(f"python {cmd[0]}: cannot run it{purpose} ({exc.strerror or exc}); set python to the "
                          "interpreter of the trainer's environment") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(timeout_message) from None


def check_reward_loads(python: str, target: str | Path, attribute: str, env: dict[str, str], kind: str = "file",
                       timeout_s: float = TIMEOUT_S) -> str:
    """Load `target` (a reward file, or a module name with ``kind="module"``) and its `attribute` with `python`.

    Returns a one-line note of what was checked; raises `ConfigError` naming the interpreter and the cause.
    """
    what = f"{target}:{attribute}" if kind == "file" else f"{target}.{attribute}"
    cmd = [python, "-c", _LOAD[kind], str(target), attribute]
    proc = run_trainer_python(cmd, env, timeout_s, "",
                              f"the trainer's Python ({python}) did not load the reward {what} within {timeout_s:.0f}s")
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        raise ConfigError(f"the trainer's Python ({python}) cannot load the reward {what}, so the round would not score: "
                          f"{lines[-1] if lines else f'exit code {proc.returncode}'}")
    return f"the trainer's Python ({python}) loads the reward {what}"


__all__ = ["check_reward_loads"]
