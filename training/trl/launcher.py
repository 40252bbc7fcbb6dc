"""`mentor train` for ``kind: trl``: one TRL GRPO round from a `round.yaml`.

The round runs in its own process (``python -m mentor.training.trl.train
<train>/trl_round.json``; with ``live_hints``, ``mentor.stages.hint.live trl``, the same process with the
rollout function of `mentor.training.trl.live`): the thread settings must be in place before torch is
imported, a vLLM engine the runner used for hints must not share the process,
and a killed trainer takes nothing else down. With ``num_processes`` > 1 (or an
``accelerate_config`` / ``accelerate_args``) ``accelerate launch`` starts that
many of them (torchrun, ``--multi_gpu`` unless a config file or flag picks the
launcher), its flags checked by accelerate's own parser first, and on GPUs
the processes are checked against this machine's GPUs before launch. Output goes to
``<train>/train.log``, the outcome to ``<train>/outcome.json`` (the same keys as
the OpenRLHF kind, plus ``kind``, ``trl_version``, ``prompts_used`` and the last
logged metrics), the final model to ``<train>/model`` (renamed into place once
saved), TRL's own checkpoints to ``<train>/ckpt``.

Settings: every key of the round config that is not one of `TrlTrainConfig`'s
own fields is a `trl.GRPOConfig` field, checked against the installed TRL's
dataclass (an unknown name is an error naming it) and then built by
``GRPOConfig(**fields)`` itself, so TRL's own checks run before anything starts.
mentor's defaults on top of TRL's: ``num_generations`` = the group size (4),
``num_train_epochs`` 1 (one pass over the round's prompts: TRL's sampler repeats and
shuffles them and drops none), ``max_completion_length`` 4096 (not TRL's 512: see
`mentor.training.prompt_limits`), ``report_to`` none,
``output_dir`` the round's ckpt folder; without a GPU also ``use_cpu``, and
``bf16`` and ``gradient_checkpointing`` off (TRL leaves bf16 on with use_cpu). ``lora`` (`trl.lora`): adapters
through peft instead of full fine-tuning.

Before launch (and in ``--dry-run``): the trainer's Python imports mentor's TRL
reward module (`mentor.training.reward_check`), and the round's longest prompt is
measured with the policy's tokenizer and the round's ``chat_template_kwargs``
(`mentor.training.prompt_limits`). TRL 1.16
cuts no prompt, so there is no prompt limit to set; a round whose longest prompt
plus ``max_completion_length`` does not fit the context (``vllm_max_model_length``
when set, else the model's ``max_position_embeddings``) is refused with the numbers.
Starting the processes (accelerate, GPUs, dying with mentor): `trl.processes`; the round's process: `trl.train`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import difflib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

import polars as pl
from pydantic import ConfigDict, Field, model_validator

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import read_json, scan_dataset, write_json_atomic
from mentor.pipeline.yaml_io import read_yaml_mapping
from mentor.training.field_types import check_dataclass_values
from mentor.training.live_hints import LIVE_ENTRY, LiveHintsConfig, live_text
from mentor.training.launcher import LauncherBase, RoundConfig, finish_round, outcome_record, parse_round_config
from mentor.training.prompt_format import check_template_kwargs, trainer_template_kwargs
from mentor.training.prompt_limits import RESPONSE_DEFAULT, LongestPrompt, model_context, rendered_lengths, require, response_limit
from mentor.training.reward_check import check_reward_loads
from mentor.training.rollout_log import ENV_DIR, ENV_RUN, run_glob, run_identity, run_shards
from mentor.training.trl.doctor import check_accelerate_config
from mentor.training.trl.lora import check_lora
from mentor.training.trl.processes import (INSTALL, accelerate_argv, check_gpus, check_with_accelerate, die_with_parent,
                                          gpu_demand, on_gpu, uses_accelerate)

log = logging.getLogger(__name__)

ROUND_FILE = "trl_round.json"
# GRPOConfig fields that mentor sets from the round layout; the config may not set them.
_OWNED = {"output_dir": "round_dir / train_dir (TRL's checkpoints go to <train>/ckpt)"}


class TrlTrainConfig(RoundConfig):
    """One TRL GRPO round. Keys other than these fields are `trl.GRPOConfig` fields."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["trl"] = Field("trl", description="Selects the TRL trainer in a round.yaml (workflows give it as trainer.kind).")
    num_generations: int = Field(4, ge=2, description="GRPO group size: completions per prompt (GRPOConfig.num_generations).")
    select: Literal["all", "hinted", "unhinted"] = Field(
        "all", description="Which prompt rows to train on: all, only the hinted ones (hint_id set), or only the unhinted ones."
    )
    limit: int | None = Field(None, ge=1, description="Train on the first N selected prompt rows (in shard order).")
    cpu_threads: int | None = Field(
        1, ge=1, description="torch/OpenMP threads when training on CPU (1 was fastest on a shared 2-core machine); none = torch's choice."
    )
    num_processes: int = Field(
        1, ge=1, description="Training processes (one per GPU; all machines together): more than 1 launches through "
        "`accelerate launch` (data parallel, or DeepSpeed/FSDP with accelerate_config)."
    )
    accelerate_config: str | None = Field(
        None, description="An `accelerate launch --config_file` YAML (DDP, DeepSpeed ZeRO, FSDP; e.g. TRL's "
        "examples/accelerate_configs/*.yaml); launches through accelerate even with 1 process."
    )
    accelerate_args: dict[str, Any] = Field(
        default_factory=dict, description="Other `accelerate launch` flags, e.g. {num_machines: 2, machine_rank: 0, "
        "main_process_ip: 10.0.0.1, use_deepspeed: true, deepspeed_config_file: ds.json}; checked by accelerate's own parser."
    )

    lora: dict[str, Any] | None = Field(
        None, description="Train LoRA adapters instead of the whole policy: peft.LoraConfig keyword arguments, e.g. {r: 16, "
        "lora_alpha: 32, target_modules: all-linear} ({} = peft's defaults), given to GRPOTrainer as peft_config; the "
        "final model is the start model with the adapters merged (mentor.training.trl.lora); none = full fine-tuning."
    )
    live_hints: LiveHintsConfig | None = Field(
        None, description="Hint and re-roll the groups that collapse inside each training step (mentor.training.trl.live); "
        "none = offline hints only (the default)."
    )

    @model_validator(mode="after")
    def _live_in_one_process(self) -> "TrlTrainConfig":
        if self.live_hints is not None and uses_accelerate(self):
            raise ValueError("live_hints needs every group of a step in one process: set num_processes 1 "
                             "(and no accelerate_config / accelerate_args)")
        return self

    @property
    def grpo_fields(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def parse_config(data: dict[str, Any], where: str = "round config", require_trl: bool = True) -> TrlTrainConfig:
    """Validate mentor's fields and the GRPOConfig field names; `ConfigError` names the field.

    ``require_trl=False`` (loading a workflow file): without trl installed only mentor's
    own fields are checked; the runner asks for trl before its first stage.
    """
    cfg = parse_round_config(TrlTrainConfig, data, where)
    if require_trl or trl_installed():
        check_grpo_fields(cfg.grpo_fields, where)
        check_lora(cfg.lora, where)
    return cfg


def trl_installed() -> bool:
    try:
        return importlib.util.find_spec("trl") is not None
    except (ImportError, ValueError):  # a None entry in sys.modules, a broken install
        return False


def load_config(path: str | os.PathLike) -> TrlTrainConfig:
    path = Path(path)
    return parse_config(read_yaml_mapping(path, "round settings"), str(path))


def grpo_config_class():
    try:
        from trl import GRPOConfig  # optional (the trl extra) and slow to import
    except ImportError as exc:
        raise ConfigError(f"trainer kind trl needs the trl package ({exc}); {INSTALL}") from None
    return GRPOConfig


def check_grpo_fields(fields: dict[str, Any], where: str = "round config") -> None:
    """Every key must be a field of the installed TRL's GRPOConfig (and not one mentor sets)."""
    if not fields:
        return
    known = {f.name for f in dataclasses.fields(grpo_config_class()) if f.init}
    for key in fields:
        if key in _OWNED:
            raise ConfigError(f"{where}: {key} is set by mentor; use {_OWNED[key]} instead")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known | set(TrlTrainConfig.model_fields)), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{where}: {key}: not a mentor trl setting nor a field of TRL {trl_version()}'s GRPOConfig{hint}")
    check_dataclass_values(grpo_config_class(), fields, where, f"TRL {trl_version()}'s GRPOConfig")


