"""The per-dataset half of the `mentor inspect` report, computed with polars.

One summary per mentor dataset, each a JSON-able dict:

- rollouts:  problems, rollouts per problem, collapse rate, all-correct rate,
             mean correctness by round (and hinted vs unhinted when hints were used)
- collapsed: problems, streaks, previous hints, failed responses kept
- hints:     status counts, violations by name, retries/refines used, hint
             length distribution, most common keywords, three sample hints
             (and the hint stage's judge check and vouching from its stats.json)
- prompts:   rows, hinted share, shard sizes, manifest check
- problems:  rows, domains, sources, problem length
- rescue:    rescue rate hinted vs unhinted (outputs of `mentor rescue`)

`mentor.workflows.report` tells which dataset a path holds and puts these
together per round of a run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from mentor.pipeline.errors import DataError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.schemas import HINT_STATUSES
from mentor.pipeline.io import read_json, scan_dataset, sha256_file
from mentor.training.launcher import response_limit_settings

STATUS_ORDER = HINT_STATUSES  # a hint's statuses, best first (the schema's)


# --------------------------------------------------------------------------- helpers


def parquet_files(path: Path) -> list[Path]:
    """The Parquet files of a file/folder/glob (temporary files, _done markers and _shards skipped)."""
    return resolve_inputs([str(path)])


def rounded(x: Any, nd: int = 4) -> Any:
    """Round floats for display; NaN/inf become None so the JSON stays valid."""
    if x is None:
        return None
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return None
        return round(x, nd)
    return x


def distribution(s: pl.Series) -> dict[str, Any]:
    s = s.drop_nulls()
    if s.len() == 0:
        return {"n": 0}
    return {
        "n": s.len(),
        "min": rounded(s.min()),
        "p25": rounded(s.quantile(0.25, "nearest")),
        "p50": rounded(s.quantile(0.5, "nearest")),
        "mean": rounded(s.mean()),
        "p90": rounded(s.quantile(0.9, "nearest")),
        "max": rounded(s.max()),
    }


def _scan(path: Path, dataset: str) -> pl.LazyFrame:
    return scan_dataset([str(path)], dataset)


# --------------------------------------------------------------------------- per dataset


def per_problem_round(lf: pl.LazyFrame) -> pl.LazyFrame:
    """One row per (problem_id, round): rollouts, max/min/mean correctness."""
    return lf.group_by("problem_id", "round").agg(
        pl.len().alias("n"),
        pl.col("correct").max().alias("max_c"),
        pl.col("correct").min().alias("min_c"),
        pl.col("correct").mean().alias("mean_c"),
    )


def cut_fix() -> str:
    """The advice for problems cut at the response limit (the trainers' settings, from their launchers)."""
    return (f"raise the round's response limit ({response_limit_settings()}): these problems failed mostly at the limit, "
            "and mentor mine does not hint them")


def summarize_cut(lf: pl.LazyFrame, share: float = 0.5) -> dict[str, Any] | None:
    """Rollouts cut at the response limit (``truncated``), and the collapsed problems where more than `share` of the
    rollouts were cut (what `mentor mine` sets apart); None when the log does not say."""
    if "truncated" not in lf.collect_schema().names():
        return None
    per = (lf.group_by("problem_id", "round")
           .agg(n=pl.len(), cut=pl.col("truncated").fill_null(False).sum(), known=pl.col("truncated").is_not_null().sum(),
                max_c=pl.col("correct").max())
           .collect())
    if not int(per.get_column("known").sum()):
        return None
    collapsed = per.filter(pl.col("max_c") <= 0)
    cut = collapsed.filter(pl.col("cut") > share * pl.col("n"))
    out = {"truncated_rollouts": int(per.get_column("cut").sum()),
           "truncated_rate": rounded(float(per.get_column("cut").sum() / per.get_column("n").sum()), 6),
           "collapsed_cut": cut.height,
           "collapsed_cut_share": rounded(cut.height / collapsed.height, 6) if collapsed.height else None}
    if cut.height:
        out["fix"] = cut_fix()
    return out


def summarize_rollouts(lf: pl.LazyFrame) -> dict[str, Any]:
    lf = lf.filter(pl.col("correct").is_not_null() & pl.col("correct").is_not_nan())
    per = per_problem_round(lf).collect()
    if per.height == 0:
        return {"rollouts": 0, "problems": 0}
    cut = summarize_cut(lf)
    by_round = (
        per.group_by("round")
        .agg(
            pl.len().alias("problems"),
            pl.col("n").sum().alias("rollouts"),
            ((pl.col("mean_c") * pl.col("n")).sum() / pl.col("n").sum()).alias("mean_correct"),
            (pl.col("max_c") <= 0).sum().alias("collapsed"),
            (pl.col("max_c") <= 0).mean().alias("collapse_rate"),
            (pl.col("min_c") >= 1).sum().alias("all_correct"),
            (pl.col("min_c") >= 1).mean().alias("all_correct_rate"),
        )
        .sort("round")
    )
    collapsed = int((per.get_column("max_c") <= 0).sum())
    all_correct = int((per.get_column("min_c") >= 1).sum())
    n = per.get_column("n")
    out: dict[str, Any] = {
        "problems": per.get_column("problem_id").n_unique(),
        "problem_rounds": per.height,
        "rounds": by_round.get_column("round").to_list(),
        "rollouts": int(n.sum()),
        "rollouts_per_problem": {"min": int(n.min()), "mean": rounded(n.mean()), "max": int(n.max())},
        "mean_correct": rounded(float((per.get_column("mean_c") * n).sum() / n.sum())),
        "collapsed": collapsed,
        "collapse_rate": rounded(collapsed / per.height, 6),
        "all_correct": all_correct,
        "all_correct_rate": rounded(all_correct / per.height, 6),
        "by_round": [{k: rounded(v) for k, v in row.items()} for row in by_round.iter_rows(named=True)],
    }
    hinted = (
        lf.group_by(pl.col("hint_id").is_not_null().alias("hinted"))
        .agg(pl.len().alias("rollouts"), pl.col("correct").mean().alias("mean_correct"))
        .collect()
    )
    if hinted.height > 1 or (hinted.height == 1 and hinted.get_column("hinted")[0]):
        out["hinted_vs_unhinted"] = {
            ("hinted" if h else "unhinted"): {"rollouts": r, "mean_correct": rounded(m)} for h, r, m in hinted.sort("hinted").iter_rows()
        }
    if cut is not None:
        out["cut_at_response_limit"] = cut
    return out


def summarize_collapsed(df: pl.DataFrame) -> dict[str, Any]:
    streak = df.group_by("streak").len().sort("streak")
    return {
        "problems": df.height,
        "rounds": sorted(df.get_column("round").unique().to_list()),
        "domains": dict(sorted(df.group_by("domain").len().iter_rows())),
        "n_rollouts": distribution(df.get_column("n_rollouts")),
        "failed_kept": distribution(df.get_column("failed").list.len()),
        "streak": {str(k): v for k, v in streak.iter_rows()},
        "with_previous_hints": int((df.get_column("previous_hints").list.len() > 0).sum()),
    }


def summarize_hints(df: pl.DataFrame) -> dict[str, Any]:
    status = dict(df.group_by("status").len().iter_rows())
    violations = (
        df.select(pl.col("violations").explode().drop_nulls()).group_by("violations").len().sort(["len", "violations"], descending=[True, False])
    )
    keywords = (
        df.select(pl.col("keywords").explode().drop_nulls().str.strip_chars().str.to_lowercase().alias("keyword"))
        .filter(pl.col("keyword") != "")
        .group_by("keyword")
        .len()
        .sort(["len", "keyword"], descending=[True, False])
        .head(10)
    )
    rank = pl.col("status").replace_strict({s: i for i, s in enumerate(STATUS_ORDER)}, default=len(STATUS_ORDER), return_dtype=pl.Int32)
    ordered = df.sort(rank, "problem_id")
    # One sample per status first (accepted, repaired, fallback), then fill up to three.
    firsts = ordered.unique(subset="status", keep="first", maintain_order=True)
    rest = ordered.join(firsts.select("problem_id", "round"), on=["problem_id", "round"], how="anti")
    samples = pl.concat([firsts, rest]).head(3)

    def used(col: str) -> dict[str, Any]:
        s = df.get_column(col)
        return {"total": int(s.sum()), "mean": rounded(s.mean()), "max": int(s.max()) if s.len() else 0, "problems_using": int((s > 0).sum())}

    out: dict[str, Any] = {
        "problems": df.get_column("problem_id").n_unique(),
        "hints": df.height,
        "rounds": sorted(df.get_column("round").unique().to_list()),
        "status": {s: int(status.get(s, 0)) for s in STATUS_ORDER} | {k: v for k, v in status.items() if k not in STATUS_ORDER},
        "violations": dict(violations.iter_rows()),
        "retries": used("retries") if df.height else {},
        "refines": used("refines") if df.height else {},
        "hint_chars": distribution(df.get_column("hint").str.len_chars()),
        "hint_words": distribution(df.get_column("hint").str.split(" ").list.len()),
        "judge_score": distribution(df.get_column("judge_score")),
        "top_keywords": [{"keyword": k, "count": n} for k, n in keywords.iter_rows()],
        "samples": [
            {"problem_id": r["problem_id"], "status": r["status"], "keywords": r["keywords"], "hint": r["hint"]}
            for r in samples.select("problem_id", "status", "keywords", "hint").iter_rows(named=True)
        ],
    }
    models = df.get_column("model").unique().sort().to_list()
    out["models"] = models
    return out


def hint_run_extras(folder: Path) -> dict[str, Any]:
    """What the hint stage's stats.json adds to a hints summary: the judge check, policy vouching."""
    try:
        stats = json.loads((folder / "stats.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out: dict[str, Any] = {}
    jc = stats.get("judge_check") if isinstance(stats, dict) else None
    if isinstance(jc, dict):
        out["judge_check"] = {k: jc.get(k) for k in ("status", "action", "balanced_accuracy", "threshold",
                                                      "good_accepted_rate", "bad_rejected_rate", "items", "reason") if k in jc}
        if isinstance(jc.get("bad"), dict) and isinstance(jc["bad"].get("by_kind"), dict):
            out["judge_check"]["bad_rejected_by_kind"] = {k: f"{v.get('rejected')}/{v.get('n')}" for k, v in jc["bad"]["by_kind"].items()}
    if isinstance(stats, dict) and isinstance(stats.get("vouch_per_rescued"), dict):
        out["vouch"] = stats["vouch_per_rescued"]
    return out


def judge_cell(extras: dict[str, Any]) -> str | None:
    jc = extras.get("judge_check")
    if not jc:
        return None
    if jc.get("status") == "unchecked":
        return "unchecked"
    return f"{jc.get('status')} {jc.get('balanced_accuracy')}" + (" -> rules" if jc.get("action") == "rules_only" else "")


def summarize_prompts(path: Path) -> dict[str, Any]:
    """Rows, hinted share and shards of a prompts folder; with its manifest.json, the shards it lists (each checked
    against its sha256) and only those: a Parquet file there that the manifest does not list is named, not counted."""
    files = parquet_files(path)
    folder = path if path.is_dir() else path.parent
    check = manifest_check(folder, files) if (folder / "manifest.json").exists() else None
    if check is not None and check["listed_files"] and path.is_dir():
        files = check["listed_files"]  # what `mentor build` wrote: an unlisted file's rows are not the build's
    lf = scan_dataset([str(f) for f in files], "prompts")
    agg = lf.select(
        pl.len().alias("rows"),
        pl.col("hint_id").is_not_null().sum().alias("hinted"),
        pl.col("problem_id").n_unique().alias("problems"),
    ).collect()
    rows, hinted, problems = agg.row(0)
    out: dict[str, Any] = {
        "rows": rows,
        "hinted_rows": hinted,
        "hinted_share": rounded(hinted / rows, 6) if rows else 0.0,
        "problems": problems,
        "rounds": sorted(lf.select(pl.col("round").unique()).collect().get_column("round").to_list()),
        "data_sources": dict(sorted(lf.group_by("data_source").len().collect().iter_rows())),
        "abilities": dict(sorted(lf.group_by("ability").len().collect().iter_rows())),
        "shards": [{"file": f.name, "rows": pq.ParquetFile(f).metadata.num_rows, "bytes": f.stat().st_size} for f in files],
    }
    if check is not None:
        check.pop("listed_files")
    out["manifest"] = check
    return out


def manifest_check(folder: Path, found: list[Path]) -> dict[str, Any]:
    """A prompts folder's manifest.json against its files: verified only when every listed shard is there with its
    sha256 and no other Parquet file is (`found`: the folder's Parquet files). A damaged manifest is reported, not raised."""
    manifest = folder / "manifest.json"
    out: dict[str, Any] = {"rows": None, "shards": 0, "verified": False, "mismatched": [], "unlisted": [], "listed_files": []}
    try:
        m = read_json(manifest)
    except (ValueError, OSError) as exc:
        return out | {"problem": f"{manifest}: not readable JSON ({exc}); rebuild with `mentor build`"}
    if not isinstance(m, dict) or not isinstance(m.get("shards", []), list):
        what = type(m).__name__ if not isinstance(m, dict) else f"shards is a {type(m.get('shards')).__name__}"
        return out | {"problem": f"{manifest}: not a mentor manifest (a JSON object with a shards list; found: {what}); "
                                 "rebuild with `mentor build`"}
    shards, malformed, listed = m.get("shards", []), [], []
    for i, s in enumerate(shards):
        name = s.get("path") if isinstance(s, dict) else None
        if not isinstance(name, str) or not name or Path(name).name != name:
            malformed.append(f"shards[{i}]: no shard file name (path)")
            continue
        f = folder / name
        listed.append(f)
        if not f.is_file() or sha256_file(f) != s.get("sha256"):
            out["mismatched"].append(name)
    if not malformed:  # a damaged manifest cannot say which shards are the build's: every one is counted then
        names = {f.name for f in listed}
        out["unlisted"] = sorted(f.name for f in found if f.parent.resolve() == folder.resolve() and f.name not in names)
        out["listed_files"] = [f for f in listed if f.is_file()]
    out |= {"rows": m.get("rows") if isinstance(m.get("rows"), int) else None, "shards": len(shards),
            "verified": not (out["mismatched"] or out["unlisted"] or malformed)}
    if malformed:
        out["problem"] = f"{manifest}: " + "; ".join(malformed) + "; rebuild with `mentor build`"
    elif out["unlisted"]:
        out["problem"] = (f"{', '.join(out['unlisted'])}: in the folder but not in its manifest (not `mentor build`'s "
                          "output, or left by another build): not counted; move it out, or rebuild")
    return out


def summarize_problems(path: Path) -> dict[str, Any]:
    df = _scan(path, "problems").collect()
    return {
        "problems": df.height,
        "distinct_ids": df.get_column("problem_id").n_unique(),
        "domains": dict(sorted(df.group_by("domain").len().iter_rows())),
        "data_sources": dict(sorted(df.group_by("data_source").len().iter_rows())),
        "problem_chars": distribution(df.get_column("problem").str.len_chars()),
    }


# --------------------------------------------------------------------------- rescue (written by `mentor rescue`)


def rescue_files(path: Path) -> dict[str, Path]:
    """A rescue folder's ``rescue.parquet`` and its stats: ``stats.json`` beside it (``rescue.json`` before 2026-12)."""
    folder = path if path.is_dir() else path.parent
    found = {"parquet": folder / "rescue.parquet"} if (folder / "rescue.parquet").exists() else {}
    stats = next((p for p in (folder / "stats.json", folder / "rescue.json") if p.exists()), None)
    if stats is not None and (found or stats.name == "rescue.json"):
        found["json"] = stats
    return found


def _flatten_rates(obj: Any, prefix: str = "") -> dict[str, float]:
    """Numbers in a rescue's stats.json whose key names a rate (rescue_rate, hinted/unhinted ...)."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                out.update(_flatten_rates(v, key + "."))
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and "rate" in key.lower():
                out[key] = float(v)
    return out


def _rate_from_frame(df: pl.DataFrame) -> dict[str, Any]:
    """Rescue rate hinted vs unhinted from a per-problem table, in the layouts we can recognise."""
    cols = set(df.columns)

    def positive(col: str) -> pl.Expr:
        dtype = df.schema[col]
        return pl.col(col) if dtype == pl.Boolean else pl.col(col).cast(pl.Float64) > 0

    for hinted, unhinted in (
        ("rescued_hinted", "rescued_unhinted"),
        ("hinted_rescued", "unhinted_rescued"),
        ("hinted_correct", "unhinted_correct"),
        ("n_correct_hinted", "n_correct_unhinted"),
        ("correct_hinted", "correct_unhinted"),
    ):
        if {hinted, unhinted} <= cols:
            rates = df.select(positive(hinted).mean().alias("h"), positive(unhinted).mean().alias("u")).row(0)
            return {"problems": df.height, "rescue_rate_hinted": rounded(rates[0], 6), "rescue_rate_unhinted": rounded(rates[1], 6)}
    arm = next((c for c in ("variant", "arm", "condition", "hinted") if c in cols), None)
    value = next((c for c in ("rescued", "n_correct", "any_correct", "correct") if c in cols), None)
    if arm and value:
        key = pl.col(arm)
        if df.schema[arm] != pl.Boolean:
            key = pl.col(arm).cast(pl.String).str.to_lowercase().is_in(["hinted", "hint", "with_hint", "true", "1"])
        per = (
            df.group_by("problem_id", key.alias("_h")).agg(positive(value).any().alias("_ok"))
            if "problem_id" in cols
            else df.select(key.alias("_h"), positive(value).alias("_ok"))
        )
        rates = dict(per.group_by("_h").agg(pl.col("_ok").mean()).iter_rows())
        return {
            "problems": per.filter(pl.col("_h")).height,
            "rescue_rate_hinted": rounded(rates.get(True), 6),
            "rescue_rate_unhinted": rounded(rates.get(False), 6),
        }
    return {}


RESCUE_JSON_KEYS = (
    "problems", "collapsed", "skipped_no_hint", "k", "rescued_hinted", "rescued_unhinted", "rescue_rate_hinted",
    "rescue_rate_unhinted", "lift", "mean_correct_hinted", "mean_correct_unhinted", "model",
)


def summarize_rescue(path: Path) -> dict[str, Any]:
    """The rescue's stats.json totals (as `mentor rescue` writes them) and rates recomputed from rescue.parquet."""
    files = rescue_files(path)
    out: dict[str, Any] = {"files": sorted(p.name for p in files.values())}
    obj: Any = None
    df: pl.DataFrame | None = None
    if "json" in files:
        try:
            obj = read_json(files["json"])
        except (ValueError, OSError) as exc:
            raise DataError(f"{files['json']}: not readable JSON ({exc}); re-run mentor rescue") from exc
        if isinstance(obj, dict):
            out |= {k: rounded(obj[k], 6) for k in RESCUE_JSON_KEYS if k in obj}
        for k, v in _flatten_rates(obj).items():  # other layouts: any "...rate..." number naming hinted/unhinted
            low = k.lower()
            if "unhinted" in low or "without" in low or "no_hint" in low:
                out.setdefault("rescue_rate_unhinted", rounded(v, 6))
            elif "hinted" in low or "with_hint" in low:
                out.setdefault("rescue_rate_hinted", rounded(v, 6))
    if "parquet" in files:
        df = pl.read_parquet(files["parquet"])
        out["rows"] = df.height
        from_rows = _rate_from_frame(df)
        for k, v in from_rows.items():
            out.setdefault(k, v)
        if from_rows and "json" in files:
            # The per-problem table and the totals should agree; say so when they do not.
            out["consistent"] = all(
                out.get(k) is None or from_rows.get(k) is None or abs(out[k] - from_rows[k]) < 1e-6
                for k in ("rescue_rate_hinted", "rescue_rate_unhinted")
            )
    arms = rescue_arms(obj if "json" in files else None, df if "parquet" in files else None)
    if arms:
        out["arms"] = arms
    if "rescue_rate_hinted" not in out and not arms:
        out["note"] = "no hinted/unhinted rescue rate recognised in these files"
    return out


ARM_KEYS = ("rescued", "rescue_rate", "rescue_rate_ci95", "mean_correct", "placement", "answer_template", "skipped_no_hint")


def rescue_arms(stats: Any, df: pl.DataFrame | None) -> list[dict[str, Any]]:
    """Every arm of a rescue (``unhinted`` and each ``--hints`` / ``--arm``), one row each: its counts from stats.json's
    ``arms``, else from rescue.parquet's ``rescued_<arm>`` columns (and, with both, whether they agree)."""
    arms: dict[str, dict[str, Any]] = {}
    if isinstance(stats, dict) and isinstance(stats.get("arms"), dict):
        for name, a in stats["arms"].items():
            if isinstance(a, dict):
                arms[str(name)] = {k: rounded(a[k], 6) if not isinstance(a[k], list) else [rounded(x, 6) for x in a[k]]
                                   for k in ARM_KEYS if k in a}
    if df is not None and df.height:
        for col in df.columns:
            if not col.startswith("rescued_") or df.schema[col] != pl.Boolean:
                continue
            name, rescued = col[len("rescued_"):], int(df[col].sum())
            row = arms.setdefault(name, {"rescued": rescued, "rescue_rate": rounded(rescued / df.height, 6)})
            if "rescued" in row and row["rescued"] != rescued:
                row["consistent"] = False
    return [{"arm": name} | row for name, row in arms.items()]


__all__ = [
    "STATUS_ORDER", "distribution", "hint_run_extras", "judge_cell", "manifest_check", "parquet_files", "rescue_arms", "per_problem_round", "rescue_files",
    "rounded", "summarize_collapsed", "summarize_hints", "summarize_problems", "summarize_prompts", "summarize_rescue",
    "summarize_rollouts",
]
