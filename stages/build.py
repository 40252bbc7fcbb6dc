"""Build: base problem set + hints -> next-epoch prompt shards (schema: prompts).

Every problem of the base set gets a prompt; a problem with a hint gets the
hint where ``placement`` says: ``before`` the problem in the user message,
``after`` it (just before the instruction), in the ``system`` message, or as the
start of the policy's answer (``assistant``; `build_render.messages_expr`, the
layout `mentor rescue` re-rolls with too). ``assistant`` needs the policy's
tokenizer (``tokenizer``): every prompt, hinted or not, is then rendered with its
chat template and written as text (`pipeline.prompts.render_prompt`), which
OpenRLHF (without ``--data.apply_chat_template``) and TRL read as it is and verl
0.9.1 cannot read. With a tokenizer, the default placement is ``assistant`` (``after``
when the base set has code tasks: `build_render.resolve_placement`) and the
longest prompt in its tokens is recorded (``max_prompt_tokens``). The message
shards serve OpenRLHF, verl and TRL without edits:

- ``prompt``: chat messages ``[{role, content}, ...]`` (an optional system
  message, then the user message: problem + the domain's instruction, with the
  hint block before or after the problem, or in the system message);
- ``label``: the JSON string of `schemas.prompt_label` (reference answer or
  tests + ``problem_id``, ``hint_id``, ``round``): OpenRLHF hands only this
  column to the reward function;
- verl's ``data_source``, ``ability``, ``reward_model {style, ground_truth}``,
  ``extra_info {problem_id, hint_id, round, index}``;
- convenience copies ``problem_id``, ``hint_id``, ``round`` for polars.

Choices (documented in docs/cli.md and docs/data.md):

- Row order: the base set's order (``--mode both``: a problem's unhinted row,
  then its hinted one). ``--seed S`` shuffles the rows by a splitmix64 key of
  (row number, S): plain integer arithmetic that no library upgrade changes. Either way the same inputs give byte-identical
  shards. No shuffle is the default because both trainers shuffle their
  dataloader with their own seed.
- Several hints for one problem (e.g. hints of rounds 0 and 1 passed
  together): the latest round wins and the others are counted as
  ``hints_superseded``; two *different* hints of the same problem and round
  are an error (which one the user meant cannot be guessed).
- ``--round``: the round the prompts are for (stamped into label and
  extra_info). Default: the latest hint round + 1 (hints are made from round
  r's rollouts for round r+1), or 0 without hints.
- A hint or a problem whose text carries a chat-control token (``<|im_end|>``,
  ``<|start_header_id|>``, ``<｜User｜>``, ...: the policy's special and added tokens,
  and always the common templates') would open chat turns in the prompt: the hint is
  dropped (its problem gets the unhinted prompt, ``hints_special_token``), the problem
  is dropped (``base_dropped.special_token``); `build_guard`.
- The shard directory also gets a ``README.md`` dataset card whose YAML
  ``configs`` name the shards, so ``datasets.load_dataset(DIR)`` (which
  OpenRLHF runs on a directory) reads the shards and not ``manifest.json``.

The stage in three steps, one module each: `build_base` reads and checks the
base set and the hints, `build_render` joins them into rows and renders the
PROMPTS columns (polars expressions; per-row Python only for code labels and
``text_id`` of base sets without an id column), `build_write` writes the shards
and the dataset card. `BuildStage` runs them; the driver stages its folder.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, model_validator

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import atomic_path, sha256_file, write_manifest
from mentor.pipeline.faults import fault_point
from mentor.pipeline.outdir import Owns
from mentor.pipeline.policy_template import policy_mode
from mentor.pipeline.prompts import HINT_TEMPLATE, INSTRUCTIONS, PLACEHOLDER_RE, PLAIN_TEMPLATE, answer_template, load_tokenizer
from mentor.pipeline.schemas import DOMAINS, HINT_STATUSES, SCHEMA_VERSION
from mentor.pipeline.stage import Context, Round, RoundJob, Stage, Stats, StatsLayout
from mentor.stages.build_base import PROBLEM_COLUMNS, load_base, load_hints, validate_base
from mentor.stages.build_guard import screen_control_tokens
from mentor.stages.build_render import DEFAULT_PLACEMENT, PLACEMENTS, TEXT_PLACEMENTS, prepare_rows, resolve_placement
from mentor.stages.build_write import DEFAULT_SHARD_ROWS, dataset_card, write_shards
from mentor.stages.rules import control_tokens

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = HINT_TEMPLATE
DEFAULT_PLAIN_TEMPLATE = PLAIN_TEMPLATE
DEFAULT_INSTRUCTIONS = INSTRUCTIONS

BUILD_STATS = StatsLayout(
    counters=(
        "rows", "hinted_rows", "unhinted_rows", "base_problems", "hinted_problems", "hints_rows", "hints_used",
        "hints_unmatched", "hints_superseded", "hints_duplicate_rows", "hints_skipped_status", "hints_empty_text",
        "hints_missing_ids", "hints_special_token", "shards",
    ),
    groups={"base_dropped": ()},
    values={"round": 0, "mode": "prefix", "placement": DEFAULT_PLACEMENT, "prompt_format": "messages", "seed": None,
            "max_prompt_tokens": None, "prompt_tokenizer": None, "chat_template_kwargs": {}, "policy_mode": None},
    ratios={"hinted_share": ("hinted_rows", "rows")},
    warnings=True,
    logger=__name__,
)


class BuildConfig(BaseModel):
    """Settings of `mentor build` (also the `build:` section of a workflow)."""

    model_config = ConfigDict(extra="forbid")

    base: str = Field(
        description="Base problem set: a bundled name (gsm8k, math500, humaneval), a Parquet/JSONL file or directory, "
        "or hf:NAME[:CONFIG]:SPLIT (a Hugging Face dataset in the local cache)."
    )
    hints: list[str] = Field(default_factory=list, description="Hints datasets (files, directories or globs); none = unhinted prompts.")
    mapping: dict[str, str] = Field(
        default_factory=dict, description="Base-set column mapping canonical=column (problem, label, problem_id, domain, data_source)."
    )
    domain: Literal["math", "code"] = Field("math", description="Domain of base problems whose set has no domain column.")
    answer_after: str | None = Field(
        None,
        description="Keep only the text after the last occurrence of this marker in the base label "
        "(e.g. '####' for GSM8K solutions: the label becomes the final answer).",
    )
    mode: Literal["prefix", "both"] = Field(
        "prefix", description="prefix: a hinted problem gets only its hinted prompt; both: its unhinted prompt is kept beside it."
    )
    round: int | None = Field(
        None, ge=0, le=2**31 - 2, description="Round the prompts are for (label/extra_info). Default: latest hint round + 1, or 0 without hints."
    )
    placement: Literal[PLACEMENTS] | None = Field(  # type: ignore[valid-type]
        None,
        description="Where the hint goes: before the problem, after it (just before the instruction), in the system "
        "message (each read the same way by OpenRLHF, verl and TRL), or as the start of the policy's answer "
        "(assistant: needs tokenizer; text prompts for OpenRLHF and TRL, not verl). Default: assistant with a "
        f"tokenizer and no code task in the base set, else {DEFAULT_PLACEMENT}.",
    )
    tokenizer: str | None = Field(
        None, description="The round's policy (a mentor CPU model name, folder or hub name): its chat template renders "
        "placement assistant, and max_prompt_tokens counts in its tokens.",
    )
    answer_template: str | None = Field(
        None, description="How the hint opens the answer (placement assistant): bare, labelled, first_person, or a text "
        "with {hint} (default: the measured best, pipeline/prompts.py DEFAULT_ANSWER).",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Variables for the policy's chat template, the same the trainer passes (e.g. "
        "{enable_thinking: false} for Qwen3's non-thinking mode): placement assistant renders every prompt with them, "
        "max_prompt_tokens counts with them, and the manifest records them for the launchers. {}: the template's defaults.",
    )
    template: str | None = Field(
        None, description="User message of a hinted problem; placeholders {hint}, {problem}, optional {instruction} "
        "(default: the placement's; a template places the hint itself, so it goes without --placement).",
    )
    plain_template: str = Field(
        DEFAULT_PLAIN_TEMPLATE, description="User message of an unhinted problem; placeholders {problem}, optional {instruction}."
    )
    system_prompt: str | None = Field(None, description="Optional system message placed before the user message.")
    instructions: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_INSTRUCTIONS),
        description="Per-domain instruction appended to the user message (after a blank line) unless the template places "
        "{instruction} itself; an empty string disables it.",
    )
    hint_statuses: list[Literal["accepted", "repaired", "fallback"]] = Field(
        default_factory=lambda: list(HINT_STATUSES), description="Hint statuses to use; others are counted and skipped."
    )
    seed: int | None = Field(None, ge=0, le=2**64 - 1, description="Shuffle the rows with this seed, 0 to 2**64 - 1 "
                             "(default: keep the base set's order).")
    shard_rows: int | None = Field(None, ge=1, le=2**31 - 1, description=f"Rows per shard (default {DEFAULT_SHARD_ROWS} when --shard-bytes is not set).")
    shard_bytes: int | None = Field(
        None, ge=1024, le=1 << 50, description="Target uncompressed Arrow bytes per shard (files on disk are smaller: zstd)."
    )
    strict: bool = Field(False, description="Turn counted warnings (unmatched hints, unusable base rows) into errors.")

    @model_validator(mode="after")
    def _check(self) -> "BuildConfig":
        if self.shard_rows is not None and self.shard_bytes is not None:
            raise ValueError("give --shard-rows or --shard-bytes, not both")
        if self.template is not None and self.placement is not None:
            raise ValueError("give a template or a placement, not both (a template places the hint itself)")
        self.resolved_placement()  # a text placement without a tokenizer
        if self.answer_template is not None:  # (whether a placement uses it: `check_answer_template`, when it is settled)
            try:
                answer_template(self.answer_template)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        for name, text, needs, forbids in (
            ("template", self.template, ("hint", "problem"), ()),
            ("plain_template", self.plain_template, ("problem",), ("hint",)),
        ):
            if text is None:
                continue
            found = set(PLACEHOLDER_RE.findall(text))
            missing = [p for p in needs if p not in found]
            if missing:
                raise ValueError(f"{name} lacks the placeholder(s) {', '.join('{' + m + '}' for m in missing)}")
            bad = [p for p in forbids if p in found]
            if bad:
                raise ValueError(f"{name} must not use {', '.join('{' + b + '}' for b in bad)}")
        unknown = sorted(set(self.instructions) - set(DOMAINS))
        if unknown:
            raise ValueError(f"instructions for unknown domain(s) {unknown}; domains are {', '.join(DOMAINS)}")
        bad_map = sorted(set(self.mapping) - set(PROBLEM_COLUMNS))
        if bad_map:
            raise ValueError(f"--map {bad_map[0]}=...: not a problem column; map one of {', '.join(PROBLEM_COLUMNS)}")
        return self

    def check_answer_template(self, domains=()) -> None:
        """An answer template applies to placement assistant only: with another one it would be silently unused."""
        placement = "template" if self.template is not None else self.resolved_placement(domains)
        if self.answer_template is not None and placement not in TEXT_PLACEMENTS:
            why = ("the base set has code tasks, which keep the hint in the user turn" if domains and self.placement is None
                   and self.tokenizer else "")
            raise ValueError(f"--answer-template {self.answer_template!r} applies to placement assistant (the hint opens "
                             f"the answer), but the placement is {placement}{f' ({why})' if why else ''}; give --placement "
                             "assistant (with --tokenizer), or leave --answer-template out")

    def resolved_placement(self, domains=()) -> str:
        """The placement used: asked for, else assistant with a tokenizer unless `domains` (the base set's)
        include code (after with a user template), else after."""
        if self.template is not None:
            return DEFAULT_PLACEMENT  # unused: the template places the hint
        return resolve_placement(self.placement, self.tokenizer, domains)


class BuildInputs(BaseModel):
    """What `mentor build` reads besides the base set and hints its config names: the user's template
    files (listed in the manifest with their hashes)."""

    model_config = ConfigDict(extra="forbid")

    template_files: list[Path] = Field(default_factory=list)


class BuildStage(Stage):
    """The stage: build the prompt shards into `out_dir`: part-NNNNN.parquet, stats.json, README.md, manifest.json.

    All or nothing: everything is written into a fresh folder beside `out_dir` that
    replaces it in one rename at the end: a reader of ``part-*.parquet`` or
    ``load_dataset(out_dir)``, and a build killed at any point, see the old build or
    the new one, never a mix.
    """

    name = "build"
    Inputs = BuildInputs
    Config = BuildConfig
    owns = Owns(("manifest.json", "stats.json", "README.md"), shards=True)
    summary = ("rows", "hinted_rows")
    round_dir, round_order = "prompts", 50
    feeds_next_round = True  # the next round's trainer trains on these prompts
    status_columns = {"rows": ("rows",), "hinted": ("hinted_rows", "hinted")}

    def round_job(self, rnd: Round) -> RoundJob:
        hints = rnd.run_dir.stage(rnd.index, "hint").path / "hints.parquet"
        settings = rnd.build_settings()
        cfg = settings | {"base": str(rnd.problems_path), "hints": [str(hints)] if hints.exists() else [],
                          "round": rnd.index + 1}
        return RoundJob(settings, {}, cfg, upstream=[rnd.tokens["hint"], rnd.base_token])

    def base_job(self, rnd: Round) -> RoundJob:
        """The base set's unhinted prompts: what round 0 trains on when no logs stand in for it."""
        cfg = BuildConfig.model_validate(rnd.build_settings() | {"base": str(rnd.problems_path), "hints": [], "round": 0})
        return RoundJob(cfg.model_dump(exclude={"base"}), {}, cfg, upstream=[rnd.base_token])

    def run(self, inputs: BuildInputs, cfg: BuildConfig, out_dir: Path, ctx: Context) -> Stats:
        stats = BUILD_STATS(mode=cfg.mode, seed=cfg.seed, prompt_tokenizer=cfg.tokenizer)
        stats.chat_template_kwargs = dict(cfg.chat_template_kwargs)
        stats.extra["schema_version"] = SCHEMA_VERSION
        tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        base = load_base(cfg.base, cfg.mapping, cfg.domain)
        if cfg.answer_after:
            base.frame = base.frame.with_columns(pl.col("label").str.split(cfg.answer_after).list.last().str.strip_chars())
        problems = validate_base(base, cfg.strict, stats)
        if cfg.template is None:  # settled here: the default depends on the base set's domains
            try:
                cfg.check_answer_template(problems.get_column("domain").unique().to_list())
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            cfg = cfg.model_copy(update={"placement": cfg.resolved_placement(problems.get_column("domain").unique().to_list())})
        text = cfg.template is None and cfg.placement in TEXT_PLACEMENTS
        stats.placement = cfg.placement if cfg.template is None else "template"
        stats.prompt_format = "text" if text else "messages"
        if tokenizer is not None and text:  # the template must start the answer (checked once, before any row)
            stats.policy_mode = policy_mode(tokenizer, cfg.chat_template_kwargs)
        elif tokenizer is not None:  # chat prompts: the trainer renders them; the mode is recorded where it can be read
            try:
                stats.policy_mode = policy_mode(tokenizer, cfg.chat_template_kwargs)
            except ConfigError:
                stats.policy_mode = None
        hints = load_hints(cfg.hints, cfg.hint_statuses, stats)  # its errors come after the base set's
        problems, hints = screen_control_tokens(problems, hints, control_tokens(tokenizer), stats, cfg.strict, base.where)
        stats.base_problems = problems.height
        if cfg.round is not None:
            stats.round = cfg.round
        elif hints.height:  # hints made from round r's rollouts are for round r + 1
            stats.round = int(hints.get_column("hint_round").max()) + 1
        rows = prepare_rows(problems, hints, cfg, stats.round, stats, where=base.where)
        sources = [*base.files, *(resolve_inputs(cfg.hints) if cfg.hints else []), *inputs.template_files]
        shards, stats.max_prompt_tokens = write_shards(rows, out_dir, cfg, stats.round, tokenizer, as_text=text)
        fault_point("build.after_shards")  # resume tests: killed with shards written, nothing swapped in yet
        stats.shards = len(shards)
        hashes = {str(p): sha256_file(p) for p in [*shards, *sources]}
        with atomic_path(out_dir / "README.md") as tmp:
            tmp.write_text(dataset_card([s.name for s in shards], stats, [hashes[str(s)] for s in shards], text=text))
        write_manifest(
            out_dir, shards, "prompts", inputs=sources, config=cfg,
            extra={"base": base.info, "round": stats.round, "stats": "stats.json", "placement": stats.placement,
                   "prompt_format": stats.prompt_format, "max_prompt_tokens": stats.max_prompt_tokens,
                   "prompt_tokenizer": stats.prompt_tokenizer, "chat_template_kwargs": dict(cfg.chat_template_kwargs),
                   "policy_mode": stats.policy_mode}, hashes=hashes,
        )
        log.info("built %d prompts (%d hinted) in %d shard(s)", stats.rows, stats.hinted_rows, stats.shards)
        return stats


STAGE = BUILD = BuildStage()


__all__ = ["BUILD", "BUILD_STATS", "STAGE", "BuildConfig", "BuildInputs", "BuildStage"]