def trl_version() -> str:
    try:
        return importlib.metadata.version("trl")
    except Exception:
        return "(not installed)"


def grpo_kwargs(cfg: TrlTrainConfig) -> dict[str, Any]:
    """The GRPOConfig keyword arguments: mentor's defaults, then the config's own fields."""
    user = cfg.grpo_fields
    kw: dict[str, Any] = {
        "output_dir": str(cfg.train_path / "ckpt"),
        "num_generations": cfg.num_generations,
        "num_train_epochs": 1,
        "report_to": "none",
        "max_completion_length": RESPONSE_DEFAULT,  # never TRL's 512 (prompt_limits: the response limit)
    }
    cpu = bool(user.get("use_cpu", not on_gpu()))
    if cpu:
        # TRL's defaults (bf16 unset -> True, gradient checkpointing on) are GPU settings.
        kw |= {"use_cpu": True, "bf16": False, "gradient_checkpointing": False}
    return kw | user


# What transformers' TrainingArguments says when the interpreter checking the settings has no GPU for bf16/fp16.
_NO_LOCAL_GPU = ("doesn't support bf16/gpu", "doesn't support fp16", "requires a GPU")


def resolve_grpo(cfg: TrlTrainConfig):
    """`GRPOConfig(**grpo_kwargs(cfg))`; TRL's own checks become a `ConfigError`.

    A GPU round is checked in mentor's interpreter, whose torch may have no CUDA (a hint node's venv): there
    transformers refuses bf16/fp16 for want of a local GPU. That check belongs to the trainer's environment
    (which runs GRPOConfig again); here the other settings are checked with the precision flags off."""
    cls = grpo_config_class()
    kw = grpo_kwargs(cfg)
    try:
        return cls(**kw)
    except (TypeError, ValueError, AssertionError) as exc:
        if not kw.get("use_cpu") and any(m in str(exc) for m in _NO_LOCAL_GPU):
            try:
                return cls(**kw | {"bf16": False, "fp16": False})
            except (TypeError, ValueError, AssertionError) as again:
                exc = again
        raise ConfigError(f"TRL's GRPOConfig rejects the settings: {exc}") from None


