"""The rescue experiment: do hints make collapsed problems solvable again? (`mentor rescue`)

`mentor rescue --collapsed C --hints H --policy MODEL --k 4 --out DIR` re-rolls
every collapsed problem under several *arms* and reports, per arm, how many
collapsed problems now get at least one correct rollout. The arm
``unhinted`` (the plain problem) is always there; ``--hints H`` adds the arm
``hinted``, ``--arm NAME=H`` any named one (e.g. one per hint-stage ablation).
A hinted prompt has the layout `mentor build` writes, through the same function
(`build_render.prompt_messages`: the hint before or after the problem, in the
system message, or opening the policy's answer, as ``placement`` says; per arm with
``arm_placements``). Placement ``assistant`` (the default where the policy's
tokenizer is known: a vllm policy, or ``tokenizer``) renders every prompt of the arm
with the policy's chat template, as build writes it, and sends that text (the
unhinted arm too, when it is the run's placement); the rollouts log it as sent. Only
problems with a hint in every arm are re-rolled, and rollout j of a problem has
the same seed in every arm, so the arms are a paired comparison: same problems, same seeds, one engine batch.
Outputs: ``DIR/rescue.parquet`` (one row per problem; per arm ``correct_<arm>``,
``rescued_<arm>``, ``mean_correct_<arm>``, ``hint_id_<arm>``), ``DIR/stats.json``
(totals and rates per arm) and the rollouts in ``DIR/rollouts/`` (arm a's
sample j has ``sample_idx = a * k + j``; unhinted rows have no ``hint_id``),
sampled in resumable shards by `mentor.stages.rollout.run_shards`.

`--collapsed` may also be a problems dataset or a bundled set name: then each
of its problems that has a hint is re-rolled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import read_dataset, read_parquet_schema, write_parquet_atomic
from mentor.pipeline.schemas import SCHEMA_VERSION
from mentor.pipeline.outdir import Owns
from mentor.pipeline.stage import Context, Source, Stage, Stats, StatsLayout
from mentor.pipeline.policy_template import generation_prompt
from mentor.pipeline.prompts import answer_template, load_tokenizer, render_prompt
from mentor.stages.build_render import DEFAULT_PLACEMENT, PLACEMENTS, TEXT_PLACEMENTS, prompt_messages
from mentor.stages.rollout import (
    UNHINTED,
    PromptItem,
    RolloutConfig,
    is_dataset,
    problem_seed,
    resolve_sources,
    run_shards,
)

def _latest_hints(hints: pl.DataFrame) -> pl.DataFrame:
    return (
        hints.sort("round")
        .group_by("problem_id", maintain_order=True)
        .agg(pl.col("hint_id").last(), pl.col("hint").last(), pl.col("round").last().alias("hint_round"))
    )


def read_collapsed_or_problems(sources: Sequence[str]) -> pl.DataFrame:
    """A collapsed set (`mentor mine`), or a problems dataset / bundled set name whose problems are all re-rolled."""
    paths = resolve_sources(sources)
    if is_dataset(paths, "collapsed"):
        return read_dataset(paths, "collapsed")
    if is_dataset(paths, "problems"):
        return read_dataset(paths, "problems").select("problem_id", "domain", "problem", "label").with_columns(
            pl.lit(0, pl.Int32).alias("round"))
    found = ", ".join(read_parquet_schema(paths[0]).names[:10])
    raise DataError(f"{paths[0]}: --collapsed takes collapsed.parquet from `mentor mine`, a problems dataset or a bundled "
                    f"set name (gsm8k, math500, humaneval); found columns: {found}")


def rescue_items(collapsed: pl.DataFrame, arms: dict[str, pl.DataFrame], cfg: RolloutConfig,
                 arm_placements: dict[str, str] | None = None,
                 arm_answers: dict[str, str] | None = None) -> tuple[list[PromptItem], list[str], dict[str, int]]:
    """Prompt items per problem and arm (the unhinted arm first), the problems kept, and the problems
    without a hint per arm (``"*"``: without a hint in some arm).

    A problem is kept only when every hinted arm has a hint for it (a paired comparison). Each
    arm's prompts are laid out as `mentor build` does (`build_render.prompt_messages`), with
    ``cfg.placement`` or the arm's own in `arm_placements`; a text placement's are rendered with
    ``cfg.tokenizer`` (settle both first: `RolloutConfig.for_policy`), the hint opening the answer as
    ``cfg.answer_template`` or the arm's own in `arm_answers` says.
    """
    arm_placements = arm_placements or {}
    arm_answers = arm_answers or {}
    latest = {name: _latest_hints(h) for name, h in arms.items()}
    joined = collapsed
    for a, (name, lh) in enumerate(latest.items()):
        joined = joined.join(lh.rename({"hint_id": f"_hid{a}", "hint": f"_hint{a}", "hint_round": f"_round{a}"}),
                             on="problem_id", how="left", maintain_order="left")
    if cfg.limit:
        joined = joined.head(cfg.limit)
    missing = {name: int(joined[f"_hint{a}"].is_null().sum()) for a, name in enumerate(latest)}
    before = joined.height
    if latest:
        joined = joined.filter(pl.all_horizontal(pl.col(f"_hint{a}").is_not_null() for a in range(len(latest))))
    missing["*"] = before - joined.height
    items: list[PromptItem] = []
    kept: list[str] = []
    rows = list(joined.iter_rows(named=True))
    names = [UNHINTED, *latest]
    layouts, texts = {}, {}  # arm -> the messages (and text prompts) of every kept problem, in row order
    for a, name in enumerate(names):
        hints = [None] * len(rows) if name == UNHINTED else [r[f"_hint{a - 1}"] for r in rows]
        placement = arm_placements.get(name, cfg.placement) or DEFAULT_PLACEMENT
        text = placement in TEXT_PLACEMENTS
        layouts[name] = prompt_messages(
            [{"problem": r["problem"], "hint": h, "domain": r["domain"]} for r, h in zip(rows, hints)],
            placement=placement, template=arm_answers.get(name, cfg.answer_template) if text else cfg.hint_template,
            instructions=cfg.instructions,
        )
        if text:
            tok = load_tokenizer(cfg.tokenizer)
            generation_prompt(tok, None, cfg.chat_template_kwargs)  # a template that starts no answer: refused at once
            texts[name] = [render_prompt(tok, m, cfg.chat_template_kwargs) for m in layouts[name]]
    for n, r in enumerate(rows):
        kept.append(r["problem_id"])
        rnd = cfg.round if cfg.round is not None else int(max([r[f"_round{a}"] for a in range(len(latest))], default=r.get("round") or 0))
        variants = [(UNHINTED, None, None)] + [(name, r[f"_hint{a}"], r[f"_hid{a}"]) for a, name in enumerate(latest)]
        for arm_index, (arm, hint, hint_id) in enumerate(variants):
            items.append(
                PromptItem(
                    messages=layouts[arm][n],
                    domain=r["domain"],
                    reference=r["label"],
                    problem_id=r["problem_id"],
                    hint_id=hint_id,
                    round=rnd,
                    problem=r["problem"],
                    arm=arm,
                    arm_index=arm_index,
                    prompt=texts[arm][n] if arm in texts else None,
                )
            )
    return items, kept, missing


def check_answer_templates(cfg: RolloutConfig, arms: Sequence[str], arm_placements: dict[str, str],
                           arm_answers: dict[str, str]) -> None:
    """An answer template (the config's, or an arm's own) that no arm with placement assistant uses would be silently
    ignored: a `ConfigError` naming it and the placement in force."""
    def placement(arm: str) -> str:
        return "template" if cfg.hint_template is not None else arm_placements.get(arm, cfg.placement) or DEFAULT_PLACEMENT

    for arm in arm_answers:
        if placement(arm) not in TEXT_PLACEMENTS:
            raise ConfigError(f"arm {arm}: its answer template applies to placement assistant (the hint opens the answer), "
                              f"but the arm's placement is {placement(arm)}; give the arm placement assistant or drop its "
                              "answer template")
    if cfg.answer_template is not None and not any(placement(a) in TEXT_PLACEMENTS and a not in arm_answers for a in arms):
        used = sorted({placement(a) for a in arms}) or [placement("")]
        raise ConfigError(f"--answer-template {cfg.answer_template!r} applies to placement assistant (the hint opens the "
                          f"answer), but the placement is {', '.join(used)}; give --placement assistant (with --tokenizer) "
                          "or leave --answer-template out")


def rescue_report(rows: list[dict[str, Any]], k: int, arms: Sequence[str]) -> pl.DataFrame:
    """One row per problem; per arm the correct rollouts, whether it rescued the problem, mean correctness, hint id."""
    arms = list(arms)
    df = pl.DataFrame(
        {
            "problem_id": [r["problem_id"] for r in rows],
            "domain": [r["domain"] for r in rows],
            "hint_id": [r["hint_id"] for r in rows],
            "arm": [arms[r["sample_idx"] // k] for r in rows],
            "correct": [float(r["correct"]) for r in rows],
        },
        schema={"problem_id": pl.String, "domain": pl.String, "hint_id": pl.String, "arm": pl.String, "correct": pl.Float64},
    )
    ok = pl.col("correct") > 0
    aggs: list[pl.Expr] = [pl.col("domain").first()]
    for arm in arms:
        mine = pl.col("arm") == arm
        aggs += [
            (ok & mine).sum().cast(pl.Int32).alias(f"correct_{arm}"),
            pl.col("correct").filter(mine).mean().alias(f"mean_correct_{arm}"),
        ]
        if arm != UNHINTED:
            aggs.append(pl.col("hint_id").filter(mine).first().alias(f"hint_id_{arm}"))
    out = df.group_by("problem_id", maintain_order=True).agg(aggs).with_columns(
        pl.lit(k, pl.Int32).alias("k"), *[(pl.col(f"correct_{a}") >= 1).alias(f"rescued_{a}") for a in arms]
    )
    if "hinted" in arms:
        out = out.with_columns(pl.col("hint_id_hinted").alias("hint_id"))
    return out


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def rescue_layout(arms: Sequence[str]) -> StatsLayout:
    """What stats.json holds for these arms: the counts, and per arm its rescued problems, rate and mean correctness."""
    return StatsLayout(
        counters=("problems", "collapsed", "skipped_no_hint", *(f"rescued_{a}" for a in arms), "rollouts",
                  "prompt_tokens", "completion_tokens", "engine_calls", "shards", "shards_reused"),
        ratios={f"rescue_rate_{a}": (f"rescued_{a}", "problems") for a in arms},
        values={"schema_version": SCHEMA_VERSION, "k": None, "arms": {}, **{f"mean_correct_{a}": 0.0 for a in arms},
                **({"lift": 0.0} if "hinted" in arms else {}), "model": None, "seconds": 0.0, "inputs": {}, "config": {}},
        logger=__name__,
    )


class RescueInputs(BaseModel):
    """What `mentor rescue` reads: collapsed problems (or a problems set) and the hints of each arm."""

    model_config = ConfigDict(extra="forbid")

    collapsed: list[Source]
    arms: dict[str, list[Source]] = Field(description="Arm name -> hints files (`--hints H` is the arm 'hinted').")
    placements: dict[str, str] = Field(default_factory=dict, description="An arm's own placement (default: the config's).")
    answers: dict[str, str] = Field(default_factory=dict, description="An arm's own opening of the answer (placement "
                                    "assistant; default: the config's).")


class RescueStage(Stage):
    """`mentor rescue`: ``rescue.parquet`` + ``stats.json`` + ``rollouts/`` (resumable shards).

    The inputs' ``arms`` map an arm name to hints files; the arm ``unhinted`` is
    always added. ``placements`` gives an arm its own placement (default
    ``cfg.placement``), e.g. to compare placements of the same hints in one run;
    ``answers`` an arm its own opening of the answer (placement assistant: a name of
    `prompts.ANSWER_TEMPLATES` or a text with {hint}).
    """

    name = "rescue"
    Inputs = RescueInputs
    Config = RolloutConfig
    owns = Owns(("rescue.parquet", "stats.json", "rollouts"))
    staged = False
    needs_engine = True
    summary = ("problems", "rollouts")

    def run(self, inputs: RescueInputs, cfg: RolloutConfig, out_dir: Path, ctx: Context) -> Stats:
        collapsed_sources, arm_sources, backend = inputs.collapsed, inputs.arms, ctx.engine("rescue")
        arm_placements, arm_answers, progress = inputs.placements, inputs.answers, ctx.progress
        for name in arm_sources:
            if name == UNHINTED or not name.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"arm name {name!r}: use letters, digits, '-' and '_' (and not {UNHINTED!r}, which is always there)")
        collapsed = read_collapsed_or_problems(collapsed_sources)
        arms = {name: read_dataset(resolve_inputs(src), "hints") for name, src in arm_sources.items()}
        if collapsed.height == 0:
            raise DataError(f"{', '.join(map(str, collapsed_sources))}: no collapsed problems to re-roll")
        if collapsed["problem_id"].is_duplicated().any():
            # Several rounds' collapsed sets: keep each problem's latest row.
            collapsed = collapsed.sort("round").unique("problem_id", keep="last", maintain_order=True)
        arm_placements = dict(arm_placements or {})
        unknown = sorted(set(arm_placements) - set(arms))
        if unknown:
            raise ConfigError(f"placement for arm(s) {unknown}, which are not in the run (arms: {', '.join(arms)})")
        bad = {a: p for a, p in arm_placements.items() if p not in PLACEMENTS}
        if bad:
            a, p = next(iter(bad.items()))
            raise ConfigError(f"arm {a}: placement {p!r}; use one of {', '.join(PLACEMENTS)}")
        arm_answers = dict(arm_answers or {})
        unknown = sorted(set(arm_answers) - set(arms))
        if unknown:
            raise ConfigError(f"answer template for arm(s) {unknown}, which are not in the run (arms: {', '.join(arms)})")
        for a, spec in arm_answers.items():
            try:
                answer_template(spec)
            except ConfigError as exc:
                raise ConfigError(f"arm {a}: {exc}") from None
        cfg = cfg.for_policy(backend, list(arm_placements.values()), collapsed.get_column("domain").unique().to_list())
        check_answer_templates(cfg, list(arms), arm_placements, arm_answers)
        items, kept, missing = rescue_items(collapsed, arms, cfg, arm_placements, arm_answers)
        if not items or not kept:
            where = "; ".join(f"{name}: {', '.join(map(str, src))}" for name, src in arm_sources.items())
            raise DataError(
                f"none of the {collapsed.height} collapsed problems has a hint in every arm ({where}); "
                "run `mentor hint` on this collapsed set first"
            )
        names = [UNHINTED, *arms]
        t0 = time.monotonic()
        per_problem = len(names)
        # Whole problems per shard, so that every arm of a problem is in the same engine batch.
        shard_cfg = cfg.model_copy(update={"shard_size": max(per_problem, cfg.shard_size // per_problem * per_problem)})
        run = run_shards("rescue", items, shard_cfg, backend, out_dir / "rollouts",
                         seed_fn=lambda i, item, j: problem_seed(cfg.seed, item.problem_id, j), progress=progress)
        rows = run.rows
        report = rescue_report(rows, cfg.k, names)
        write_parquet_atomic(report, out_dir / "rescue.parquet")
        n = report.height
        per_arm: dict[str, dict[str, Any]] = {}
        for name in names:
            rescued = int(report[f"rescued_{name}"].sum())
            lo, hi = wilson(rescued, n)
            per_arm[name] = {
                "rescued": rescued,
                "rescue_rate": round(rescued / n, 6) if n else 0.0,
                "rescue_rate_ci95": [round(lo, 6), round(hi, 6)],
                "mean_correct": round(float(report[f"mean_correct_{name}"].mean() or 0.0), 6),
                "skipped_no_hint": missing.get(name, 0),
            }
            if name != UNHINTED:
                place = arm_placements.get(name, cfg.placement) if cfg.hint_template is None else "template"
                per_arm[name]["placement"] = place
                if place in TEXT_PLACEMENTS:
                    per_arm[name]["answer_template"] = answer_template(arm_answers.get(name, cfg.answer_template))
        per_arm_values = {f"mean_correct_{name}": a["mean_correct"] for name, a in per_arm.items()}
        if "hinted" in per_arm:
            per_arm_values["lift"] = round((per_arm["hinted"]["rescued"] - per_arm[UNHINTED]["rescued"]) / n, 6) if n else 0.0
        stats = rescue_layout(names)(
            k=cfg.k, arms=per_arm, **per_arm_values, model=run.model or getattr(backend, "model", None),
            seconds=round(time.monotonic() - t0, 3), inputs={"collapsed": [str(s) for s in collapsed_sources], "arms": arm_sources},
            config=cfg.model_dump(mode="json"),
        )
        stats.merge({"problems": n, "collapsed": collapsed.height, "skipped_no_hint": missing["*"],
                     **{f"rescued_{name}": a["rescued"] for name, a in per_arm.items()}, "rollouts": len(rows),
                     "prompt_tokens": run.prompt_tokens, "completion_tokens": run.completion_tokens,
                     "engine_calls": run.engine_calls, "shards": run.shards, "shards_reused": run.shards - run.computed})
        return stats




STAGE = RESCUE = RescueStage()


__all__ = ["RESCUE", "STAGE", "RescueInputs", "RescueStage", "read_collapsed_or_problems", "rescue_items", "rescue_report",
           "wilson"]
