"""Per-process JSONL shards of rollout records, written by the reward functions.

Every rollout the trainer scores becomes one line, a `schemas.RECORD_FIELDS`
record (plus the optional fields), in ``<rollout dir>/<trainer>-<run>-<host>-<pid>-<rand>.jsonl``.
`mentor ingest --format openrlhf <rollout dir>` turns the shards into canonical
rollouts.

The run's identity. ``<run>`` (and each record's ``run`` field) is ``MENTOR_RUN_ID``,
which every launcher sets to `run_identity` of the round's train folder: a rerun of
the same round has the same identity, another run (another round folder) has another,
even where several runs share one ``rollout_log_dir``. A launcher cleans a killed
attempt's shards with `run_shards` (its own identity only) and never touches the
shards of another run or of a writer without an identity (``<trainer>-<host>-...``,
written outside `mentor train`). To read one run of a shared folder:
``mentor ingest --format openrlhf '<dir>/*-<run>-*.jsonl'`` (outcome.json gives the
run's ``rollout_glob``).

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

Reaching the reward function on every node. OpenRLHF runs ``reward_func`` inside
each vLLM engine's Ray actor (``RolloutRayActor``, placed by the engines'
placement group on any node); verl runs ``compute_score`` in its ``TaskRunner``
actor, in ``compute_reward_async`` tasks, or in ``RewardLoopWorker`` actors
spread round-robin over every alive node. A Ray worker does not inherit the
launcher's environment when the trainer joins a cluster started by
``ray start``: only the job's runtime environment reaches it. Both trainers
call ``ray.init(runtime_env={"env_vars": {...}})`` themselves with no hook for
more variables, but Ray merges into it the job config found in
``RAY_JOB_CONFIG_JSON_ENV_VAR`` (what ``ray job submit --runtime-env-json``
sets for its entrypoint), key by key for ``env_vars``. `ray_job_config_env`
builds that variable with every ``MENTOR_*`` setting (`reward_env_vars`), for a
fresh local cluster and an existing one alike; `check_rollout_reach` refuses a
round whose workers cannot write the directory or write where this machine
cannot read (a local path on a multi-node cluster).
"""

from __future__ import annotations

import contextlib
import hashlib
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

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.schemas import RECORD_FIELDS, RECORD_OPTIONAL, RECORDS_FORMAT, SCHEMA_VERSION

log = logging.getLogger(__name__)

ENV_DIR = "MENTOR_ROLLOUT_DIR"
ENV_FSYNC = "MENTOR_ROLLOUT_FSYNC"
ENV_ROUND = "MENTOR_ROUND"
ENV_RUN = "MENTOR_RUN_ID"
ENV_RESPONSE_LIMIT = "MENTOR_RESPONSE_LIMIT"  # the response limit the launcher set, in tokens (verl's reward counts to it)
ENV_POLICY_TOKENIZER = "MENTOR_POLICY_TOKENIZER"  # the policy's tokenizer: its model folder or name
CONFIG_NAME = "mentor_reward.json"
# The reward path's settings (rollout dir, fsync, verifier and sandbox limits) all start so.
REWARD_ENV_PREFIX = "MENTOR_"
# Ray reads a job's runtime environment from here in ray.init() (ray._private.runtime_env.constants).
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
PROBE_PREFIX = ".mentor-probe-"


class RolloutDirUnreachable(ConfigError):
    """The trainer's Ray workers cannot log rollouts where mentor will read them (exit 2, before launch)."""


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


def reward_env_vars(*envs: dict[str, str] | os._Environ) -> dict[str, str]:
    """Every ``MENTOR_*`` variable of `envs` (a later mapping wins): what the reward function reads."""
    out: dict[str, str] = {}
    for env in envs:
        out.update({k: str(v) for k, v in env.items() if k.startswith(REWARD_ENV_PREFIX)})
    return out


def ray_job_config_env(env_vars: dict[str, str], current: str | None = None) -> dict[str, str]:
    """``{RAY_JOB_CONFIG_JSON_ENV_VAR: json}`` that adds `env_vars` to the runtime env of the Ray job the
    trainer's own ``ray.init()`` starts or joins, so every worker on every node gets them.

    `current`: the variable's value already set (inside ``ray job submit``); its runtime env and
    metadata are kept, `env_vars` win over its ``env_vars``. A value that is not JSON is a ConfigError.
    """
    job: dict[str, Any] = {}
    if current:
        try:
            job = json.loads(current)
            if not isinstance(job, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise ConfigError(f"{RAY_JOB_CONFIG_ENV} is set but is not a JSON job config ({exc}); unset it") from None
    runtime_env = dict(job.get("runtime_env") or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **env_vars}
    job["runtime_env"] = runtime_env
    return {RAY_JOB_CONFIG_ENV: json.dumps(job, sort_keys=True)}


def check_local_dir(directory: str | os.PathLike) -> None:
    """Refuse when this machine cannot create and write `directory` (a fresh local Ray cluster's workers run here)."""
    d = Path(directory)
    probe = d / f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}.probe"
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe.write_text("mentor\n")
        probe.unlink()
    except OSError as exc:
        raise RolloutDirUnreachable(
            f"rollout log dir {d}: cannot write there ({type(exc).__name__}: {exc.strerror or exc}); "
            "the reward function could not log a single rollout: set rollout_log_dir to a writable folder"
        ) from None