def select_prompts(cfg: TrlTrainConfig) -> pl.DataFrame:
    """The round's prompt rows (``prompt``, ``label``) after `select` and `limit`."""
    files = resolve_inputs(cfg.prompt_sources)
    if not files:
        raise ConfigError(f"prompts {', '.join(cfg.prompt_sources)}: no Parquet shards; run `mentor build` first")

    lf = scan_dataset([str(f) for f in files], "prompts")
    if cfg.select == "hinted":
        lf = lf.filter(pl.col("hint_id").is_not_null())
    elif cfg.select == "unhinted":
        lf = lf.filter(pl.col("hint_id").is_null())
    if cfg.limit:
        lf = lf.head(cfg.limit)
    df = lf.select("prompt", "label").collect()
    if df.height == 0:
        raise DataError(f"prompts {', '.join(map(str, files))}: no rows left with select={cfg.select}; "
                        "choose select: all, or build with hints")
    return df


def training_rows(cfg: TrlTrainConfig, pad_rows: int = 0) -> list[dict[str, Any]]:
    """The rows the trainer trains on: the selected prompt rows, then the first `pad_rows` again (`prompt_batches`)."""
    rows = select_prompts(cfg).to_dicts()
    return rows + rows[:pad_rows]


def round_spec(cfg: TrlTrainConfig) -> dict[str, Any]:
    """What the trainer process needs (written to <train>/trl_round.json). Prompts built with other template
    variables than ``chat_template_kwargs`` are refused (`prompt_format.check_template_kwargs`)."""
    check_template_kwargs("trl", cfg.prompt_sources, trainer_template_kwargs("trl", cfg.grpo_fields))
    grpo = grpo_kwargs(cfg)
    return {
        "round": cfg.round,
        "model": cfg.start_model(),
        "prompts": [str(Path(p).resolve()) if Path(p).exists() else p for p in cfg.prompt_sources],
        "select": cfg.select,
        "limit": cfg.limit,
        "rollout_dir": str(cfg.rollout_dir),
        "final_model": str(cfg.output_dir),
        "cpu_threads": cfg.cpu_threads if grpo.get("use_cpu") else None,
        "grpo": grpo,
    }


REWARD_MODULE = "mentor.training.trl.reward"
ROUND_MODULE = "mentor.training.trl.train"  # the round's process
LIVE_MODULE = LIVE_ENTRY  # with live_hints: the live entry (stage code: started by name, not imported) runs `live`


