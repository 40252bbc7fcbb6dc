"""`mentor train`: one OpenRLHF 0.11 GRPO round from a `round.yaml`.

The command (flags as OpenRLHF 0.11.2's ``train_ppo_ray`` parser spells them)::

    python -m openrlhf.cli.train_ppo_ray
      --actor.model_name_or_path <previous round's final model | base model in round 0>
      --data.prompt_dataset <the round's prompt shards>
      --data.input_key prompt --data.label_key label --data.apply_chat_template (messages; not for text prompts)
      --reward.remote_url <mentor's reward file>
        (with live_hints: --train.agent_func_path <stages/hint/live.py>, the live-hints entry: mentor.training.openrlhf.live)
      --algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 4
      --ckpt.path <round>/train/ckpt --ckpt.output_dir <round>/train/model
      --train.num_episodes 1
      --actor.num_nodes/--actor.num_gpus_per_node/--ref.*/--vllm.num_engines/... from the config
      <extra_args from the config>

Prompts are never cut and responses have an explicit limit (`mentor.training.prompt_limits`):
``rollout.max_new_tokens`` is extra_args' value or mentor's 4096 (OpenRLHF's own default
is none: ``data.max_len`` 2048 minus the prompt); OpenRLHF keeps only the last
``data.max_len - rollout.max_new_tokens`` tokens of a prompt, so the launcher measures
the round's longest prompt in the policy's tokens and, where ``data.max_len`` is not set,
sets it to that prompt plus its margin plus the response limit (at least OpenRLHF's
2048); a ``data.max_len`` set in ``extra_args`` that cannot hold them is refused. The trainer's own Python
(``python``) loads the reward file first, as OpenRLHF will.

It runs with ``MENTOR_ROLLOUT_DIR`` pointing at the round's rollout log dir,
so the reward file logs every rollout there; the variable reaches the Ray
workers on every node through the job's runtime env (``RAY_JOB_CONFIG_JSON_ENV_VAR``,
see `mentor.training.rollout_log`). Before launch, `preflight` refuses a round
the GPUs cannot place or whose rollout dir the workers cannot reach. Output and error go to
``<round>/train/train.log``; the outcome (exit code, log file, final model) to
``<round>/train/outcome.json``. A failing trainer raises `TrainError` with the
log's tail.

Round k starts from round k-1's ``--ckpt.output_dir`` (found in that round's
outcome.json) and uses a fresh ``--ckpt.path``: a loaded DeepSpeed checkpoint
would restore the dataloader position of the old prompt file.

OpenRLHF's own launch checks on the command (`mentor train --dry-run`) are in
`openrlhf.check`, the GPUs a round reserves in `openrlhf.placement`.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import write_json_atomic
from mentor.pipeline.yaml_io import read_yaml_mapping
from mentor.training.gpus import cluster_supply, local_gpus
from mentor.training.live_hints import ENV_TRAINER, LiveHintsConfig, live_entry_file, live_text
from mentor.training.launcher import LauncherBase, ModelRef, RewardFile, RoundConfig, finish_round, outcome_record, parse_round_config
from mentor.training.openrlhf.check import check_with_openrlhf
from mentor.training.openrlhf.placement import round_demand
from mentor.training.prompt_format import check_template_kwargs, prompt_files_are_text
from mentor.training.prompt_limits import LongestPrompt, longest_prompt, require, response_limit
from mentor.training.ray_preflight import check_reward_reach, probe_cluster
from mentor.training.reward_check import check_reward_loads
from mentor.training.rollout_log import (
    ENV_DIR,
    ENV_ROUND,
    ENV_RUN,
    RAY_JOB_CONFIG_ENV,
    check_rollout_reach,
    ray_job_config_env,
    reward_env_vars,
    run_glob,
    run_identity,
)

log = logging.getLogger(__name__)

REWARD_FILE = Path(__file__).resolve().parent / "reward.py"
# --train.agent_func_path of a round with live_hints: the live-hints entry's file (stage code, above this room: named by its
# file, never imported here), loaded by path by OpenRLHF; it takes `AgentExecutor` from this folder's live hook (`live.py`).
LIVE_FILE = live_entry_file()
RAY_INIT = "openrlhf.cli.train_ppo_ray:train"  # the driver whose own ray.init statement the preflight joins with


class TrainConfig(RoundConfig):
    """One training round (`round.yaml`)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["openrlhf"] = Field("openrlhf", description="Selects the OpenRLHF trainer (the default kind of a round.yaml).")
    base_model: ModelRef = Field(description="HF name or path of the base policy (round 0's actor).")
    reward_file: RewardFile | None = Field(None, description="Reward file for --reward.remote_url (default: mentor's openrlhf/reward.py).")
    n_samples_per_prompt: int = Field(4, ge=2, description="GRPO group size (--rollout.n_samples_per_prompt).")
    advantage_estimator: str = Field("group_norm", description="--algo.advantage.estimator (group_norm = GRPO).")
    num_nodes: int = Field(1, ge=1, description="Nodes for the actor and reference models.")
    actor_gpus_per_node: int = Field(1, ge=1, description="--actor.num_gpus_per_node (OpenRLHF's default is 8).")
    ref_gpus_per_node: int = Field(1, ge=1, description="--ref.num_gpus_per_node (OpenRLHF's default is 8).")
    vllm_num_engines: int = Field(1, ge=1, description="--vllm.num_engines.")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="--vllm.tensor_parallel_size.")
    extra_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other OpenRLHF flag, e.g. {'train.batch_size': 64, 'algo.kl.use_loss': true}: "
        "true = bare flag, false/null = omitted, a list = several values.",
    )
    live_hints: LiveHintsConfig | None = Field(
        None, description="Hint and re-roll a group that collapses inside the step (mentor.training.openrlhf.live: an agent "
        "executor, --train.agent_func_path, on every vLLM engine); None: offline hints only.")
    preflight: bool = Field(
        True,
        description="Before launch, refuse a round the GPUs cannot place (Ray cluster or this machine) or whose rollout "
        "log dir the Ray workers cannot write where mentor reads it; false: launch without these checks.",
    )

    @field_validator("extra_args")
    @classmethod
    def _dynamic_filtering(cls, extra: dict[str, Any]) -> dict[str, Any]:
        # OpenRLHF 0.11.2 checks this range with a message about reward_clip_range, a key the user never set.
        rng = next((v for k, v in extra.items() if k.removeprefix("--") == "algo.dynamic_filtering_range"), None)
        if rng is not None:
            ok = isinstance(rng, (list, tuple)) and len(rng) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in rng)
            if not ok or not rng[0] < rng[1]:
                raise ValueError(f"algo.dynamic_filtering_range {rng!r}: give [low, high] with low < high (a group is "
                                 "kept when its mean score, in [0, 1], is strictly between them), e.g. [0, 1]")
        return extra

    @field_validator("live_hints")
    @classmethod
    def _live_scores_itself(cls, v: LiveHintsConfig | None, info: Any) -> LiveHintsConfig | None:
        if v is not None and info.data.get("reward_file") is not None:
            raise ValueError("live_hints scores with mentor's verifiers inside its agent executor, so a reward_file would not "
                             "be used: remove reward_file, or live_hints")
        extra = {k.removeprefix("--"): x for k, x in (info.data.get("extra_args") or {}).items()}
        if v is not None and extra.get("eval.dataset") and _temperatures(extra)[0] == _temperatures(extra)[1]:
            raise ValueError(f"live_hints tells OpenRLHF's evaluation passes (never hinted) from training rollouts by their "
                             f"sampling temperature, but extra_args gives both {_temperatures(extra)[0]}: set "
                             "eval.temperature to another value than rollout.temperature")
        return v

    @property
    def ckpt_path(self) -> Path:
        return self.train_path / "ckpt"

    @property
    def prompt_dataset(self) -> str:
        if self.prompts is None:
            return str(self.round_path / "prompts")
        parts = [str(Path(p).resolve()) if Path(p).exists() else p for p in self.prompts.split(",")]
        return ",".join(parts)


