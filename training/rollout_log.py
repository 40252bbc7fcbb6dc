"""Per-process JSONL shards of rollout records, written by the reward functions.

Every rollout the trainer scores becomes one line, a `schemas.OPENRLHF_RECORD_FIELDS`
record (plus the optional fields), in ``<rollout dir>/<trainer>-<host>-<pid>-<rand>.jsonl``.
`mentor ingest --format openrlhf <rollout dir>` turns the shards into canonical
rollouts.

Durability. Each record is encoded to one ``bytes`` line and handed to the
kernel with a single ``os.write`` on an ``O_APPEND`` descriptor, under a lock
(threads of one process share the shard; processes never share one). Nothing is
buffered in user space, so a SIGKILLed trainer loses at most the records being
written at that instant, and earlier lines are never touched. A torn last line
(possible only if the disk fills mid-write) is quarantined by ingest as
``bad_json_line``. The page cache survives a process kill; set
``MENTOR_ROLLOUT_FSYNC=1`` to also survive a machine crash (slower).

Where the log goes (first that is set):
1. ``MENTOR_ROLLOUT_DIR`` in the environment (`mentor train` sets it);
2. ``mentor_reward.json`` beside the reward file: ``{"rollout_dir": "..."}``
   (a relative path is relative to that file);
3. nowhere: the reward still works, and a warning says logging is off.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from mentor.pipeline.schemas import OPENRLHF_RECORD_FIELDS, OPENRLHF_RECORD_OPTIONAL, SCHEMA_VERSION

log = logging.getLogger(__name__)

ENV_DIR = "MENTOR_ROLLOUT_DIR"
ENV_FSYNC = "MENTOR_ROLLOUT_FSYNC"
CONFIG_NAME = "mentor_reward.json"


def resolve_rollout_dir(beside: str | os.PathLike | None = None) -> Path | None:
    """The rollout directory from the environment, else from `mentor_reward.json` beside `beside`."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    if beside is not None:
        cfg_path = Path(beside).resolve().parent / CONFIG_NAME
        if cfg_path.is_file():
            try:
                cfg = json.loads(cfg_path.read_text())
                value = cfg["rollout_dir"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("%s: unreadable (%s); expected {\"rollout_dir\": \"...\"}; rollout logging is off", cfg_path, exc)
                return None
            path = Path(value).expanduser()
            return path if path.is_absolute() else cfg_path.parent / path
    return None


def write_reward_config(reward_file_dir: str | os.PathLike, rollout_dir: str | os.PathLike) -> Path:
    """Write ``mentor_reward.json`` (the file-based alternative to MENTOR_ROLLOUT_DIR)."""
    path = Path(reward_file_dir) / CONFIG_NAME
    path.write_text(json.dumps({"rollout_dir": str(Path(rollout_dir).resolve())}, indent=2) + "\n")
    return path


def make_record(
    *,
    problem_id: str,
    round_: int,
    domain: str,
    prompt: str,
    response: str,
    correct: float,
    reward: float,
    hint_id: str | None = None,
    label: str | None = None,
    truncated: bool | None = None,
    step: int | None = None,
    trainer: str = "openrlhf",
) -> dict[str, Any]:
    """A record with the required fields and every optional field that is known."""
    rec: dict[str, Any] = {
        "v": int(SCHEMA_VERSION),
        "problem_id": str(problem_id),
        "round": int(round_),
        "domain": domain,
        "prompt": prompt,
        "response": response,
        "correct": float(correct),
        "reward": float(reward),
        "trainer": trainer,
    }
    for key, value in (("hint_id", hint_id), ("label", label), ("truncated", truncated), ("step", step)):
        if value is not None:
            rec[key] = value
    return rec


def check_record(rec: dict[str, Any]) -> None:
    """Raise ValueError if `rec` lacks a required field or has a wrong type."""
    for key, typ in OPENRLHF_RECORD_FIELDS.items():
        if key not in rec:
            raise ValueError(f"rollout record misses {key!r}")
        if not isinstance(rec[key], typ) or (typ is int and isinstance(rec[key], bool)):
            raise ValueError(f"rollout record field {key!r} is {type(rec[key]).__name__}, expected {typ}")
    for key, typ in OPENRLHF_RECORD_OPTIONAL.items():
        if rec.get(key) is not None and not isinstance(rec[key], typ):
            raise ValueError(f"rollout record field {key!r} is {type(rec[key]).__name__}, expected {typ}")


class RolloutLog:
    """A thread-safe append-only JSONL shard owned by this process."""

    def __init__(self, directory: str | os.PathLike, trainer: str = "openrlhf") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pid = os.getpid()
        host = socket.gethostname().split(".")[0] or "host"
        self.path = self.directory / f"{trainer}-{host}-{self.pid}-{uuid.uuid4().hex[:8]}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._fsync = os.environ.get(ENV_FSYNC, "") not in ("", "0")
        self.written = 0

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (``ts``, ``pid`` and ``seq`` are added here)."""
        with self._lock:
            rec = dict(record)
            rec["ts"] = time.time()
            rec["pid"] = self.pid
            rec["seq"] = next(self._seq)
            data = (json.dumps(rec, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
            view = memoryview(data)
            while view:  # one write almost always; loop on a short write
                n = os.write(self._fd, view)
                view = view[n:]
            if self._fsync:
                os.fsync(self._fd)
            self.written += 1

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


_LOGS: dict[tuple[str, str, int], RolloutLog] = {}
_LOGS_LOCK = threading.Lock()


def rollout_log(directory: str | os.PathLike, trainer: str = "openrlhf") -> RolloutLog:
    """The shard of this process for `directory` (a new shard after fork)."""
    key = (str(Path(directory).resolve()), trainer, os.getpid())
    with _LOGS_LOCK:
        writer = _LOGS.get(key)
        if writer is None:
            writer = RolloutLog(directory, trainer)
            _LOGS[key] = writer
        return writer


__all__ = [
    "CONFIG_NAME",
    "ENV_DIR",
    "RolloutLog",
    "check_record",
    "make_record",
    "resolve_rollout_dir",
    "rollout_log",
    "write_reward_config",
]