def check_reward(cfg: TrlTrainConfig, env: dict[str, str]) -> str:
    """The trainer's Python imports mentor's TRL reward, as the round's process (`trl.train`) will."""
    return check_reward_loads(cfg.python, REWARD_MODULE, "make_reward", env, kind="module")


def check_prompt_room(cfg: TrlTrainConfig, spec: dict[str, Any], rows: pl.DataFrame, dry_run: bool = False) -> LongestPrompt:
    """The longest selected prompt in the policy's tokens, and a refusal when it and a completion overflow the context."""
    model = spec["model"]
    grpo = spec["grpo"]
    kwargs = grpo.get("chat_template_kwargs") or None  # TRL renders conversational prompts with them
    if isinstance(kwargs, str):  # GRPOConfig also takes them as a JSON string
        kwargs = json.loads(kwargs)
    try:
        from transformers import AutoTokenizer  # optional and slow to import

        tok = AutoTokenizer.from_pretrained(model)
    except Exception as exc:  # offline and not cached, no tokenizer files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        found = LongestPrompt(None, rows.height, model, "measured", f"cannot load the tokenizer of {model}: {first[:200]}",
                              kwargs)
    else:
        found = LongestPrompt(max(rendered_lengths(rows["prompt"].to_list(), tok, kwargs)), rows.height, model, "measured",
                              template_kwargs=kwargs)
    tokens = require(found, dry_run)
    completion = response_limit(grpo.get("max_completion_length"), "max_completion_length")[0]
    key, context = ("vllm_max_model_length", grpo.get("vllm_max_model_length")) if grpo.get("use_vllm") else (None, None)
    if context is None:
        key, context = "the model's max_position_embeddings", model_context(model)
    if tokens is not None and context and tokens + completion > int(context):
        raise ConfigError(f"the round's longest prompt is {tokens} tokens ({model}); with max_completion_length={completion} "
                          f"it needs {tokens + completion} tokens of context, over {key}={context}: lower "
                          "max_completion_length" + (", raise vllm_max_model_length" if grpo.get("use_vllm") else "")
                          + ", or make the hints shorter")
    return found


def prompt_batches(cfg: TrlTrainConfig, args: Any, prompts: int) -> tuple[int, int, str]:
    """(prompts per generation batch, rows to repeat, a line for the dry run). TRL 1.16's ``RepeatSampler`` takes the
    shuffled prompts in chunks of ``generation_batch_size // num_generations`` and drops an incomplete last chunk, so
    the round's first rows are repeated to whole chunks (`trl.train` adds them); fewer prompts than a chunk is refused."""
    if cfg.grpo_fields.get("generation_batch_size") is not None:
        per = int(args.generation_batch_size) // int(args.num_generations)
        how = f"generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}"
    else:  # TRL sizes it in the trainer's processes: per_device_train_batch_size x processes x steps_per_generation
        per = int(args.per_device_train_batch_size) * cfg.num_processes * int(args.steps_per_generation) // int(args.num_generations)
        how = (f"per_device_train_batch_size {args.per_device_train_batch_size} x {cfg.num_processes} process(es) x "
               f"steps_per_generation {args.steps_per_generation} / num_generations {args.num_generations}")
    per = max(1, per)
    if prompts < per:
        raise ConfigError(f"the round has {prompts} prompt row(s), fewer than one generation batch of {per} prompts ({how}): "
                          "TRL's sampler drops an incomplete batch, so it would train on none; lower "
                          "per_device_train_batch_size (or generation_batch_size), or give the round more prompts")
    pad = -prompts % per
    note = f"{prompts} prompts in generation batches of {per} ({how})"
    note += (f"; TRL's sampler drops an incomplete batch, so the round's first {pad} row(s) are repeated and every prompt "
             "trains" if pad else "; every prompt trains (whole batches)")
    return per, pad, note


def response_text(cfg: TrlTrainConfig) -> str:
    """The round's max_completion_length and where it came from (the config, or mentor's default)."""
    return response_limit(cfg.grpo_fields.get("max_completion_length"), "max_completion_length")[1]


def build_command(cfg: TrlTrainConfig, cpu_threads: int | None = None) -> list[str]:
    """The trainer command: one process, or `accelerate launch` starting `num_processes` of them."""
    trainer = [*(["-m", ROUND_MODULE] if cfg.live_hints is None else ["-m", LIVE_MODULE, "trl"]), str(cfg.train_path / ROUND_FILE)]
    if not uses_accelerate(cfg):
        return [cfg.python, *trainer]
    return [cfg.python, "-m", "accelerate.commands.launch", *accelerate_argv(cfg, cpu_threads), *trainer]


