"""What ``mentor doctor`` checks on a node for TRL rounds (`TrlLauncher.node_checks`): accelerate's default config.

``accelerate launch`` without ``--config_file`` merges ``$HF_HOME/accelerate/default_config.yaml`` into every
launch: mentor's TRL rounds with several processes (or ``accelerate_args``) included. The check says what it sets.
"""

from __future__ import annotations

import os
from pathlib import Path

# accelerate launch flags mentor passes itself on a TRL round (`mentor.training.trl.processes`); the default
# config's values for them do not apply.
MENTOR_ACCELERATE_FLAGS = ("num_processes", "num_cpu_threads_per_process", "main_process_port", "multi_gpu")
FIX = "fix or remove it (`accelerate config`)"


def accelerate_default_config() -> Path:
    """Where ``accelerate launch`` looks for its default config (accelerate's ``commands/config/config_args.py``)."""
    home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def check_accelerate_config() -> tuple[str, str | None]:
    """``(detail, fix)``: what the default config sets for mentor's TRL rounds; a fix when it cannot be read."""
    path = accelerate_default_config()
    if not path.is_file():
        return f"none at {path}: TRL rounds launch with mentor's flags only", None
    import yaml  # a mentor dependency

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:  # accelerate launch would fail on it the same way
        return f"{path} cannot be read ({str(exc).splitlines()[0]})", FIX
    if not isinstance(data, dict):
        return f"{path} is not a mapping", FIX
    applies = {k: v for k, v in data.items() if k not in MENTOR_ACCELERATE_FLAGS and v not in (None, {}, [])}
    overridden = [k for k in MENTOR_ACCELERATE_FLAGS if k in data]
    listing = ", ".join(f"{k}: {v}" for k, v in sorted(applies.items())) or "nothing"
    detail = f"{path} is merged into every TRL round mentor launches through accelerate (num_processes > 1, " \
             f"accelerate_args): it sets {listing}"
    if overridden:
        detail += f"; mentor's own flags win for {', '.join(overridden)}"
    if "distributed_type" in applies:
        detail += " (its distributed_type only where mentor passes no --multi_gpu: one process, or accelerate_args)"
    return detail, None


__all__ = ["MENTOR_ACCELERATE_FLAGS", "accelerate_default_config", "check_accelerate_config"]
