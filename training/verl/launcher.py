"""`mentor train` for ``kind: verl``: one verl GRPO round from a `round.yaml` (verl 0.9.1).

The command is verl's own entry point with Hydra overrides built from the round::

    python -m verl.trainer.main_ppo
      algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4
      data.train_files=[<every part-*.parquet of the round's prompts>] data.val_files=[<the first one>]
      actor_rollout_ref.model.path=<previous round's final model | base model in round 0>
      reward.custom_reward_function.path=<mentor's verl/reward.py> reward.custom_reward_function.name=compute_score
      trainer.n_gpus_per_node=N trainer.nnodes=M trainer.default_local_dir=<train>/ckpt
      data.max_prompt_length=<the round's longest prompt, in the policy's tokens, plus a margin>
      data.max_response_length=<the round's own, else 4096> data.train_batch_size=<every prompt trains>
      <mentor's defaults, then the config's `overrides` (any verl key, dotted)>

The reward workers' variables (``MENTOR_ROLLOUT_DIR``, ``MENTOR_ROUND``, every
``MENTOR_*``) travel in one place only: the job config in
``RAY_JOB_CONFIG_JSON_ENV_VAR``, which Ray merges into the runtime env of verl's
own ``ray.init`` (verl's defaults plus ``ray_kwargs.ray_init.runtime_env``), so
they reach every Ray worker that scores rollouts (the TaskRunner, the
reward-loop workers) on a fresh local cluster and on one started by ``ray
start`` alike, and the pre-launch probe of `mentor.training.ray_preflight`
checks them on every node. Ray refuses to merge two runtime envs that set the
same variable ("Failed to merge the Job's runtime env"), so the same keys never
also go under ``ray_kwargs``; before launch `check_ray_init` runs verl's
``get_ppo_ray_runtime_env`` and Ray's own merge on the round's environment.

Prompts are never cut: verl drops or left-truncates prompts longer than
``data.max_prompt_length`` (512 by default). The launcher measures the round's
longest prompt with the policy's tokenizer, rendered with the round's
``data.apply_chat_template_kwargs`` as verl renders it (`mentor.training.prompt_limits`),
and sets the limit to it plus a margin, or refuses a round whose own limit is smaller.
Responses: ``data.max_response_length`` is the overrides' value or mentor's 4096, never
verl's 512; the reward file counts a response against it (``truncated`` in the log).

Every prompt trains: verl's dataloader drops the last incomplete batch (``drop_last=True``),
so mentor sizes ``data.train_batch_size`` (when the overrides leave it unset) and repeats a
few rows to make whole batches; a round with fewer prompts than the batch it sets is refused
(`mentor.training.verl.batches`).

Checks before launch (and all of ``--dry-run``): the overrides are composed with
verl's packaged ``ppo_trainer`` config by Hydra, as ``main_ppo``'s own
``@hydra.main`` does, the round's values are read back from the composed config
(a path Hydra would parse differently is an error), then verl's own
``validate_config`` runs (batch sizes against GPUs, micro batch settings, ...).
No GPU is needed for that. The GPUs the composed config reserves (verl's
resource pools: ``n_gpus_per_node`` on each of ``nnodes`` nodes, plus a reward
model pool when enabled) are compared with the Ray cluster or this machine.
Hydra's override syntax, the compose and the GPU count are in `verl.hydra`.

After training: verl saves checkpoints under ``<train>/ckpt/global_step_N/actor``
(FSDP shards). mentor runs verl's own model merger on the last one
(``python -m verl.model_merger merge --backend fsdp --local_dir ... --target_dir
...``) into a temporary folder renamed to ``<train>/model``: a Hugging Face
folder the next round (``actor_rollout_ref.model.path``), `mentor rollout` and
vLLM load. A killed round resumes: verl's ``trainer.resume_mode=auto`` restarts
from the last checkpoint, and the rollouts the killed attempt logged after that
checkpoint are dropped from the log (they are scored again); with no checkpoint
yet, the attempt's log shards are removed. Only this run's shards: they carry its
identity (``MENTOR_RUN_ID``, `mentor.training.rollout_log.run_identity` of the round's
train folder), so another run sharing ``rollout_log_dir`` keeps its log. Checkpoints, the merge and the log
on resume are in `verl.checkpoints`; the round config and its overrides in `verl.config`, verl's and Ray's
verdicts before launch in `verl.check`, the workflow section (a user's own command too) in `verl.section`.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import logging
import os
import shlex
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import write_json_atomic
from mentor.training.launcher import LauncherBase, finish_round, outcome_record
from mentor.pipeline.log_rows import LogFormat
from mentor.training.prompt_format import check_readable, check_template_kwargs, json_mapping, trainer_template_kwargs
from mentor.training.prompt_limits import LongestPrompt, longest_prompt, refuse, require, response_limit
from mentor.training.reward_check import check_reward_loads
from mentor.training.rollout_log import (
    ENV_DIR,
    ENV_POLICY_TOKENIZER,
    ENV_RESPONSE_LIMIT,
    ENV_RUN,
    RAY_JOB_CONFIG_ENV,
    ray_job_config_env,
    run_glob,
    run_identity,
)
from mentor.training.verl.batches import BatchPlan, count_rows, pad_path, plan_batches, write_pad
from mentor.training.verl.checkpoints import LATEST, last_checkpoint, merge_backend, merge_checkpoint, merge_command, prepare_logs
from mentor.training.verl.logs import DUMPS
from mentor.training.verl.config import DEFAULTS, VerlTrainConfig, load_config, parse_config, user_overrides
from mentor.training.verl.check import check_ray_init, check_with_verl, preflight
from mentor.training.verl.section import TEXT_WHY, VerlTrainer, run_command
from mentor.training.verl.hydra import (
    gpu_demand,
    hydra_unquote,
    hydra_value,
    verl_config_dir,
)

log = logging.getLogger(__name__)

MAIN = "verl.trainer.main_ppo"
REWARD_FILE = Path(__file__).resolve().parent / "reward.py"
ENV_ROUND = "MENTOR_ROUND"

def verl_version() -> str:
    try:
        return importlib.metadata.version("verl")
    except Exception:
        return "(not installed)"


# --------------------------------------------------------------------------- the command


def train_files(cfg: VerlTrainConfig) -> list[str]:
    """Every ``part-*.parquet`` of the round's prompt folders (files and globs as given), absolute."""
    out: list[str] = []
    for src in cfg.prompt_sources:
        p = Path(src)
        if not p.exists() and not any(ch in src for ch in "*?["):
            raise ConfigError(f"prompts {src}: no such folder; run `mentor build --out {src}` first (or set prompts)")
        if p.is_dir():
            shards = sorted(p.glob("part-*.parquet"))
            if not shards:
                raise ConfigError(f"prompts {src}: no part-*.parquet shards; run `mentor build --out {src}` first")
            out += [str(f.resolve()) for f in shards]
        else:
            out += [str(f.resolve()) for f in resolve_inputs([src])]
    files = list(dict.fromkeys(out))
    check_readable("verl", files)  # text prompts (placement assistant): verl renders every prompt from messages
    check_template_kwargs("verl", files, template_kwargs(cfg) or None)
    return files