def build_env(cfg: TrlTrainConfig, spec: dict[str, Any]) -> dict[str, str]:
    env = {ENV_DIR: str(cfg.rollout_dir), ENV_RUN: run_identity(cfg.train_path)}
    if spec.get("cpu_threads"):
        n = str(spec["cpu_threads"])
        env |= {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
    return env | cfg.env


def dry_run_text(cfg: TrlTrainConfig) -> str:
    """The command, its environment, the prompts it would use and the resolved GRPOConfig."""
    spec = round_spec(cfg)
    args = resolve_grpo(cfg)
    try:
        selected = select_prompts(cfg)
        prompts = f"{selected.height} prompt row(s) from {', '.join(spec['prompts'])} (select {cfg.select}, limit {cfg.limit})"
        longest = check_prompt_room(cfg, spec, selected, dry_run=True).describe()
    except (ConfigError, DataError) as exc:
        if "longest prompt" in str(exc):
            raise
        prompts = longest = f"not readable yet: {exc}"
        selected = None
    batches = prompt_batches(cfg, args, selected.height)[2] if selected is not None else "(the prompts are not readable yet)"
    resolved = args.to_dict()
    cmd = build_command(cfg, spec["cpu_threads"])
    check_with_accelerate(cmd)
    demand = gpu_demand(cfg, spec)
    lines = [
        f"# TRL {trl_version()} GRPO round {cfg.round}",
        f"# processes: {cfg.num_processes} ({'accelerate launch' if uses_accelerate(cfg) else 'one plain process'}); "
        f"GPUs: {demand.describe() if demand else 'none (use_cpu)'}",
        f"# model: {spec['model']}",
        f"# prompts: {prompts}",
        f"# longest prompt: {longest}",
        f"# response limit: {response_text(cfg)}",
        f"# batches: {batches}",
        f"# checked: {check_reward(cfg, dict(os.environ) | build_env(cfg, spec))}",
        f"# final model: {spec['final_model']}",
        f"# live hints: {live_text(cfg.live_hints)}",
        f"# lora: {'none (full fine-tuning)' if cfg.lora is None else json.dumps(cfg.lora, sort_keys=True)}",
        "# environment",
        *(f"export {k}={shlex.quote(v)}" for k, v in build_env(cfg, spec).items()),
        "# command",
        shlex.join(cmd),
        "# GRPOConfig fields set by mentor or the config",
        json.dumps(spec["grpo"], indent=2, sort_keys=True, default=str),
        "# GRPOConfig as TRL resolved it (every field)",
        json.dumps(resolved, indent=2, sort_keys=True, default=str),
    ]
    return "\n".join(lines)


def _clear_stale_logs(directory: Path, run: str) -> int:
    """Shards a killed attempt of this round left (this run's identity only: another run sharing the folder
    keeps its log): the rerun logs its rollouts afresh."""
    stale = run_shards(directory, "trl", run)
    for f in stale:
        f.unlink()
    return len(stale)


def run_round(cfg: TrlTrainConfig) -> dict[str, Any]:
    """Run one TRL round; record the outcome; raise TrainError on failure."""
    args = resolve_grpo(cfg)  # TRL's own checks before anything starts
    spec = round_spec(cfg)
    selected = select_prompts(cfg)
    rows = selected.height
    spec["pad_rows"] = prompt_batches(cfg, args, rows)[1]
    found = check_prompt_room(cfg, spec, selected)
    check_reward(cfg, dict(os.environ) | build_env(cfg, spec))
    cmd = build_command(cfg, spec["cpu_threads"])
    check_with_accelerate(cmd)
    demand = gpu_demand(cfg, spec)
    if demand is not None:
        check_gpus(demand)
    cfg.train_path.mkdir(parents=True, exist_ok=True)
    cfg.rollout_dir.mkdir(parents=True, exist_ok=True)
    stale = _clear_stale_logs(cfg.rollout_dir, run_identity(cfg.train_path))
    write_json_atomic(cfg.model_dump(mode="json"), cfg.train_path / "config.json")
    write_json_atomic(spec, cfg.train_path / ROUND_FILE)
    extra_env = build_env(cfg, spec)
    started = time.time()
    log.info("TRL round %d: %d prompt row(s) x %d generations, model %s", cfg.round, rows, cfg.num_generations, spec["model"])
    with open(cfg.log_file, "ab") as fh:
        fh.write(f"\n# mentor train (trl) round {cfg.round} at {_dt.datetime.now().isoformat()}\n# {shlex.join(cmd)}\n".encode())
        if stale:
            fh.write(f"# removed {stale} rollout shard(s) of an earlier, unfinished attempt of this run "
                     f"({run_identity(cfg.train_path)})\n".encode())
        fh.flush()
        try:
            code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ) | extra_env, check=False,
                                  preexec_fn=die_with_parent if sys.platform.startswith("linux") else None).returncode
        except OSError as exc:
            code = 127
            fh.write(f"cannot start {cmd[0]}: {exc}\n".encode())
    final = cfg.output_dir if code == 0 and (cfg.output_dir / "config.json").is_file() else None
    metrics_file = cfg.train_path / "metrics.json"
    metrics = read_json(metrics_file) if code == 0 and metrics_file.is_file() else {}
    outcome = {"kind": "trl", "trl_version": trl_version()} | outcome_record(
        cfg, code, final, spec["model"], cmd, extra_env, started,
        prompts_used=rows, repeated_rows=spec["pad_rows"], steps=metrics.get("global_step"), metrics=metrics.get("last_log"),
        processes=metrics.get("processes", cfg.num_processes), longest_prompt=found.tokens,
        rollout_run=run_identity(cfg.train_path), rollout_glob=run_glob(cfg.rollout_dir, run_identity(cfg.train_path)),
    )
    if code == 0 and final is None:
        outcome["warning"] = f"the trainer exited 0 but {cfg.output_dir} holds no model"
    return finish_round(cfg, outcome, f"the TRL trainer exited with code {code}" if code != 0 or final is None else None)