def _temperatures(extra: dict[str, Any]) -> tuple[float, float]:
    """(training, evaluation) sampling temperatures of the command: extra_args' or OpenRLHF 0.11.2's defaults."""
    return float(extra.get("rollout.temperature", 1.0)), float(extra.get("eval.temperature", 0.6))


def load_config(path: str | os.PathLike) -> TrainConfig:
    """Read `round.yaml`; errors name the file and the field."""
    return parse_config(read_yaml_mapping(Path(path), "round settings"), str(path))


def parse_config(data: dict[str, Any], where: str = "round config") -> TrainConfig:
    return parse_round_config(TrainConfig, data, where)


def actor_model(cfg: TrainConfig) -> str:
    """The model this round starts from: explicit, base (round 0), or the previous round's final model."""
    return cfg.start_model()


# Flags mentor sets itself; extra_args may not repeat them (say which field to use instead).
_OWNED = {
    "actor.model_name_or_path": "base_model / actor_model",
    "data.prompt_dataset": "prompts",
    "data.input_key": "(fixed: prompt)",
    "data.label_key": "(fixed: label)",
    "data.apply_chat_template": "(on for message prompts, off for text prompts: placement assistant)",
    "reward.remote_url": "reward_file",
    "train.agent_func_path": "live_hints (mentor's agent executor)",
    "algo.advantage.estimator": "advantage_estimator",
    "rollout.n_samples_per_prompt": "n_samples_per_prompt",
    "ckpt.path": "round_dir (fresh per round)",
    "ckpt.output_dir": "round_dir",
    "train.num_episodes": "(fixed: 1 per round)",
    "actor.num_nodes": "num_nodes",
    "actor.num_gpus_per_node": "actor_gpus_per_node",
    "ref.num_nodes": "num_nodes",
    "ref.num_gpus_per_node": "ref_gpus_per_node",
    "vllm.num_engines": "vllm_num_engines",
    "vllm.tensor_parallel_size": "vllm_tensor_parallel_size",
}