def reward_env(cfg: VerlTrainConfig) -> dict[str, str]:
    """What the reward function reads: the round's log dir and number, and every MENTOR_* setting."""
    env = {k: str(v) for k, v in os.environ.items() if k.startswith("MENTOR_")}
    env |= {k: str(v) for k, v in cfg.env.items() if k.startswith("MENTOR_")}
    return env | {ENV_DIR: str(cfg.rollout_dir), ENV_ROUND: str(cfg.round), ENV_RUN: run_identity(cfg.train_path),
                  ENV_RESPONSE_LIMIT: str(response_length(cfg)[0]), ENV_POLICY_TOKENIZER: cfg.start_model()}


PROMPT_LIMIT = "data.max_prompt_length"
RESPONSE_LIMIT = "data.max_response_length"


def _override(cfg: VerlTrainConfig, key: str) -> Any:
    return next((v for k, v in cfg.overrides.items() if k.lstrip("+~") == key), None)


def template_kwargs(cfg: VerlTrainConfig) -> dict[str, Any]:
    """``data.apply_chat_template_kwargs`` as the overrides set it (whole, or key by key), what verl renders with."""
    return trainer_template_kwargs("verl", {"overrides": cfg.overrides}) or {}


def response_length(cfg: VerlTrainConfig) -> tuple[int, str]:
    """``data.max_response_length`` (verl's rollout.response_length follows it): the overrides', else mentor's default."""
    return response_limit(_override(cfg, RESPONSE_LIMIT), RESPONSE_LIMIT)


