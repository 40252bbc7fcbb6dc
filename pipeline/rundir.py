"""Run directories: layout, done markers keyed by inputs + config, stage state.

    runs/<name>/
      workflow.yaml                 the resolved workflow, as run
      base-prompts/                 unhinted prompts for round 0 (when no initial logs)
      round-000/
        train/ rollouts/ collapsed/ hints/ prompts/     written by the round stages train, ingest,
                                                        mine, hint, build (each declares its folder,
                                                        ``Stage.round_dir``; `mentor.stages.stage_dirs`); each with stats.json
        <dir>/_done/<key>.done      written last, after every output is in place
        <dir>/_running.json         while the stage runs (pid, start time)
        <dir>/_failed.json          the last error, until the stage succeeds

round-NNN/prompts/ holds the prompts built from round NNN's hints: what round
NNN+1's trainer trains on.

A stage's key hashes its config and the keys of the stages it reads from (or
the content of external input files), so a changed config re-runs that stage
and, through the chain of keys, everything after it, never what came before.
The driver (`mentor.pipeline.stage.run_stage` with a key) keeps this bookkeeping for every
stage. Markers are written after the outputs; a run killed at any moment leaves at
most temporary files (``.*.tmp``, cleaned on the next start) and no marker.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mentor.pipeline import plugins
from mentor.pipeline.io import config_hash, files_hash, read_json, write_json_atomic
from mentor.pipeline.outdir import pid_alive
from mentor.pipeline.stage import STATS_FILE, write_done



def outputs_fingerprint(path: Path) -> str:
    """Content fingerprint of a stage's data outputs (Parquet and JSONL files, not bookkeeping)."""
    files = sorted(path.rglob("*")) if path.exists() else []
    return files_hash((str(f.relative_to(path)), f) for f in files if f.is_file() and f.suffix in (".parquet", ".jsonl")
                      and not any(part.startswith(("_", ".")) for part in f.relative_to(path).parts))


def round_name(r: int) -> str:
    return f"round-{r:03d}"


def inputs_key(paths: list[Path]) -> str:
    """Content key of external input files (sha256 of each, in order)."""
    return files_hash((p.name, p) for p in paths)


def stage_key(stage: str, config: Any, upstream: list[str]) -> str:
    """A stage's resume key: its name, its config's hash and the tokens of what it reads."""
    return config_hash({"stage": stage, "config": config_hash(config), "upstream": upstream})


def _pid(value: Any) -> int | None:
    """A process id as `begin` writes it (an int > 0), or None: -1 and 0 are not one process (os.kill reads them
    as "every process" and "this group", both alive)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31 else None


def _read_dict(path: Path) -> dict[str, Any] | None:
    """A bookkeeping JSON file as a mapping; None when it is missing, unreadable, or not a mapping."""
    try:
        value = read_json(path) if path.is_file() else None
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class StageDir:
    path: Path
    stage: str

    @property
    def done_dir(self) -> Path:
        return self.path / "_done"

    def done_key(self) -> str | None:
        markers = sorted(self.done_dir.glob("*.done")) if self.done_dir.exists() else []
        return markers[-1].stem if markers else None

    def is_done(self, key: str) -> bool:
        return (self.done_dir / f"{key}.done").exists()

    def begin(self, key: str) -> None:
        """Invalidate old markers, clean temporaries of a killed run, record that we run."""
        self.path.mkdir(parents=True, exist_ok=True)
        if self.done_dir.exists():
            for m in self.done_dir.glob("*.done"):
                m.unlink()
        for tmp in self.path.rglob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        (self.path / "_failed.json").unlink(missing_ok=True)
        write_json_atomic({"pid": os.getpid(), "key": key, "started": time.time()}, self.path / "_running.json")

    def finish(self, key: str, info: dict[str, Any]) -> None:
        """Mark done: the marker is the last thing written."""
        write_done(self.done_dir / f"{key}.done", key, **info)
        (self.path / "_running.json").unlink(missing_ok=True)

    def fail(self, error: str) -> None:
        write_json_atomic({"error": error, "time": time.time()}, self.path / "_failed.json")
        (self.path / "_running.json").unlink(missing_ok=True)

    def state(self) -> str:
        """done | running | interrupted | failed | pending."""
        running = self.path / "_running.json"
        if running.exists():
            pid = _pid((_read_dict(running) or {}).get("pid"))
            return "running" if pid is not None and pid_alive(pid) else "interrupted"
        if (self.path / "_failed.json").exists():
            return "failed"
        if self.done_key():
            return "done"
        return "pending"

    def last_error(self) -> str | None:
        f = self.path / "_failed.json"
        if not f.exists():
            return None
        error = (_read_dict(f) or {}).get("error")
        if isinstance(error, str) and error.strip():
            return error
        # cut short by a kill, or edited: still a failure
        return f"{f}: unreadable (the stage failed; its error message was lost)"

    def stats(self) -> dict[str, Any]:
        """stats.json as a mapping ({} when missing, unreadable or not a mapping)."""
        return _read_dict(self.path / STATS_FILE) or {}

    def outcome(self) -> dict[str, Any]:
        """A train stage's outcome.json as a mapping ({} when missing, unreadable or not a mapping)."""
        return _read_dict(self.path / "outcome.json") or {}


@dataclass(frozen=True)
class RunDir:
    path: Path

    def round_dir(self, r: int) -> Path:
        return self.path / round_name(r)

    def stage(self, r: int, stage: Any) -> StageDir:
        """Round `r`'s folder of `stage` (a `Stage`, or a stage's name)."""
        if isinstance(stage, str):
            stage = plugins.load("stages", stage).STAGE
        return StageDir(self.round_dir(r) / stage.round_dir, stage.name)

    def base_prompts(self, stage: Any) -> StageDir:
        """The run's unhinted base prompts, made by `stage` (the one that ``feeds_next_round``: its ``base_job``)."""
        return StageDir(self.path / "base-prompts", stage.name)

    def rounds(self) -> list[int]:
        """The rounds that have a folder (``round-NNN``, as `round_name` writes them), in order."""
        out = []
        for d in sorted(self.path.glob("round-*")):
            digits = d.name.split("-", 1)[1]
            if d.is_dir() and digits.isascii() and digits.isdigit() and d.name == round_name(int(digits)):
                out.append(int(digits))
        return out

    def is_run(self) -> bool:
        """Whether `mentor run` wrote this folder (its workflow.yaml, or a round folder)."""
        return (self.path / "workflow.yaml").is_file() or bool(self.rounds())