def _extra_argv(extra: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, value in extra.items():
        name = key[2:] if key.startswith("--") else key
        if name in _OWNED:
            raise ConfigError(f"extra_args: --{name} is set by mentor; use {_OWNED[name]} instead")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(f"--{name}")
        elif isinstance(value, (list, tuple)):
            argv += [f"--{name}", *map(str, value)]
        else:
            argv += [f"--{name}", str(value)]
    return argv


MAX_LEN, MAX_NEW = "data.max_len", "rollout.max_new_tokens"
OPENRLHF_MAX_LEN = 2048  # --data.max_len's default in OpenRLHF 0.11.2 (prompt + response)


def response_tokens(cfg: TrainConfig) -> tuple[int, str]:
    """``rollout.max_new_tokens``: extra_args' value, else mentor's default (OpenRLHF's own: max_len - prompt)."""
    extra = {k.removeprefix("--"): v for k, v in cfg.extra_args.items()}
    return response_limit(extra.get(MAX_NEW), MAX_NEW)


def prompt_limit(cfg: TrainConfig, dry_run: bool = False) -> tuple[list[str], LongestPrompt]:
    """The ``--rollout.max_new_tokens`` and ``--data.max_len`` flags the round needs (the response limit; room for the
    longest prompt plus its margin and a whole response), and the measured longest prompt. A ``data.max_len`` set
    too small for the longest prompt and the response limit is refused."""
    model = actor_model(cfg)
    extra = {k.removeprefix("--"): v for k, v in cfg.extra_args.items()}
    new, _ = response_tokens(cfg)
    flags = [f"--{MAX_NEW}", str(new)] if extra.get(MAX_NEW) is None else []
    try:
        files = resolve_inputs(cfg.prompt_dataset.split(","), suffixes=(".parquet",))
    except ConfigError as exc:
        if not dry_run:
            raise ConfigError(f"prompts {cfg.prompt_dataset}: {exc}; run `mentor build` first (or set prompts)") from None
        return flags, LongestPrompt(None, 0, model, "measured", f"the prompts are not there yet ({exc})")
    found = longest_prompt(files, model, cache=True)
    tokens = require(found, dry_run)
    if tokens is None:
        return flags, found
    if extra.get(MAX_LEN) is not None:
        given = int(extra[MAX_LEN])
        if tokens + new > given:
            raise ConfigError(
                f"the round's longest prompt is {tokens} tokens ({found.tokenizer}); with data.max_len={given}"
                f" and rollout.max_new_tokens={new} OpenRLHF keeps only the last "
                f"{given - new} tokens of a prompt: raise data.max_len to at least {tokens + new} (or leave "
                "it unset and mentor sets it), lower rollout.max_new_tokens, or make the hints shorter")
        return flags, found
    return flags + [f"--{MAX_LEN}", str(max(OPENRLHF_MAX_LEN, found.limit + new))], found


def round_command(cfg: TrainConfig, dry_run: bool = False) -> tuple[list[str], LongestPrompt]:
    """The round's command with its prompt limit, and the longest prompt it was set from."""
    limit, found = prompt_limit(cfg, dry_run)
    return build_command(cfg, limit), found


def openrlhf_data_flags(sources: list[str]) -> list[str]:
    """OpenRLHF's prompt-data flags for these shards: the chat template only for chat-message prompts (0.11.2's
    `PromptDataset` takes a text ``prompt`` verbatim without ``--data.apply_chat_template``; with it, it would wrap
    the text in a new user turn)."""
    flags = ["--data.input_key", "prompt", "--data.label_key", "label"]
    return flags if prompt_files_are_text(sources) else [*flags, "--data.apply_chat_template"]


def prompt_data_flags(cfg: TrainConfig) -> list[str]:
    """``--data.*`` flags for the round's shards: OpenRLHF's chat template for message prompts only; text prompts
    (placement assistant, rendered by `mentor build` with the policy's template) are read as they are."""
    sources = cfg.prompt_dataset.split(",")
    try:
        flags = openrlhf_data_flags(sources)
    except ConfigError:  # no shards yet (a dry run before `mentor build`): the layout of message prompts
        return ["--data.input_key", "prompt", "--data.label_key", "label", "--data.apply_chat_template"]
    check_template_kwargs("openrlhf", sources, None)  # chat prompts built with variables OpenRLHF cannot pass
    return flags


def reward_target(cfg: TrainConfig) -> tuple[Path, str]:
    """The file OpenRLHF loads by path and what it takes from it: the agent executor with live hints, else the reward."""
    if cfg.live_hints is not None:
        return LIVE_FILE, "AgentExecutor"
    return (Path(cfg.reward_file).resolve() if cfg.reward_file else REWARD_FILE), "reward_func"


def check_reward(cfg: TrainConfig, env: dict[str, str]) -> str:
    """The trainer's Python loads the reward file (or live hints' agent executor) as OpenRLHF does (by path)."""
    return check_reward_loads(cfg.python, *reward_target(cfg), env)


def build_command(cfg: TrainConfig, limit: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The exact trainer command line for this round (`limit`: the prompt-limit flags of `prompt_limit`)."""
    reward = str(reward_target(cfg)[0])
    cmd = [
        cfg.python, "-m", "openrlhf.cli.train_ppo_ray",
        "--actor.model_name_or_path", actor_model(cfg),
        "--data.prompt_dataset", cfg.prompt_dataset,
        *prompt_data_flags(cfg),
        *(["--train.agent_func_path", reward] if cfg.live_hints is not None else ["--reward.remote_url", reward]),
        "--algo.advantage.estimator", cfg.advantage_estimator,
        "--rollout.n_samples_per_prompt", str(cfg.n_samples_per_prompt),
        "--ckpt.path", str(cfg.ckpt_path),
        "--ckpt.output_dir", str(cfg.output_dir),
        "--train.num_episodes", "1",
        "--actor.num_nodes", str(cfg.num_nodes),
        "--actor.num_gpus_per_node", str(cfg.actor_gpus_per_node),
        "--ref.num_nodes", str(cfg.num_nodes),
        "--ref.num_gpus_per_node", str(cfg.ref_gpus_per_node),
        "--vllm.num_engines", str(cfg.vllm_num_engines),
        "--vllm.tensor_parallel_size", str(cfg.vllm_tensor_parallel_size),
        *limit,
    ]
    return cmd + _extra_argv(cfg.extra_args)


def build_env(cfg: TrainConfig) -> dict[str, str]:
    """The variables mentor adds to the trainer's environment.

    ``MENTOR_ROLLOUT_DIR`` and ``MENTOR_ROUND`` for the launcher's process, and the same
    (with every other ``MENTOR_*`` setting) in ``RAY_JOB_CONFIG_JSON_ENV_VAR``: Ray merges
    that job config into the runtime env of OpenRLHF's own ``ray.init()``, so the vLLM
    engines' actors, which run the reward function, get them on every node, on a fresh
    local cluster and on one started by ``ray start`` alike.
    """
    env = {ENV_DIR: str(cfg.rollout_dir.resolve()), ENV_ROUND: str(cfg.round), ENV_RUN: run_identity(cfg.train_path)}
    if cfg.live_hints is not None:  # what the live hook (mentor.training.openrlhf.live) reads in every engine actor
        env.update({ENV_TRAINER: LAUNCHER.kind, "MENTOR_LIVE_HINTS": cfg.live_hints.model_dump_json(), "MENTOR_LIVE_PROMPTS": cfg.prompt_dataset,
                    "MENTOR_LIVE_GROUP_SIZE": str(cfg.n_samples_per_prompt),
                    "MENTOR_LIVE_TEMPERATURE": str(_temperatures({k.removeprefix("--"): v for k, v in cfg.extra_args.items()})[0])})
    env.update(cfg.env)
    current = env.get(RAY_JOB_CONFIG_ENV, os.environ.get(RAY_JOB_CONFIG_ENV))
    env.update(ray_job_config_env(reward_env_vars(os.environ, env), current))
    return env


# --------------------------------------------------------------------------- running


def dry_run_text(cfg: TrainConfig, args: Any = None, planned: tuple[list[str], LongestPrompt] | None = None) -> str:
    """The environment, the command, the longest prompt, the reward check and (with `args`, what OpenRLHF parsed)
    the GPUs the round needs. `planned`: `round_command(cfg, dry_run=True)` when already made."""
    cmd, found = planned or round_command(cfg, dry_run=True)
    env = build_env(cfg)
    lines = ["# environment"] + [f"export {k}={shlex.quote(v)}" for k, v in env.items()] + ["# command", shlex.join(cmd)]
    live = live_text(cfg.live_hints, f"agent executor stages/hint/{LIVE_FILE.name} ({LAUNCHER.live}), ", " and vLLM engine")
    lines += [f"# longest prompt: {found.describe()}", f"# response limit: {response_tokens(cfg)[1]}",
              f"# checked: {check_reward(cfg, dict(os.environ) | env)}", f"# live hints: {live}"]
    if args is not None:
        demand = round_demand(cmd, args)
        lines.append(f"# GPUs: this round needs {demand.describe()} (not checked against a cluster in a dry run)")
        lines += [f"#   or with {name}: {gpus:g}" for name, gpus in demand.fixes]
    return "\n".join(lines)


def preflight(cfg: TrainConfig, cmd: list[str], extra_env: dict[str, str]) -> dict[str, Any]:
    """Refuse a round that cannot run as configured, before anything starts.

    - GPUs: what OpenRLHF's placement code reserves for `cmd` against the Ray cluster the
      trainer will join (RAY_ADDRESS or a `ray start` cluster on this machine), else this
      machine's devices (`GpuShortage`).
    - Rollout log: every node of that cluster writes a probe into the rollout dir through the
      trainer's own runtime env and this machine reads it back; on a fresh local cluster the
      folder must be writable here (`RolloutDirUnreachable`).
    - The probe runs with the round's ``python`` (a Ray or Python version the cluster refuses is
      refused here, both versions named), and every node loads the reward file by its path.

    Without openrlhf in mentor's environment the GPU count is skipped (a warning).
    Returns what was checked (kept in outcome.json).
    """
    try:
        demand = round_demand(cmd)
    except ConfigError as exc:
        if "not installed" not in str(exc):
            raise
        log.warning("%s: the round's GPUs are not checked before launch", exc)
        demand = None
    env = dict(os.environ) | extra_env
    path, attribute = reward_target(cfg)
    reward = str(path)
    # The trainer's own Python joins (Ray refuses another Ray or Python version), and every node loads the reward file.
    cluster = probe_cluster(env, init=RAY_INIT, python=cfg.python, reward=(reward, attribute))
    supply = cluster_supply(cluster) if cluster else local_gpus()
    if demand is not None:
        demand.check(supply)
    hosts = check_rollout_reach(cluster, cfg.rollout_dir)
    check_reward_reach(cluster, reward)
    return {
        "gpus_needed": demand.total if demand else None,
        "gpus_detail": demand.describe() if demand else None,
        "gpus_there": supply.total,
        "gpus_where": supply.where,
        "ray_cluster": cluster.get("address") if cluster else None,
        "rollout_dir_checked_on": hosts,
    }


def run_round(cfg: TrainConfig) -> dict[str, Any]:
    """Run the trainer for one round; record the outcome; raise TrainError on failure."""
    cmd, found = round_command(cfg)
    extra_env = build_env(cfg)
    check_reward(cfg, dict(os.environ) | extra_env)
    checked = preflight(cfg, cmd, extra_env) if cfg.preflight else None
    cfg.train_path.mkdir(parents=True, exist_ok=True)
    cfg.rollout_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cfg.model_dump(mode="json"), cfg.train_path / "config.json")
    env = dict(os.environ) | extra_env
    started = time.time()
    log.info("training round %d: %s", cfg.round, shlex.join(cmd))
    try:
        with open(cfg.log_file, "ab") as fh:
            fh.write(f"\n# mentor train round {cfg.round} at {_dt.datetime.now().isoformat()}\n# {shlex.join(cmd)}\n".encode())
            fh.flush()
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
        code = proc.returncode
    except OSError as exc:
        code = 127
        with open(cfg.log_file, "a") as fh:
            fh.write(f"cannot start {cmd[0]}: {exc}\n")
    final = cfg.output_dir if code == 0 and cfg.output_dir.exists() else None
    outcome = outcome_record(cfg, code, final, cmd[cmd.index("--actor.model_name_or_path") + 1], cmd, extra_env, started,
                             preflight=checked, longest_prompt=found.tokens, rollout_run=run_identity(cfg.train_path),
                             rollout_glob=run_glob(cfg.rollout_dir, run_identity(cfg.train_path)))
    if code == 0 and final is None:
        outcome["warning"] = f"the trainer exited 0 but {cfg.output_dir} does not exist"
    return finish_round(cfg, outcome, f"the trainer exited with code {code}" if code != 0 else None)


# How messages name it, and where its round config sets the response limit (read without importing this
# module: mine's advice, `launcher.response_limit_settings`).
TITLE = "OpenRLHF 0.11.2"
RESPONSE_LIMIT_KEY = "rollout.max_new_tokens"


class OpenRLHFLauncher(LauncherBase):
    """OpenRLHF 0.11 as a `mentor.training.launcher.Launcher`: text prompts read as they are (`openrlhf_data_flags`),
    no setting for chat-template variables, its reward file loaded by path."""

    kind: ClassVar[str] = "openrlhf"
    title: ClassVar[str] = TITLE
    Config: ClassVar[type[TrainConfig]] = TrainConfig
    summary: ClassVar[tuple[str, ...]] = ("exit_code", "final_model", "log_file", "duration_s")
    reward: ClassVar[tuple[str, str, str]] = (str(REWARD_FILE), "reward_func", "file")
    live: ClassVar[str] = "mentor.training.openrlhf.live"  # its live hook: OpenRLHF takes AgentExecutor from LIVE_FILE
    response_limit_key: ClassVar[str] = RESPONSE_LIMIT_KEY
    # --no-deps: its pins (CUDA torch, deepspeed, flash-attn, ray, vllm) are for GPU trainers; the light
    # dependencies its dataset/agent modules import come with mentor's `openrlhf-light` extra.
    setup_pins: ClassVar[tuple[str, ...]] = ("openrlhf==0.11.2",)
    round_yaml_default: ClassVar[bool] = True  # a round.yaml without kind (they predate the other trainers)

    def parse(self, data: dict[str, Any], where: str = "round config", strict: bool = True) -> TrainConfig:
        return parse_config(data, where)

    def command(self, cfg: TrainConfig) -> list[str]:
        return round_command(cfg, dry_run=True)[0]

    def env(self, cfg: TrainConfig) -> dict[str, str]:
        return build_env(cfg)

    def check(self, cfg: TrainConfig) -> str:
        """OpenRLHF's own launch code on the command (when openrlhf is installed here), the prompts, the reward
        load; the dry run's text. The GPUs are counted, not checked against a cluster (`run_round` does that)."""
        cmd, found = round_command(cfg, dry_run=True)
        try:
            args, notes = check_with_openrlhf(cmd)
        except ConfigError as exc:
            if "not installed" not in str(exc):
                raise
            args, notes = None, [f"{exc}; the command and its GPUs were not checked"]
        text = dry_run_text(cfg, args, (cmd, found))
        return "\n".join([*(f"# openrlhf: {n}" for n in notes), text])

    run_round = staticmethod(run_round)


LAUNCHER = OpenRLHFLauncher()

__all__ = [
    "LAUNCHER",
    "LIVE_FILE",
    "REWARD_FILE",
    "TrainConfig",
    "actor_model",
    "build_command",
    "build_env",
    "check_reward",
    "dry_run_text",
    "load_config",
    "openrlhf_data_flags",
    "parse_config",
    "preflight",
    "prompt_limit",
    "reward_target",
    "round_command",
    "run_round",
]