def prompt_limit(cfg: VerlTrainConfig, dry_run: bool = False) -> tuple[int | None, LongestPrompt]:
    """``data.max_prompt_length`` for the round: the longest prompt in the policy's tokens, rendered with the round's
    ``data.apply_chat_template_kwargs``, plus the margin (`prompt_room`), unless `overrides` set it (then it must hold
    that prompt). (None, ...) when the overrides set it or, in a dry run, it was not measured."""
    found = longest_prompt(train_files(cfg), cfg.start_model(), cache=True, template_kwargs=template_kwargs(cfg))
    require(found, dry_run)
    given = _override(cfg, PROMPT_LIMIT)
    if given is None:
        return found.limit, found
    if found.tokens is not None and int(given) < found.tokens:
        refuse(PROMPT_LIMIT, int(given), found, "verl's dataset drops or its agent loop left-truncates longer prompts")
    return None, found


def batch_plan(cfg: VerlTrainConfig) -> BatchPlan:
    """How verl's dataloader batches the round (`mentor.training.verl.batches`); refuses a round smaller than its batch."""
    return plan_batches(count_rows(train_files(cfg)), cfg.overrides, cfg.n_gpus_per_node * cfg.nnodes)


def data_files(cfg: VerlTrainConfig, plan: BatchPlan | None) -> list[str]:
    """``data.train_files``: the round's shards, and the repeated rows that make whole batches."""
    return train_files(cfg) + ([str(pad_path(cfg.train_path))] if plan is not None and plan.pad else [])


def build_overrides(cfg: VerlTrainConfig, max_prompt_length: int | None = None, plan: BatchPlan | None = None) -> list[str]:
    """The Hydra overrides of the round; `max_prompt_length` (from `prompt_limit`) sets ``data.max_prompt_length``,
    `plan` (from `batch_plan`) the batch and the repeated rows."""
    files = train_files(cfg)
    reward = str(Path(cfg.reward_file).resolve()) if cfg.reward_file else str(REWARD_FILE)
    owned = [
        f"algorithm.adv_estimator={hydra_value(cfg.adv_estimator)}",
        f"actor_rollout_ref.rollout.n={cfg.n_samples_per_prompt}",
        f"data.train_files={hydra_value(data_files(cfg, plan), quote=True)}",
        f"data.val_files={hydra_value(files[:1], quote=True)}",
        f"actor_rollout_ref.model.path={hydra_value(cfg.start_model(), quote=True)}",
        f"reward.custom_reward_function.path={hydra_value(reward, quote=True)}",
        f"reward.custom_reward_function.name={hydra_value(cfg.reward_function, quote=True)}",
        f"trainer.n_gpus_per_node={cfg.n_gpus_per_node}",
        f"trainer.nnodes={cfg.nnodes}",
        f"trainer.default_local_dir={hydra_value(str(cfg.ckpt_path), quote=True)}",
    ]
    user = {k.lstrip("+~"): k for k in cfg.overrides}
    per_round = {"trainer.experiment_name": f"round-{cfg.round:03d}",
                 "hydra.run.dir": str(cfg.train_path / "hydra")}  # Hydra's outputs/ (and verl's cwd) in the round's folder
    defaults = [f"{k}={hydra_value(v, quote=k == 'hydra.run.dir')}" for k, v in (DEFAULTS | per_round).items() if k not in user]
    limit = [f"{PROMPT_LIMIT}={max_prompt_length}"] if max_prompt_length is not None and PROMPT_LIMIT not in user else []
    limit += [f"{RESPONSE_LIMIT}={response_length(cfg)[0]}"] if RESPONSE_LIMIT not in user else []
    batches = plan.overrides() if plan is not None else []
    return owned + limit + batches + defaults + user_overrides(cfg.overrides)