def check_rollout_reach(cluster: dict | None, directory: str | os.PathLike) -> list[str]:
    """Refuse unless every node of `cluster` wrote its probe file into `directory` and this machine reads it back.

    `cluster`: what `mentor.training.ray_preflight` reported for the Ray cluster the trainer joins;
    None = the trainer starts a fresh local cluster (its workers are on this machine): the folder
    only has to be writable here. Returns the hosts checked; removes the probe files it can see.
    """
    d = Path(directory)
    if cluster is None:
        check_local_dir(d)
        return [socket.gethostname()]
    problems: list[str] = []
    seen: list[Path] = []
    for node in cluster.get("nodes", []):
        where = f"node {node.get('host')} ({node.get('ip')})"
        probe = node.get("probe") or {}
        if not probe.get("ok"):
            problems.append(f"{where}: {probe.get('error') or 'the probe task did not run'}")
            continue
        path = Path(probe["path"])
        if Path(probe.get("dir", "")) != d:
            problems.append(f"{where}: its workers see {ENV_DIR}={probe.get('dir')!r}, not {str(d)!r}")
        elif not path.is_file() or node.get("node_id", "") not in path.read_text(errors="replace"):
            problems.append(f"{where} wrote {path}, which this machine cannot see (a disk local to that node)")
        else:
            seen.append(path)
        if probe.get("mentor_error"):
            problems.append(f"{where}: mentor is not importable there, so every reward would be 0 ({probe['mentor_error']})")
    for path in seen:
        with contextlib.suppress(OSError):
            path.unlink()
    if problems:
        raise RolloutDirUnreachable(
            f"rollout log dir {d} is not reachable from every node of the Ray cluster at {cluster.get('address')}: "
            + "; ".join(problems)
            + ". Put rollout_log_dir (and the run dir) on a filesystem every node mounts at the same path, "
            "with mentor installed on every node"
        )
    return [str(n.get("host")) for n in cluster.get("nodes", [])]


def run_identity(train_path: str | os.PathLike) -> str:
    """The identity of the run that trains in `train_path`: the same for every attempt of that round, another
    for every other round folder (12 hex digits of the folder's absolute path)."""
    return hashlib.sha256(str(Path(train_path).resolve()).encode()).hexdigest()[:12]


def run_shards(directory: str | os.PathLike, trainer: str, run: str) -> list[Path]:
    """The shards of `directory` that run `run` of `trainer` wrote (none of another run's, none without an identity)."""
    d = Path(directory)
    return sorted(d.glob(f"{trainer}-{run}-*.jsonl")) if d.is_dir() else []


def run_glob(directory: str | os.PathLike, run: str) -> str:
    """A glob of every shard of run `run` in `directory`, whatever trainer wrote it (for `mentor ingest`)."""
    return str(Path(directory) / f"*-{run}-*.jsonl")


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
    trainer: str = RECORDS_FORMAT,
    run: str | None = None,
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
    for key, value in (("hint_id", hint_id), ("label", label), ("truncated", truncated), ("step", step), ("run", run)):
        if value is not None:
            rec[key] = value
    return rec


def check_record(rec: dict[str, Any]) -> None:
    """Raise ValueError if `rec` lacks a required field or has a wrong type."""
    for key, typ in RECORD_FIELDS.items():
        if key not in rec:
            raise ValueError(f"rollout record misses {key!r}")
        if not isinstance(rec[key], typ) or (typ is int and isinstance(rec[key], bool)):
            raise ValueError(f"rollout record field {key!r} is {type(rec[key]).__name__}, expected {typ}")
    for key, typ in RECORD_OPTIONAL.items():
        if rec.get(key) is not None and not isinstance(rec[key], typ):
            raise ValueError(f"rollout record field {key!r} is {type(rec[key]).__name__}, expected {typ}")


class RolloutLog:
    """A thread-safe append-only JSONL shard owned by this process."""

    def __init__(self, directory: str | os.PathLike, trainer: str = RECORDS_FORMAT, run: str | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pid = os.getpid()
        self.run = run if run is not None else (os.environ.get(ENV_RUN) or None)
        host = socket.gethostname().split(".")[0] or "host"
        who = f"{trainer}-{self.run}" if self.run else trainer
        self.path = self.directory / f"{who}-{host}-{self.pid}-{uuid.uuid4().hex[:8]}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._fsync = os.environ.get(ENV_FSYNC, "") not in ("", "0")
        self.written = 0

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (``ts``, ``pid``, ``seq`` and the run's identity are added here)."""
        with self._lock:
            rec = dict(record)
            if self.run:
                rec.setdefault("run", self.run)
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


_LOGS: dict[tuple[str, str, int, str], RolloutLog] = {}
_LOGS_LOCK = threading.Lock()


def rollout_log(directory: str | os.PathLike, trainer: str = RECORDS_FORMAT) -> RolloutLog:
    """The shard of this process for `directory` and the run in ``MENTOR_RUN_ID`` (a new shard after fork)."""
    key = (str(Path(directory).resolve()), trainer, os.getpid(), os.environ.get(ENV_RUN) or "")
    with _LOGS_LOCK:
        writer = _LOGS.get(key)
        if writer is None:
            writer = RolloutLog(directory, trainer)
            _LOGS[key] = writer
        return writer


__all__ = [
    "CONFIG_NAME",
    "ENV_DIR",
    "ENV_ROUND",
    "ENV_POLICY_TOKENIZER",
    "ENV_RESPONSE_LIMIT",
    "ENV_RUN",
    "RAY_JOB_CONFIG_ENV",
    "RolloutDirUnreachable",
    "RolloutLog",
    "check_local_dir",
    "check_record",
    "check_rollout_reach",
    "make_record",
    "ray_job_config_env",
    "resolve_rollout_dir",
    "reward_env_vars",
    "rollout_log",
    "run_glob",
    "run_identity",
    "run_shards",
    "write_reward_config",
]
