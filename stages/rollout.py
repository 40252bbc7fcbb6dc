"""Offline rollouts and the rescue check, through the LLM backend seam.

`mentor rollout PROMPTS --policy MODEL --k 4 --out DIR` samples k responses per
prompt (one backend call for the whole set; vLLM schedules it), verifies each
with `mentor.training.verify`, and writes canonical rollout shards (schema
ROLLOUTS, source ``mentor-rollout``): the loop can run without a trainer, and
hints can be checked before training.

`mentor rescue --collapsed C --hints H --policy MODEL --k 4 --out DIR` re-rolls
every collapsed problem that has a hint twice, with and without the hint (the
same prompt layout as `mentor build`: ``Hint: ...`` before the problem in the
user message), and reports per problem and overall how many collapsed problems
now get at least one correct rollout: ``DIR/rescue.parquet`` (one row per
problem), ``DIR/rescue.json`` (totals, rescue rates), and the rollouts
themselves in ``DIR/rollouts/``.

Inputs of `rollout`: PROMPTS shards (from `mentor build`; the label carries
problem id, hint id and round) or a PROBLEMS dataset (each problem becomes one
user message with the domain's instruction).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from mentor.pipeline.errors import DataError
from mentor.pipeline.io import read_dataset, read_parquet_schema, resolve_inputs, write_json_atomic, write_parquet_atomic
from mentor.pipeline.llm import Backend, GenRequest
from mentor.pipeline.schemas import SCHEMA_VERSION, check_schema, parse_prompt_label
from mentor.training.verify import reference_of

log = logging.getLogger(__name__)

SOURCE = "mentor-rollout"
# The same layout `mentor build` writes by default (stages do not import each
# other, so the defaults are repeated here; keep them in step with build).
HINT_TEMPLATE = "Hint: {hint}\n\n{problem}"
INSTRUCTIONS = {
    "math": "Please reason step by step, and put your final answer within \\boxed{}.",
    "code": "Write the complete solution in Python inside one ```python code block.",
}


class RolloutConfig(BaseModel):
    """Sampling settings of `mentor rollout` / `mentor rescue`."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(4, ge=1, description="Rollouts per prompt.")
    max_tokens: int = Field(1024, ge=1, description="Max new tokens per rollout.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (GRPO trains at 1.0).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    seed: int = Field(0, description="Base seed; rollout j of prompt i gets its own derived seed.")
    limit: int | None = Field(None, ge=1, description="Only the first N prompts / problems (demos, tests).")
    round: int | None = Field(None, ge=0, description="Round stamped on the rollouts (default: from the prompt label, else 0).")
    verify_workers: int = Field(4, ge=1, description="Threads verifying responses (code runs in sandbox processes).")
    hint_template: str = Field(HINT_TEMPLATE, description="User message of a hinted prompt ({hint}, {problem}).")
    instructions: dict[str, str] = Field(default_factory=lambda: dict(INSTRUCTIONS), description="Instruction appended per domain.")


@dataclass
class PromptItem:
    """One prompt to sample: what is sent, and what the rollouts are verified and filed under."""

    messages: list[dict]
    domain: str
    reference: str | None  # domain-form label
    problem_id: str
    hint_id: str | None
    round: int
    problem: str | None  # original text without hint, when known
    variant: str = "plain"  # rescue: "hinted" | "unhinted"


def user_message(problem: str, domain: str, cfg: RolloutConfig, hint: str | None = None) -> str:
    body = cfg.hint_template.replace("{hint}", hint).replace("{problem}", problem) if hint else problem
    instruction = cfg.instructions.get(domain, "")
    return f"{body}\n\n{instruction}" if instruction else body


# --------------------------------------------------------------------------- reading prompts


def _is_dataset(paths: list[Path], dataset: str) -> bool:
    return all(not check_schema(read_parquet_schema(p), dataset) for p in paths)


def load_prompt_items(sources: Sequence[str], cfg: RolloutConfig) -> list[PromptItem]:
    """PROMPTS shards or a PROBLEMS dataset -> prompt items (in file order)."""
    paths = resolve_inputs(sources)
    if _is_dataset(paths, "prompts"):
        df = read_dataset(paths, "prompts")
        if cfg.limit:
            df = df.head(cfg.limit)
        items = []
        for i, row in enumerate(df.iter_rows(named=True)):
            try:
                label = parse_prompt_label(row["label"])
            except (TypeError, ValueError) as exc:
                raise DataError(f"{', '.join(map(str, paths))}: row {i}: column 'label' is not a mentor prompt label ({exc}); rebuild the prompts with mentor build") from exc
            domain = label.get("domain") or row["ability"]
            # The code reference keeps every key of the code label ("setup" included: trusted helpers of the tests).
            ref = json.dumps(reference_of({**label, "domain": "code"}), sort_keys=True) if domain == "code" else label.get("answer")
            items.append(
                PromptItem(
                    messages=[{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
                    domain=domain,
                    reference=ref,
                    problem_id=str(label.get("problem_id") or row["problem_id"]),
                    hint_id=label.get("hint_id"),
                    round=cfg.round if cfg.round is not None else int(label.get("round") or row["round"] or 0),
                    problem=None,
                )
            )
        return items
    if _is_dataset(paths, "problems"):
        df = read_dataset(paths, "problems")
        if cfg.limit:
            df = df.head(cfg.limit)
        return [
            PromptItem(
                messages=[{"role": "user", "content": user_message(r["problem"], r["domain"], cfg)}],
                domain=r["domain"],
                reference=r["label"],
                problem_id=r["problem_id"],
                hint_id=None,
                round=cfg.round or 0,
                problem=r["problem"],
            )
            for r in df.iter_rows(named=True)
        ]
    found = ", ".join(read_parquet_schema(paths[0]).names[:10])
    raise DataError(
        f"{paths[0]}: neither prompt shards (mentor build) nor a problems dataset (found columns: {found}); "
        "pass the output of `mentor build`, or a problems Parquet with problem_id, domain, problem, label, data_source"
    )


# --------------------------------------------------------------------------- sampling + verifying


def _seed(base: int, i: int, j: int, k: int) -> int:
    return (base * 1_000_003 + i * k + j) % (2**31 - 1)


def sample_and_verify(
    backend: Backend,
    items: Sequence[PromptItem],
    cfg: RolloutConfig,
    verifier: Callable[[str, str, str | None], float] | None = None,
) -> list[dict[str, Any]]:
    """k rollouts per item in ONE backend call, each verified; rows in item order, then sample order."""
    if verifier is None:
        from mentor.training.verify import verify as verifier  # noqa: N813
    requests = [
        GenRequest(
            id=f"{i}:{j}",
            messages=item.messages,
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            seed=_seed(cfg.seed, i, j, cfg.k),
        )
        for i, item in enumerate(items)
        for j in range(cfg.k)
    ]
    t0 = time.monotonic()
    results = backend.generate(requests)
    log.info("sampled %d rollouts in %.1fs", len(results), time.monotonic() - t0)
    pairs = list(zip(requests, results))

    def check(pair) -> float:
        req, res = pair
        item = items[int(req.id.split(":")[0])]
        return float(verifier(item.domain, res.text, item.reference))

    with ThreadPoolExecutor(max_workers=cfg.verify_workers) as pool:
        scores = list(pool.map(check, pairs))
    rows = []
    for (req, res), correct in zip(pairs, scores):
        i, j = (int(x) for x in req.id.split(":"))
        item = items[i]
        rows.append(
            {
                "problem_id": item.problem_id,
                "round": item.round,
                "sample_idx": j,
                "problem": item.problem,
                "prompt": "\n\n".join(m["content"] for m in item.messages),
                "response": res.text,
                "correct": correct,
                "reward": correct,
                "hint_id": item.hint_id,
                "domain": item.domain,
                "label": item.reference,
                "source": SOURCE,
                "truncated": res.finish_reason == "length",
                "step": None,
                "_variant": item.variant,
                "_completion_tokens": res.completion_tokens,
            }
        )
    return rows


def _rollouts_table(rows: list[dict[str, Any]]) -> pa.Table:
    from mentor.pipeline.schemas import ROLLOUTS

    cols = {f.name: [r.get(f.name) for r in rows] for f in ROLLOUTS}
    return pa.Table.from_pydict(cols, schema=pa.schema([f.with_nullable(True) for f in ROLLOUTS]))


def _dedupe_sample_idx(rows: list[dict[str, Any]]) -> None:
    """Two prompts of one problem (e.g. build --mode both) must not share (problem_id, round, sample_idx)."""
    seen: dict[tuple[str, int], int] = {}
    for r in rows:
        key = (r["problem_id"], r["round"])
        r["sample_idx"] = seen.get(key, 0)
        seen[key] = r["sample_idx"] + 1


def rollout_to_dir(sources: Sequence[str], out_dir: str | Path, cfg: RolloutConfig, backend: Backend | Callable[[], Backend]) -> dict[str, Any]:
    """`mentor rollout`: writes ``out_dir/part-00000.parquet`` (ROLLOUTS) and ``out_dir/stats.json``."""
    items = load_prompt_items(sources, cfg)
    if not items:
        raise DataError(f"no prompts in {', '.join(map(str, sources))}")
    backend = backend if hasattr(backend, "generate") else backend()  # a BackendSpec is called here
    t0 = time.monotonic()
    rows = sample_and_verify(backend, items, cfg)
    _dedupe_sample_idx(rows)
    out_dir = Path(out_dir)
    write_parquet_atomic(_rollouts_table(rows), out_dir / "part-00000.parquet", dataset="rollouts")
    frame = pl.DataFrame({"pid": [r["problem_id"] for r in rows], "c": [r["correct"] for r in rows]})
    per = frame.group_by("pid").agg(pl.col("c").max().alias("best"), pl.col("c").min().alias("worst"))
    stats = {
        "schema_version": SCHEMA_VERSION,
        "prompts": len(items),
        "problems": per.height,
        "rollouts": len(rows),
        "k": cfg.k,
        "correct": int(sum(r["correct"] > 0 for r in rows)),
        "mean_correct": round(float(frame["c"].mean()), 6) if rows else 0.0,
        "collapsed": int((per["best"] <= 0).sum()),
        "all_correct": int((per["worst"] > 0).sum()),
        "truncated": int(sum(bool(r["truncated"]) for r in rows)),
        "completion_tokens": int(sum(r["_completion_tokens"] for r in rows)),
        "engine_calls": 1,
        "model": getattr(backend, "model", None),
        "seconds": round(time.monotonic() - t0, 3),
        "inputs": [str(s) for s in sources],
        "config": cfg.model_dump(mode="json"),
    }
    write_json_atomic(stats, out_dir / "stats.json")
    return stats


# --------------------------------------------------------------------------- rescue


def rescue_items(collapsed: pl.DataFrame, hints: pl.DataFrame, cfg: RolloutConfig) -> tuple[list[PromptItem], int]:
    """Hinted + unhinted prompt items per collapsed problem with a hint; also the count without one."""
    latest = (
        hints.sort("round")
        .group_by("problem_id", maintain_order=True)
        .agg(pl.col("hint_id").last(), pl.col("hint").last(), pl.col("round").last().alias("hint_round"))
    )
    joined = collapsed.join(latest, on="problem_id", how="left", maintain_order="left")
    if cfg.limit:
        joined = joined.head(cfg.limit)
    items: list[PromptItem] = []
    missing = 0
    for r in joined.iter_rows(named=True):
        if r["hint"] is None:
            missing += 1
            continue
        rnd = cfg.round if cfg.round is not None else int(r["hint_round"])
        for variant, hint in (("hinted", r["hint"]), ("unhinted", None)):
            items.append(
                PromptItem(
                    messages=[{"role": "user", "content": user_message(r["problem"], r["domain"], cfg, hint)}],
                    domain=r["domain"],
                    reference=r["label"],
                    problem_id=r["problem_id"],
                    hint_id=r["hint_id"] if hint else None,
                    round=rnd,
                    problem=r["problem"],
                    variant=variant,
                )
            )
    return items, missing


RESCUE_COLUMNS = {
    "problem_id": pl.String,
    "domain": pl.String,
    "hint_id": pl.String,
    "k": pl.Int32,
    "correct_hinted": pl.Int32,
    "correct_unhinted": pl.Int32,
    "rescued_hinted": pl.Boolean,
    "rescued_unhinted": pl.Boolean,
    "mean_correct_hinted": pl.Float64,
    "mean_correct_unhinted": pl.Float64,
}


def rescue_report(rows: list[dict[str, Any]], k: int) -> pl.DataFrame:
    """One row per problem: correct rollouts with and without the hint, and whether each rescued it."""
    if not rows:
        return pl.DataFrame(schema=RESCUE_COLUMNS)
    df = pl.DataFrame(
        {
            "problem_id": [r["problem_id"] for r in rows],
            "domain": [r["domain"] for r in rows],
            "hint_id": [r["hint_id"] for r in rows],
            "variant": [r["_variant"] for r in rows],
            "correct": [r["correct"] for r in rows],
        }
    )
    ok = pl.col("correct") > 0
    hinted = pl.col("variant") == "hinted"
    return (
        df.group_by("problem_id", maintain_order=True)
        .agg(
            pl.col("domain").first(),
            pl.col("hint_id").drop_nulls().first(),
            (ok & hinted).sum().cast(pl.Int32).alias("correct_hinted"),
            (ok & ~hinted).sum().cast(pl.Int32).alias("correct_unhinted"),
            pl.col("correct").filter(hinted).mean().alias("mean_correct_hinted"),
            pl.col("correct").filter(~hinted).mean().alias("mean_correct_unhinted"),
        )
        .with_columns(
            pl.lit(k, pl.Int32).alias("k"),
            (pl.col("correct_hinted") >= 1).alias("rescued_hinted"),
            (pl.col("correct_unhinted") >= 1).alias("rescued_unhinted"),
        )
        .select(list(RESCUE_COLUMNS))
    )


def rescue_to_dir(
    collapsed_sources: Sequence[str],
    hints_sources: Sequence[str],
    out_dir: str | Path,
    cfg: RolloutConfig,
    backend: Backend | Callable[[], Backend],
) -> dict[str, Any]:
    """`mentor rescue`: ``rescue.parquet`` + ``rescue.json`` + ``rollouts/part-00000.parquet`` in `out_dir`."""
    collapsed = read_dataset(resolve_inputs(collapsed_sources), "collapsed")
    hints = read_dataset(resolve_inputs(hints_sources), "hints")
    if collapsed.height == 0:
        raise DataError(f"{', '.join(map(str, collapsed_sources))}: no collapsed problems to re-roll")
    dup = collapsed.group_by("problem_id").len().filter(pl.col("len") > 1)
    if dup.height:
        # Several rounds' collapsed sets: keep each problem's latest row.
        collapsed = collapsed.sort("round").unique("problem_id", keep="last", maintain_order=True)
    items, missing = rescue_items(collapsed, hints, cfg)
    if not items:
        raise DataError(
            f"none of the {collapsed.height} collapsed problems has a hint in {', '.join(map(str, hints_sources))}; "
            "run `mentor hint` on this collapsed set first"
        )
    backend = backend if hasattr(backend, "generate") else backend()
    t0 = time.monotonic()
    rows = sample_and_verify(backend, items, cfg)
    out_dir = Path(out_dir)
    report = rescue_report(rows, cfg.k)
    for r in rows:  # hinted samples first, then unhinted: distinct sample_idx per problem
        if r["_variant"] == "unhinted":
            r["sample_idx"] += cfg.k
    write_parquet_atomic(_rollouts_table(rows), out_dir / "rollouts" / "part-00000.parquet", dataset="rollouts")
    write_parquet_atomic(report, out_dir / "rescue.parquet")
    n = report.height
    rh = int(report["rescued_hinted"].sum())
    ru = int(report["rescued_unhinted"].sum())
    summary = {
        "schema_version": SCHEMA_VERSION,
        "problems": n,
        "collapsed": collapsed.height,
        "skipped_no_hint": missing,
        "k": cfg.k,
        "rescued_hinted": rh,
        "rescued_unhinted": ru,
        "rescue_rate_hinted": round(rh / n, 6) if n else 0.0,
        "rescue_rate_unhinted": round(ru / n, 6) if n else 0.0,
        "lift": round((rh - ru) / n, 6) if n else 0.0,
        "mean_correct_hinted": round(float(report["mean_correct_hinted"].mean() or 0.0), 6),
        "mean_correct_unhinted": round(float(report["mean_correct_unhinted"].mean() or 0.0), 6),
        "rollouts": len(rows),
        "engine_calls": 1,
        "model": getattr(backend, "model", None),
        "seconds": round(time.monotonic() - t0, 3),
        "inputs": {"collapsed": [str(s) for s in collapsed_sources], "hints": [str(s) for s in hints_sources]},
        "config": cfg.model_dump(mode="json"),
    }
    write_json_atomic(summary, out_dir / "rescue.json")
    return summary


__all__ = [
    "PromptItem",
    "RolloutConfig",
    "load_prompt_items",
    "rescue_items",
    "rescue_report",
    "rescue_to_dir",
    "rollout_to_dir",
    "sample_and_verify",
]