def build_command(cfg: VerlTrainConfig, max_prompt_length: int | None = None, plan: BatchPlan | None = None) -> list[str]:
    """The exact trainer command line for this round."""
    return [cfg.python, "-m", MAIN, *build_overrides(cfg, max_prompt_length, plan)]


def check_reward(cfg: VerlTrainConfig, env: dict[str, str]) -> str:
    """The trainer's Python loads the reward function as verl's ``get_custom_reward_fn`` does (by path)."""
    reward = Path(cfg.reward_file).resolve() if cfg.reward_file else REWARD_FILE
    return check_reward_loads(cfg.python, reward, cfg.reward_function, env)


def build_env(cfg: VerlTrainConfig) -> dict[str, str]:
    """The variables mentor adds to the trainer's environment: the driver's, and through Ray's job config
    (``RAY_JOB_CONFIG_JSON_ENV_VAR``, kept and extended when already set) every Ray worker's."""
    env = reward_env(cfg)
    return env | ray_job_config_env(env, cfg.env.get(RAY_JOB_CONFIG_ENV, os.environ.get(RAY_JOB_CONFIG_ENV))) | \
        {k: v for k, v in cfg.env.items() if k != RAY_JOB_CONFIG_ENV}


# --------------------------------------------------------------------------- checks before launch


def _expected(cfg: VerlTrainConfig, cmd: list[str], plan: BatchPlan | None = None) -> dict[str, Any]:
    def value(key: str) -> str:
        return next(a.split("=", 1)[1] for a in cmd if a.startswith(key + "="))

    reward = str(Path(cfg.reward_file).resolve()) if cfg.reward_file else str(REWARD_FILE)
    batch = {plan.key: plan.batch} if plan is not None else {}
    return batch | {
        "data.train_files": data_files(cfg, plan),
        "actor_rollout_ref.model.path": hydra_unquote(value("actor_rollout_ref.model.path")),
        "actor_rollout_ref.rollout.n": cfg.n_samples_per_prompt,
        "algorithm.adv_estimator": cfg.adv_estimator,
        "reward.custom_reward_function.path": reward,
        "reward.custom_reward_function.name": cfg.reward_function,
        "trainer.n_gpus_per_node": cfg.n_gpus_per_node,
        "trainer.nnodes": cfg.nnodes,
        "trainer.default_local_dir": str(cfg.ckpt_path),
    }


def _checked(cfg: VerlTrainConfig, cmd: list[str], plan: BatchPlan | None = None) -> tuple[Any, list[str]]:
    """`check_with_verl` on the round's overrides, or (None, a note) when verl is not installed in mentor's environment."""
    try:
        return check_with_verl(cmd[3:], _expected(cfg, cmd, plan))
    except ConfigError as exc:
        if "not installed" not in str(exc):
            raise
        return None, [f"{exc}; the command was not checked"]


def dry_run_text(cfg: VerlTrainConfig) -> str:
    """The command, its environment, verl's verdict, the GPUs it needs, and the merge step."""
    limit, found = prompt_limit(cfg, dry_run=True)
    plan = batch_plan(cfg)
    cmd = build_command(cfg, limit, plan)
    composed, notes = _checked(cfg, cmd, plan)
    env = dict(os.environ) | build_env(cfg)
    ray_note = check_ray_init(composed, env) if composed is not None else None
    lines = [f"# verl {verl_version()} GRPO round {cfg.round}"]
    if composed is not None:
        demand = gpu_demand(composed)
        lines += [f"# GPUs: {demand.describe()}",
                  f"# checked: Hydra compose of {verl_config_dir() / 'ppo_trainer.yaml'} with these overrides, then verl's validate_config"]
    lines += [f"# verl: {n}" for n in notes]
    lines += [f"# longest prompt: {found.describe()}" + (f"; {PROMPT_LIMIT}={limit} (with the margin)" if limit is not None else ""),
              f"# response limit: {response_length(cfg)[1]}",
              f"# batches: {plan.describe()}",
              f"# checked: {check_reward(cfg, env)}", "# " + (ray_note or "checked: Ray merges the job's runtime env with verl's ray.init runtime env")]
    lines += ["# environment", *(f"export {k}={shlex.quote(v)}" for k, v in build_env(cfg).items()),
              "# command", shlex.join(cmd),
              "# then, on the last checkpoint (<ckpt>/global_step_N/actor)",
              shlex.join(merge_command(cfg, cfg.ckpt_path / "global_step_N" / "actor", cfg.output_dir, merge_backend(composed)))
              if cfg.merge_model else "# (merge_model: false: no model merge)"]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the round


