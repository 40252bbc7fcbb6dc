"""Workflow files: the schedule of rounds and every stage's settings, validated on load.

A workflow YAML names the run, the domain, the base problem set, how each
round's rollouts come to be (the trainer), and the settings of mine, hint and
build. Unknown keys are rejected; errors name the key and the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mentor.pipeline.errors import ConfigError, config_error
from mentor.pipeline.llm import BackendSettings
from mentor.pipeline.yaml_io import read_yaml_mapping
from mentor.stages.build import BuildConfig
from mentor.stages.build_render import TEXT_PLACEMENTS
from mentor.stages.hint.config import HintConfig
from mentor.stages.mine import MineConfig
from mentor.stages.train import (
    Trainer,
    check_section,
    section_kwargs_key,
    section_policy,
    section_template_kwargs,
)
from mentor.training.launcher import get_launcher
from mentor.training.prompt_format import text_prompts_refused

PACKAGED = Path(__file__).resolve().parent
# One folder name: no path separator, no "..", no leading dot, dash or space, none of the
# characters Windows refuses, no control characters; at most 100 characters.
_SAFE_NAME = re.compile(r"[^./\\\s\-:*?\"<>|\x00-\x1f][^/\\:*?\"<>|\x00-\x1f]{0,99}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InitialRollouts(_Strict):
    """Existing rollout logs used as round 0's rollouts instead of running the trainer in round 0."""

    source: list[str] = Field(description="Files, directories or globs; 'bundled:gsm8k' is the bundled real GSM8K rollouts.")
    format: str = Field("auto", description="An ingest --format.")
    map: dict[str, str] = Field(default_factory=dict, description="Column mapping for format jsonl.")


class HintSettings(_Strict):
    """The hint stage: backend + the agents' settings (stages/hint/config.py HintConfig)."""

    backend: BackendSettings = Field(default_factory=BackendSettings, description="The hint model.")
    sample: int | None = Field(None, ge=1, description="Hint only the first N collapsed problems (by problem_id); none = all.")
    worker_resources: dict[str, float] | None = Field(
        None, description="dask worker resources each hint shard needs on a cluster, e.g. {GPU: 1} (workers started with --resources GPU=1)."
    )
    config: dict[str, Any] = Field(default_factory=dict, description="HintConfig fields (max_retry, max_refine, per-domain overrides, ...).")


class Workflow(_Strict):
    """A round-by-round mentor run."""

    name: str = Field(description="Run name: the run directory is runs/<name> unless --run-dir is given.")
    domain: Literal["math", "code"] = Field("math", description="Domain of the problems.")
    base: str = Field(description="Base problem set (bundled name, file, or hf:NAME[:CONFIG]:SPLIT).")
    base_map: dict[str, str] = Field(default_factory=dict, description="Base-set column mapping canonical=column.")
    rounds: int = Field(1, ge=1, le=10_000, description="Number of rounds.")
    initial_rollouts: InitialRollouts | None = Field(None, description="Logs that stand in for round 0's training.")
    trainer: Trainer = Field(description="How each round's rollouts are produced.")
    mine: MineConfig = Field(default_factory=MineConfig, description="mine settings.")
    hint: HintSettings = Field(default_factory=HintSettings, description="hint settings.")
    build: dict[str, Any] = Field(default_factory=dict, description="BuildConfig fields other than base/hints/round.")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        # The run folder is runs/<name>: a name must stay one folder inside the runs folder.
        if not _SAFE_NAME.fullmatch(v) or ".." in v or v != v.strip() or v.endswith("."):
            raise ValueError(
                f"{v!r} is not a safe run name: one folder name (no '/', '\\', '..', absolute path, leading dot "
                "or dash, control characters, or any of :*?\"<>|; at most 100 characters), e.g. gsm8k-hints"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> "Workflow":
        for key in ("base", "hints", "round", "domain", "mapping"):
            if key in self.build:
                raise ValueError(f"build.{key} is set by the workflow itself; remove it")
        return self


def load_workflow(path: str | Path) -> Workflow:
    """Load and validate a workflow file; errors name the file and the key."""
    path = resolve_workflow_path(path)
    data = read_yaml_mapping(path, "workflow keys (name, base, trainer, ...)")
    return validate_workflow(data, str(path))


def validate_workflow(data: dict[str, Any], where: str = "workflow") -> Workflow:
    try:
        wf = Workflow.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, where) from exc
    try:
        check_sections(wf)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return wf


def check_template_kwargs_match(wf: Workflow, build: BuildConfig) -> None:
    """build.chat_template_kwargs and the trainer's must agree (the build takes the trainer's when it sets none);
    a trainer with no setting for them (OpenRLHF 0.11.2) cannot pass any to chat prompts."""
    if "chat_template_kwargs" not in wf.build:
        return
    theirs = section_template_kwargs(wf.trainer)
    mine = build.chat_template_kwargs
    key = section_kwargs_key(wf.trainer)
    no_setting = key is None  # a trainer that passes no template variables
    if no_setting and mine and (build.placement not in (None, *TEXT_PLACEMENTS) or build.template):
        raise ConfigError(f"build.chat_template_kwargs {mine}: {get_launcher(wf.trainer.kind).name} renders chat prompts with its template's "
                          "defaults (it has no setting for template variables); use build.placement assistant (mentor "
                          "renders every prompt with the variables) or drop build.chat_template_kwargs")
    if theirs is not None and theirs != mine:
        raise ConfigError(f"build.chat_template_kwargs {mine} and trainer {key} {theirs} "
                          "differ: the prompts and the trainer must render the template the same way; set one of them "
                          "(the build takes the trainer's when it sets none)")


def check_sections(wf: Workflow) -> None:
    """Validate the sections owned by other stages with their own models."""
    try:
        build = BuildConfig.model_validate(wf.build | {"base": wf.base})
    except ValidationError as exc:
        raise config_error(exc, prefix="build") from exc
    why = text_prompts_refused(wf.trainer.kind)
    if why and build.placement in TEXT_PLACEMENTS:
        raise ConfigError(f"build.placement {build.placement}: the prompts would be text rendered with the policy's chat "
                          f"template, and {why}; use placement after (or before/system) with trainer {wf.trainer.kind}")
    check_template_kwargs_match(wf, build)

    try:
        hint = HintConfig.model_validate(wf.hint.config)
    except ValidationError as exc:
        raise config_error(exc, prefix="hint.config") from exc
    # The backends, as the stages would build them (no server contacted, no engine started).
    policy = section_policy(wf.trainer)  # the policy mentor samples itself (the train stage's offline kind)
    backends = [("hint.backend", wf.hint.backend)] + ([("trainer.policy", policy)] if policy is not None else [])
    for where, b in backends:
        b.check(where)
    if hint.vouch is not None:
        hint.vouch.policy.check("hint.config.vouch.policy")
    # The trainer section's own checks (offline: the last round's seed in range; a launched trainer: its round config;
    # a trainer package mentor needs in its own process, TRL, is asked for when the run starts).
    check_section(wf.trainer, wf.rounds)


def resolve_workflow_path(path: str | Path) -> Path:
    """A path, or the name of a packaged workflow (``gsm8k-demo``)."""
    p = Path(path)
    if p.exists():
        return p
    packaged = PACKAGED / (p.name if p.suffix else f"{p.name}.yaml")
    if packaged.exists():
        return packaged
    raise ConfigError(f"{path}: no such workflow file (packaged ones: {', '.join(sorted(f.stem for f in PACKAGED.glob('*.yaml')))})")
