"""A verl round's checkpoints: the last one verl recorded, verl's model merger that turns it into the
round's model, and the rollout log made to match what a resumed round will redo."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from mentor.training.rollout_log import run_shards

if TYPE_CHECKING:
    from mentor.training.verl.config import VerlTrainConfig

LATEST = "latest_checkpointed_iteration.txt"


def last_checkpoint(ckpt: Path) -> tuple[int, Path] | None:
    """(step, <ckpt>/global_step_N/actor) of the last checkpoint verl recorded, or None."""
    marker = ckpt / LATEST
    try:
        step = int(marker.read_text().strip())
    except (OSError, ValueError):
        return None
    actor = ckpt / f"global_step_{step}" / "actor"
    return (step, actor) if actor.is_dir() else None


def merge_backend(composed) -> str:
    """The merger's --backend for the composed config's actor strategy (fsdp without a composed config)."""
    strategy = str(composed.actor_rollout_ref.actor.strategy) if composed is not None else "fsdp"
    return "megatron" if strategy == "megatron" else "fsdp"


def merge_command(cfg: VerlTrainConfig, actor_dir: Path, target: Path, backend: str = "fsdp") -> list[str]:
    return [cfg.python, "-m", "verl.model_merger", "merge", "--backend", backend, "--local_dir", str(actor_dir),
            "--target_dir", str(target)]


def merge_checkpoint(cfg: VerlTrainConfig, actor_dir: Path, backend: str, fh) -> tuple[int, list[str]]:
    """verl's model merger on `actor_dir` into a temporary folder, renamed to <train>/model when complete."""
    final = cfg.output_dir
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = merge_command(cfg, actor_dir, tmp, backend)
    fh.write(f"\n# mentor: merging {actor_dir} into {final}\n# {shlex.join(cmd)}\n".encode())
    fh.flush()
    try:
        code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    except OSError as exc:
        fh.write(f"cannot start {cmd[0]}: {exc}\n".encode())
        return 127, cmd
    if code == 0 and not (tmp / "config.json").is_file():
        fh.write(f"# mentor: the merger exited 0 but wrote no config.json into {tmp}\n".encode())
        code = 1
    if code == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    return code, cmd


def prepare_logs(directory: Path, resume: tuple[int, Path] | None, run: str) -> str | None:
    """Make a rerun's rollout log match what verl will redo: with no checkpoint, remove the killed
    attempt's shards; resuming from one, drop the records logged after it (those steps are scored again).
    Only run `run`'s own shards (`rollout_log.run_shards`): another run sharing the folder keeps its log."""
    shards = run_shards(directory, "verl", run)
    if not shards:
        return None
    if resume is None:
        for f in shards:
            f.unlink()
        return f"removed {len(shards)} rollout shard(s) of an earlier, unfinished attempt"
    cutoff = (resume[1].parent.parent / LATEST).stat().st_mtime
    dropped = 0
    for f in shards:
        tmp = f.with_name(f".{f.name}.tmp")
        before = dropped
        with open(f, "rb") as src, open(tmp, "wb") as dst:  # streamed: a round's log can be large
            for line in src:
                try:
                    ts = float(json.loads(line).get("ts", 0))
                except (ValueError, AttributeError, TypeError):
                    ts = 0.0  # a torn line stays for ingest to quarantine
                if ts <= cutoff:
                    dst.write(line)
                else:
                    dropped += 1
        if dropped > before:
            os.replace(tmp, f)
        else:
            tmp.unlink()
    return f"resuming from checkpoint step {resume[0]}: dropped {dropped} rollout record(s) logged after it"