def run_round(cfg: VerlTrainConfig) -> dict[str, Any]:
    """Run one verl round and merge its model; record the outcome; raise TrainError on failure."""
    limit, found = prompt_limit(cfg)
    plan = batch_plan(cfg)
    cmd = build_command(cfg, limit, plan)
    composed, notes = _checked(cfg, cmd, plan)
    notes += [f"longest prompt: {found.describe()}", f"response limit: {response_length(cfg)[1]}", f"batches: {plan.describe()}"]
    if cfg.merge_model and composed is not None and int(composed.trainer.save_freq) <= 0:
        raise ConfigError("trainer.save_freq must be > 0: verl saves the last step only then, and the round's model is "
                          "merged from it (or set merge_model: false)")
    extra_env = build_env(cfg)
    if composed is not None:
        notes += [n for n in [check_ray_init(composed, dict(os.environ) | extra_env)] if n]
    notes.append(check_reward(cfg, dict(os.environ) | extra_env))
    reward = str(Path(cfg.reward_file).resolve()) if cfg.reward_file else str(REWARD_FILE)
    checked = preflight(cfg, composed, extra_env, reward) if cfg.preflight else None
    cfg.train_path.mkdir(parents=True, exist_ok=True)
    cfg.rollout_dir.mkdir(parents=True, exist_ok=True)
    write_pad(train_files(cfg), plan, pad_path(cfg.train_path))
    resume = last_checkpoint(cfg.ckpt_path)
    cleaned = prepare_logs(cfg.rollout_dir, resume, run_identity(cfg.train_path))
    write_json_atomic(cfg.model_dump(mode="json"), cfg.train_path / "config.json")
    started = time.time()
    log.info("verl round %d: %s", cfg.round, shlex.join(cmd))
    merge_cmd = None
    with open(cfg.log_file, "ab") as fh:
        fh.write(f"\n# mentor train (verl) round {cfg.round} at {_dt.datetime.now().isoformat()}\n# {shlex.join(cmd)}\n".encode())
        for note in notes + ([cleaned] if cleaned else []):
            fh.write(f"# {note}\n".encode())
        fh.flush()
        try:
            code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ) | extra_env, check=False).returncode
        except OSError as exc:
            code = 127
            fh.write(f"cannot start {cmd[0]}: {exc}\n".encode())
        last = last_checkpoint(cfg.ckpt_path) if code == 0 else None
        final, merge_code = None, None
        if code == 0 and cfg.merge_model:
            if last is None:
                fh.write(f"# mentor: verl exited 0 but {cfg.ckpt_path} holds no checkpoint ({LATEST})\n".encode())
            else:
                merge_code, merge_cmd = merge_checkpoint(cfg, last[1], merge_backend(composed), fh)
                final = cfg.output_dir if merge_code == 0 else None
    model_path = next(hydra_unquote(a.split("=", 1)[1]) for a in cmd if a.startswith("actor_rollout_ref.model.path="))
    outcome = {"kind": "verl", "verl_version": verl_version()} | outcome_record(
        cfg, code, final, model_path, cmd, extra_env, started, checkpoint=str(last[1]) if last else None,
        steps=last[0] if last else None, merge_command=merge_cmd, merge_exit_code=merge_code, preflight=checked,
        longest_prompt=found.tokens, max_response_length=response_length(cfg)[0], prompts_used=plan.prompts, batch_size=plan.batch, repeated_rows=plan.pad,
        rollout_run=run_identity(cfg.train_path),
        rollout_glob=run_glob(cfg.rollout_dir, run_identity(cfg.train_path)),
    )
    if code == 0 and cfg.merge_model and final is None:
        outcome["warning"] = "verl finished but the round's model was not merged: see the log"
    failed = f"verl exited with code {code}" if code != 0 else "the model merge failed" if cfg.merge_model and final is None else None
    return finish_round(cfg, outcome, failed)