# Its name in messages, where its round config sets the response limit (read unimported: response_limit_settings).
TITLE = "TRL"
RESPONSE_LIMIT_KEY = "max_completion_length"


class TrlLauncher(LauncherBase):
    """TRL's GRPOTrainer as a `mentor.training.launcher.Launcher`: a string prompt is a standard (non-conversational)
    prompt, tokenized as it is; ``chat_template_kwargs`` (a GRPOConfig field) are its template variables."""

    kind: ClassVar[str] = "trl"
    title: ClassVar[str] = TITLE
    Config: ClassVar[type[TrlTrainConfig]] = TrlTrainConfig
    summary: ClassVar[tuple[str, ...]] = ("exit_code", "final_model", "log_file", "prompts_used", "steps", "duration_s")
    reward: ClassVar[tuple[str, str, str]] = (REWARD_MODULE, "make_reward", "module")
    template_kwargs_key: ClassVar[str] = "chat_template_kwargs"
    live: ClassVar[str] = "mentor.training.trl.live"
    response_limit_key: ClassVar[str] = RESPONSE_LIMIT_KEY

    def parse(self, data: dict[str, Any], where: str = "round config", strict: bool = True) -> TrlTrainConfig:
        """`strict`: TRL must be installed here (its GRPOConfig checks the fields); otherwise only mentor's fields
        are checked when it is not (a workflow file loaded where trl is not installed)."""
        if strict:
            grpo_config_class()
        return parse_config({k: v for k, v in data.items() if k != "kind"} | {"kind": "trl"}, where, require_trl=strict)

    def command(self, cfg: TrlTrainConfig) -> list[str]:
        return build_command(cfg, round_spec(cfg)["cpu_threads"])

    def env(self, cfg: TrlTrainConfig) -> dict[str, str]:
        return build_env(cfg, round_spec(cfg))

    check = staticmethod(dry_run_text)  # the dry run's text: what the round would run, checked
    run_round = staticmethod(run_round)

    def node_checks(self) -> dict[str, Callable[[], tuple[str, str | None]]]:
        return {"accelerate config": check_accelerate_config}


LAUNCHER = TrlLauncher()

__all__ = [
    "LAUNCHER", "TrlTrainConfig", "build_command", "check_grpo_fields", "check_with_accelerate", "gpu_demand",
    "dry_run_text", "grpo_kwargs", "load_config", "parse_config", "resolve_grpo", "round_spec", "run_round",
    "prompt_batches", "select_prompts", "training_rows", "uses_accelerate"
]