# How messages name it, and where its round config sets the response limit (read without importing this
# module: mine's advice, `launcher.response_limit_settings`).
TITLE = "verl 0.9.1"
RESPONSE_LIMIT_KEY = "data.max_response_length"


class VerlLauncher(LauncherBase):
    """verl's ``main_ppo`` and model merger as a `mentor.training.launcher.Launcher`; its workflow section also takes
    the user's own command (`mentor.training.verl.section`). verl reads chat messages only (`TEXT_WHY`) and takes
    template variables as ``data.apply_chat_template_kwargs``."""

    kind: ClassVar[str] = "verl"
    title: ClassVar[str] = TITLE
    Config: ClassVar[type[VerlTrainConfig]] = VerlTrainConfig
    summary: ClassVar[tuple[str, ...]] = ("exit_code", "final_model", "log_file", "checkpoint", "steps", "duration_s")
    reward: ClassVar[tuple[str, str, str]] = (str(REWARD_FILE), "compute_score", "file")
    text_prompts_refused: ClassVar[str] = TEXT_WHY
    template_kwargs_key: ClassVar[str] = "overrides.data.apply_chat_template_kwargs"
    section: ClassVar[type[BaseModel]] = VerlTrainer
    # verl pins transformers<5.11 and (in its extras) CUDA torch; its config, checkpoint and merger code run with
    # --no-deps beside the light packages of mentor's test extra. pyvers pins packaging<26: --no-deps too.
    # torchdata: the StatefulDataLoader of verl's trainer (its dataloader is exercised in tests/test_verl_batches.py).
    setup_pins: ClassVar[tuple[str, ...]] = ("verl==0.9.1", "tensordict==0.10.0", "pyvers==0.1.0", "torchdata==0.11.0")
    response_limit_key: ClassVar[str] = RESPONSE_LIMIT_KEY
    log_formats: ClassVar[tuple[LogFormat, ...]] = (DUMPS,)  # `mentor ingest --format verl`: verl's own rollout dumps

    def template_kwargs(self, config: Mapping[str, Any]) -> Any:
        """Whole, or key by key (``+data.apply_chat_template_kwargs.enable_thinking=false``)."""
        key = "data.apply_chat_template_kwargs"
        overrides = {str(k).lstrip("+~"): v for k, v in (config.get("overrides") or {}).items()}
        value = overrides.get(key)
        keys = {k[len(key) + 1:]: v for k, v in overrides.items() if k.startswith(key + ".")}
        if keys:
            if isinstance(value, str):
                value = json_mapping(self.template_kwargs_key, value)
            value = {**(value or {}), **keys}
        return value

    run_section = staticmethod(run_command)

    def parse(self, data: dict[str, Any], where: str = "round config", strict: bool = True) -> VerlTrainConfig:
        return parse_config({k: v for k, v in data.items() if k != "kind"} | {"kind": "verl"}, where)

    def command(self, cfg: VerlTrainConfig) -> list[str]:
        return build_command(cfg, prompt_limit(cfg, dry_run=True)[0], batch_plan(cfg))

    env = staticmethod(build_env)
    check = staticmethod(dry_run_text)  # the dry run's text: what the round would run, checked
    run_round = staticmethod(run_round)


LAUNCHER = VerlLauncher()

__all__ = [
    "LAUNCHER",
    "DEFAULTS",
    "VerlTrainConfig",
    "batch_plan",
    "build_command",
    "build_env",
    "build_overrides",
    "check_with_verl",
    "dry_run_text",
    "load_config",
    "parse_config",
    "run_round",
    "train_files",
]
