"""Inspect: what a researcher wants to see at a glance, computed with polars.

`inspect_path(PATH)` tells what PATH is from its layout and columns and
returns a JSON-able summary:

- rollouts:  problems, rollouts per problem, collapse rate, all-correct rate,
             mean correctness by round (and hinted vs unhinted when hints were used)
- collapsed: problems, streaks, previous hints, failed responses kept
- hints:     status counts, violations by name, retries/refines used, hint
             length distribution, most common keywords, three sample hints
- prompts:   rows, hinted share, shard sizes, manifest check
- rescue:    rescue rate hinted vs unhinted (outputs of `mentor rescue`)
- run:       a run directory ``runs/<name>/round-NNN/{rollouts,collapsed,hints,prompts,train,rescue}/``:
             one row per round with the above

`problem_history(PATH, ID)` follows one problem across rounds; `plot(summary, OUT)`
draws collapse rate and hint statuses per round; `render_table(summary)` is the
terminal form.

Definitions. A problem (in one round) is *collapsed* when every rollout's raw
correctness is 0 (max ``correct`` <= 0), *all-correct* when every rollout's
correctness is 1. A hinted collapsed problem of round r is *rescued* when it has
at least one correct rollout (``correct`` > 0) in round r+1.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.io import atomic_path, read_json, read_parquet_schema, resolve_inputs, scan_dataset, sha256_file

log = logging.getLogger(__name__)

ROUND_RE = re.compile(r"^round-(\d+)$")
KINDS = ("run", "rollouts", "collapsed", "hints", "prompts", "problems", "rescue")
STATUS_ORDER = ("accepted", "repaired", "fallback")


# --------------------------------------------------------------------------- detection


def kind_of_columns(names: set[str]) -> str | None:
    """Which mentor dataset a set of column names is (None if none)."""
    if {"prompt", "label", "reward_model", "extra_info"} <= names:
        return "prompts"
    if {"hint", "hint_id", "status"} <= names:
        return "hints"
    if {"n_rollouts", "failed", "streak"} <= names:
        return "collapsed"
    if {"sample_idx", "response", "correct"} <= names:
        return "rollouts"
    if {"problem", "label", "data_source", "problem_id"} <= names:
        return "problems"
    return None


def round_dirs(run: Path) -> list[tuple[int, Path]]:
    out = [(int(m.group(1)), d) for d in run.iterdir() if d.is_dir() and (m := ROUND_RE.match(d.name))]
    return sorted(out)


def _parquet_files(path: Path) -> list[Path]:
    """The Parquet files of a file/folder/glob (temporary files, _done markers and _shards skipped)."""
    return resolve_inputs([str(path)])


def detect(path: str | Path) -> str:
    """What `path` is: one of KINDS. `DataError`/`ConfigError` when it cannot tell."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    if path.is_dir():
        if round_dirs(path) or (ROUND_RE.match(path.name) and any(d.is_dir() for d in path.iterdir())):
            return "run"
        if _rescue_files(path) and not any(p.name != "rescue.parquet" for p in path.glob("*.parquet")):
            return "rescue"
    elif path.name.startswith("rescue.") and path.suffix in (".parquet", ".json"):
        return "rescue"
    files = _parquet_files(path)
    names = set(read_parquet_schema(files[0]).names)
    kind = kind_of_columns(names)
    if kind is None:
        raise DataError(
            f"{files[0]}: cannot tell which mentor dataset this is from its columns "
            f"({', '.join(sorted(names)[:12])}); inspect reads rollouts, collapsed, hints, prompts, problems, "
            "rescue outputs or a run directory (runs/<name>/round-NNN/...)"
        )
    return kind


# --------------------------------------------------------------------------- helpers


def _r(x: Any, nd: int = 4) -> Any:
    """Round floats for display; NaN/inf become None so the JSON stays valid."""
    if x is None:
        return None
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return None
        return round(x, nd)
    return x


def _dist(s: pl.Series) -> dict[str, Any]:
    s = s.drop_nulls()
    if s.len() == 0:
        return {"n": 0}
    return {
        "n": s.len(),
        "min": _r(s.min()),
        "p25": _r(s.quantile(0.25, "nearest")),
        "p50": _r(s.quantile(0.5, "nearest")),
        "mean": _r(s.mean()),
        "p90": _r(s.quantile(0.9, "nearest")),
        "max": _r(s.max()),
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


def summarize_rollouts(lf: pl.LazyFrame) -> dict[str, Any]:
    lf = lf.filter(pl.col("correct").is_not_null() & pl.col("correct").is_not_nan())
    per = per_problem_round(lf).collect()
    if per.height == 0:
        return {"rollouts": 0, "problems": 0}
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
        "rollouts_per_problem": {"min": int(n.min()), "mean": _r(n.mean()), "max": int(n.max())},
        "mean_correct": _r(float((per.get_column("mean_c") * n).sum() / n.sum())),
        "collapsed": collapsed,
        "collapse_rate": _r(collapsed / per.height, 6),
        "all_correct": all_correct,
        "all_correct_rate": _r(all_correct / per.height, 6),
        "by_round": [{k: _r(v) for k, v in row.items()} for row in by_round.iter_rows(named=True)],
    }
    hinted = (
        lf.group_by(pl.col("hint_id").is_not_null().alias("hinted"))
        .agg(pl.len().alias("rollouts"), pl.col("correct").mean().alias("mean_correct"))
        .collect()
    )
    if hinted.height > 1 or (hinted.height == 1 and hinted.get_column("hinted")[0]):
        out["hinted_vs_unhinted"] = {
            ("hinted" if h else "unhinted"): {"rollouts": r, "mean_correct": _r(m)} for h, r, m in hinted.sort("hinted").iter_rows()
        }
    return out


def summarize_collapsed(df: pl.DataFrame) -> dict[str, Any]:
    streak = df.group_by("streak").len().sort("streak")
    return {
        "problems": df.height,
        "rounds": sorted(df.get_column("round").unique().to_list()),
        "domains": dict(sorted(df.group_by("domain").len().iter_rows())),
        "n_rollouts": _dist(df.get_column("n_rollouts")),
        "failed_kept": _dist(df.get_column("failed").list.len()),
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
        return {"total": int(s.sum()), "mean": _r(s.mean()), "max": int(s.max()) if s.len() else 0, "problems_using": int((s > 0).sum())}

    out: dict[str, Any] = {
        "problems": df.get_column("problem_id").n_unique(),
        "hints": df.height,
        "rounds": sorted(df.get_column("round").unique().to_list()),
        "status": {s: int(status.get(s, 0)) for s in STATUS_ORDER} | {k: v for k, v in status.items() if k not in STATUS_ORDER},
        "violations": dict(violations.iter_rows()),
        "retries": used("retries") if df.height else {},
        "refines": used("refines") if df.height else {},
        "hint_chars": _dist(df.get_column("hint").str.len_chars()),
        "hint_words": _dist(df.get_column("hint").str.split(" ").list.len()),
        "judge_score": _dist(df.get_column("judge_score")),
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


def _judge_cell(extras: dict[str, Any]) -> str | None:
    jc = extras.get("judge_check")
    if not jc:
        return None
    if jc.get("status") == "unchecked":
        return "unchecked"
    return f"{jc.get('status')} {jc.get('balanced_accuracy')}" + (" -> rules" if jc.get("action") == "rules_only" else "")


def summarize_prompts(path: Path) -> dict[str, Any]:
    files = _parquet_files(path)
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
        "hinted_share": _r(hinted / rows, 6) if rows else 0.0,
        "problems": problems,
        "rounds": sorted(lf.select(pl.col("round").unique()).collect().get_column("round").to_list()),
        "data_sources": dict(sorted(lf.group_by("data_source").len().collect().iter_rows())),
        "abilities": dict(sorted(lf.group_by("ability").len().collect().iter_rows())),
        "shards": [{"file": f.name, "rows": pq.ParquetFile(f).metadata.num_rows, "bytes": f.stat().st_size} for f in files],
    }
    folder = path if path.is_dir() else path.parent
    manifest = folder / "manifest.json"
    if manifest.exists():
        m = read_json(manifest)
        bad = []
        for s in m.get("shards", []):
            f = folder / s["path"]
            if not f.exists() or sha256_file(f) != s.get("sha256"):
                bad.append(s["path"])
        out["manifest"] = {"rows": m.get("rows"), "shards": len(m.get("shards", [])), "verified": not bad, "mismatched": bad}
    else:
        out["manifest"] = None
    return out


def summarize_problems(path: Path) -> dict[str, Any]:
    df = _scan(path, "problems").collect()
    return {
        "problems": df.height,
        "distinct_ids": df.get_column("problem_id").n_unique(),
        "domains": dict(sorted(df.group_by("domain").len().iter_rows())),
        "data_sources": dict(sorted(df.group_by("data_source").len().iter_rows())),
        "problem_chars": _dist(df.get_column("problem").str.len_chars()),
    }


# --------------------------------------------------------------------------- rescue (written by `mentor rescue`)


def _rescue_files(path: Path) -> dict[str, Path]:
    folder = path if path.is_dir() else path.parent
    return {n: folder / f"rescue.{n}" for n in ("parquet", "json") if (folder / f"rescue.{n}").exists()}


def _flatten_rates(obj: Any, prefix: str = "") -> dict[str, float]:
    """Numbers in rescue.json whose key names a rate (rescue_rate, hinted/unhinted ...)."""
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
            return {"problems": df.height, "rescue_rate_hinted": _r(rates[0], 6), "rescue_rate_unhinted": _r(rates[1], 6)}
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
            "rescue_rate_hinted": _r(rates.get(True), 6),
            "rescue_rate_unhinted": _r(rates.get(False), 6),
        }
    return {}


RESCUE_JSON_KEYS = (
    "problems", "collapsed", "skipped_no_hint", "k", "rescued_hinted", "rescued_unhinted", "rescue_rate_hinted",
    "rescue_rate_unhinted", "lift", "mean_correct_hinted", "mean_correct_unhinted", "model",
)


def summarize_rescue(path: Path) -> dict[str, Any]:
    """rescue.json's totals (as `mentor rescue` writes them) and rates recomputed from rescue.parquet."""
    files = _rescue_files(path)
    out: dict[str, Any] = {"files": sorted(p.name for p in files.values())}
    if "json" in files:
        try:
            obj = read_json(files["json"])
        except (ValueError, OSError) as exc:
            raise DataError(f"{files['json']}: not readable JSON ({exc}); re-run mentor rescue") from exc
        if isinstance(obj, dict):
            out |= {k: _r(obj[k], 6) for k in RESCUE_JSON_KEYS if k in obj}
        for k, v in _flatten_rates(obj).items():  # other layouts: any "...rate..." number naming hinted/unhinted
            low = k.lower()
            if "unhinted" in low or "without" in low or "no_hint" in low:
                out.setdefault("rescue_rate_unhinted", _r(v, 6))
            elif "hinted" in low or "with_hint" in low:
                out.setdefault("rescue_rate_hinted", _r(v, 6))
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
    if "rescue_rate_hinted" not in out:
        out["note"] = "no hinted/unhinted rescue rate recognised in these files"
    return out


# --------------------------------------------------------------------------- run directories


# A round folder holds each dataset in the folder named after it (rollouts/, collapsed/,
# hints/, prompts/: `rundir.STAGE_DIRS`); any other folder holding the dataset is the last
# resort (never rescue/, whose rollouts/ are the rescue re-rolls, nor train/).
ROUND_DATASETS = ("rollouts", "collapsed", "hints", "prompts")


def _files_of(folder: Path, dataset: str) -> list[Path]:
    if not folder.is_dir():
        return []
    try:
        files = resolve_inputs([str(folder)])
    except ConfigError:
        return []
    return [f for f in files if kind_of_columns(set(read_parquet_schema(f).names)) == dataset]


def _round_dataset(round_dir: Path, dataset: str) -> tuple[Path | None, list[Path]]:
    """(folder, parquet files) of `dataset` in one round folder; (None, []) when absent."""
    files = _files_of(round_dir / dataset, dataset)
    if files:
        return round_dir / dataset, files
    known = {*ROUND_DATASETS, "rescue", "train"}
    for child in sorted(round_dir.iterdir()):
        if child.is_dir() and child.name not in known and not child.name.startswith(("_", ".")):
            files = _files_of(child, dataset)
            if files:
                return child, files
    return None, []


def _run_rounds(path: Path) -> list[tuple[int, Path]]:
    if ROUND_RE.match(path.name) and not round_dirs(path):
        return [(int(ROUND_RE.match(path.name).group(1)), path)]
    return round_dirs(path)


def summarize_run(path: Path) -> dict[str, Any]:
    rounds = _run_rounds(path)
    rows: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    collapsed_hinted: dict[int, pl.Series] = {}
    any_correct: dict[int, pl.DataFrame] = {}
    for r, d in rounds:
        row: dict[str, Any] = {"round": r}
        det: dict[str, Any] = {}
        _, files = _round_dataset(d, "rollouts")
        if files:
            lf = scan_dataset([str(f) for f in files], "rollouts")
            s = summarize_rollouts(lf)
            det["rollouts"] = s
            row |= {
                "problems": s.get("problems"),
                "rollouts": s.get("rollouts"),
                "mean_correct": s.get("mean_correct"),
                "collapse_rate": s.get("collapse_rate"),
                "all_correct_rate": s.get("all_correct_rate"),
            }
            any_correct[r] = per_problem_round(lf).group_by("problem_id").agg((pl.col("max_c") > 0).any().alias("ok")).collect()
        _, files = _round_dataset(d, "collapsed")
        collapsed_ids = None
        if files:
            cdf = scan_dataset([str(f) for f in files], "collapsed").collect()
            det["collapsed"] = summarize_collapsed(cdf)
            row["collapsed"] = cdf.height
            collapsed_ids = cdf.get_column("problem_id")
        _, files = _round_dataset(d, "hints")
        if files:
            hdf = scan_dataset([str(f) for f in files], "hints").collect()
            hs = summarize_hints(hdf)
            extras = hint_run_extras(Path(files[0]).parent)
            det["hints"] = hs | extras
            row |= {"hints": hs["hints"]} | {s: hs["status"].get(s, 0) for s in STATUS_ORDER} | {"judge_check": _judge_cell(extras)}
            hinted_ids = hdf.get_column("problem_id").unique()
            collapsed_hinted[r] = hinted_ids if collapsed_ids is None else hinted_ids.filter(hinted_ids.is_in(collapsed_ids.implode()))
        folder, files = _round_dataset(d, "prompts")
        if files:
            ps = summarize_prompts(folder)
            det["prompts"] = ps
            row |= {"prompts": ps["rows"], "hinted_share": ps["hinted_share"]}
        if (d / "rescue").is_dir() and _rescue_files(d / "rescue"):
            rs = summarize_rescue(d / "rescue")
            det["rescue"] = rs
            row |= {"rescue_rate_hinted": rs.get("rescue_rate_hinted"), "rescue_rate_unhinted": rs.get("rescue_rate_unhinted")}
        rows.append(row)
        details[str(r)] = det
    # Rescued in the next round: collapsed + hinted in r, a correct rollout in r+1.
    for row in rows:
        r = row["round"]
        if r in collapsed_hinted and (r + 1) in any_correct:
            ids = collapsed_hinted[r]
            nxt = any_correct[r + 1].filter(pl.col("problem_id").is_in(ids.implode()))
            rescued = int(nxt.get_column("ok").sum())
            row["rescued_next"] = rescued
            row["rescued_next_rate"] = _r(rescued / nxt.height, 6) if nxt.height else None
    columns = [
        "round", "problems", "rollouts", "mean_correct", "collapse_rate", "all_correct_rate", "collapsed", "hints",
        *STATUS_ORDER, "judge_check", "prompts", "hinted_share", "rescued_next", "rescued_next_rate", "rescue_rate_hinted", "rescue_rate_unhinted",
    ]
    table = [{c: row.get(c) for c in columns} for row in rows]
    out: dict[str, Any] = {"rounds": table}
    base = path / "base-prompts"  # the runner's unhinted round-0 prompts, when it built them
    if base.is_dir() and _files_of(base, "prompts"):
        ps = summarize_prompts(base)
        out["base_prompts"] = {k: ps[k] for k in ("rows", "problems", "rounds")}
    out["details"] = details
    return out


# --------------------------------------------------------------------------- one problem


def _ids_hint(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")


def _problem_rows(round_dir: Path, dataset: str, problem_id: str) -> pl.DataFrame | None:
    """One problem's rows of a round's dataset; None when the round has no such dataset."""
    _, files = _round_dataset(round_dir, dataset)
    if not files:
        return None
    return scan_dataset([str(f) for f in files], dataset).filter(pl.col("problem_id") == problem_id).collect()


def problem_history(path: str | Path, problem_id: str) -> dict[str, Any]:
    """One problem across rounds (run directory), or its rows in a single dataset."""
    path = Path(path)
    kind = detect(path)
    if kind != "run":
        return _problem_in_dataset(path, kind, problem_id)
    history: list[dict[str, Any]] = []
    seen = False
    for r, d in _run_rounds(path):
        entry: dict[str, Any] = {"round": r}
        ro = _problem_rows(d, "rollouts", problem_id)
        if ro is not None:
            ro = ro.sort("round", "sample_idx")
            if ro.height:
                seen = True
                c = ro.get_column("correct")
                entry["rollouts"] = {
                    "n": ro.height,
                    "correct": [_r(x) for x in c.to_list()],
                    "mean_correct": _r(c.mean()),
                    "any_correct": bool((c > 0).any()),
                    "hint_ids": sorted({h for h in ro.get_column("hint_id").to_list() if h}),
                }
        co = _problem_rows(d, "collapsed", problem_id)
        if co is not None:
            entry["collapsed"] = bool(co.height)
            if co.height:
                seen = True
                entry["streak"] = co.get_column("streak")[0]
                entry["previous_hints"] = co.get_column("previous_hints")[0].to_list()
        hi = _problem_rows(d, "hints", problem_id)
        if hi is not None and hi.height:
            seen = True
            h = hi.row(hi.height - 1, named=True)
            entry["hint"] = {k: h[k] for k in ("hint_id", "status", "keywords", "error", "hint", "retries", "refines", "violations")}
        pr = _problem_rows(d, "prompts", problem_id)
        if pr is not None and pr.height:
            seen = True
            entry["prompts"] = {"rows": pr.height, "hint_ids": sorted({h for h in pr.get_column("hint_id").to_list() if h})}
        rescue_pq = d / "rescue" / "rescue.parquet"
        if rescue_pq.exists():
            rdf = pl.read_parquet(rescue_pq)
            if "problem_id" in rdf.columns:
                sel = rdf.filter(pl.col("problem_id") == problem_id)
                if sel.height:
                    seen = True
                    entry["rescue_check"] = sel.drop("problem_id").row(0, named=True)
        history.append(entry)
    if not seen:
        raise DataError(f"{path}: problem {problem_id!r} appears in no round's rollouts, collapsed, hints or prompts")
    for i, entry in enumerate(history):
        nxt = history[i + 1] if i + 1 < len(history) and history[i + 1]["round"] == entry["round"] + 1 else None
        if entry.get("collapsed") and "hint" in entry:
            if nxt is not None and "rollouts" in nxt:
                entry["rescued"] = nxt["rollouts"]["any_correct"]
            else:
                entry["rescued"] = None  # no rollouts of the next round yet
    return {"problem_id": problem_id, "history": history}


def _problem_in_dataset(path: Path, kind: str, problem_id: str) -> dict[str, Any]:
    if kind == "rescue":
        files = _rescue_files(path)
        if "parquet" not in files:
            raise DataError(f"{path}: no rescue.parquet with per-problem rows")
        df = pl.read_parquet(files["parquet"])
    else:
        df = scan_dataset([str(f) for f in _parquet_files(path)], kind).collect()
    sel = df.filter(pl.col("problem_id") == problem_id)
    if sel.height == 0:
        ids = df.get_column("problem_id").unique().sort().head(3).to_list()
        raise DataError(f"{path}: problem {problem_id!r} not found ({df.height} rows; ids look like {_ids_hint(ids)})")
    if kind == "rollouts":
        by_round = sel.sort("round", "sample_idx").group_by("round", maintain_order=True).agg(
            pl.col("correct"), pl.col("hint_id").drop_nulls().unique().alias("hint_ids")
        )
        return {
            "problem_id": problem_id,
            "kind": kind,
            "history": [
                {"round": r, "correct": [_r(x) for x in c], "any_correct": any(x > 0 for x in c), "hint_ids": sorted(h)}
                for r, c, h in by_round.iter_rows()
            ],
        }
    drop = [c for c in ("trace", "failed") if c in sel.columns]
    rows = sel.drop(drop).to_dicts()
    out: dict[str, Any] = {"problem_id": problem_id, "kind": kind, "rows": rows}
    if kind == "hints":  # the latest row's path through the agents: every call, rule verdict and re-roll
        last = sel.row(sel.height - 1, named=True)
        out["trace"] = [{"agent": e["agent"], "attempt": e["attempt"], "text": e["parsed"] if e["parsed"] is not None else e["raw"],
                         "finish": e["finish_reason"], "tokens": (e["prompt_tokens"] or 0) + (e["completion_tokens"] or 0)}
                        for e in last["trace"] or []]
    return out


# --------------------------------------------------------------------------- entry points


def inspect_path(path: str | Path) -> dict[str, Any]:
    """Summary of whatever `path` is (see module docstring)."""
    path = Path(path)
    kind = detect(path)
    if kind == "run":
        body = summarize_run(path)
    elif kind == "rollouts":
        body = summarize_rollouts(scan_dataset([str(f) for f in _parquet_files(path)], "rollouts"))
    elif kind == "collapsed":
        body = summarize_collapsed(scan_dataset([str(f) for f in _parquet_files(path)], "collapsed").collect())
    elif kind == "hints":
        body = summarize_hints(scan_dataset([str(f) for f in _parquet_files(path)], "hints").collect())
        body |= hint_run_extras(path if path.is_dir() else path.parent)
    elif kind == "prompts":
        body = summarize_prompts(path)
    elif kind == "problems":
        body = summarize_problems(path)
    else:
        body = summarize_rescue(path)
    return {"kind": kind, "path": str(path)} | body


def plot_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-round rows (round, collapse_rate, accepted/repaired/fallback) from any summary that has rounds."""
    if summary.get("kind") == "run":
        return summary["rounds"]
    if summary.get("kind") == "rollouts":
        return summary.get("by_round", [])
    raise ConfigError(f"--plot needs a run directory or rollouts (got {summary.get('kind')})")


def plot(summary: dict[str, Any], out: str | Path) -> Path:
    """PNG of collapse rate and hint status counts per round (matplotlib, Agg backend)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'mentor[plot]'") from exc
    rows = plot_rows(summary)
    if not rows:
        raise DataError(f"{summary.get('path')}: no rounds to plot")
    rounds = [row["round"] for row in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("collapse_rate", "collapse rate"), ("all_correct_rate", "all-correct rate"), ("rescued_next_rate", "rescued next round")):
        ys = [row.get(key) for row in rows]
        if any(y is not None for y in ys):
            ax1.plot(rounds, [math.nan if y is None else y for y in ys], marker="o", label=label)
    ax1.set_xlabel("round")
    ax1.set_ylabel("share of problems")
    ax1.set_ylim(0, 1)
    ax1.set_xticks(rounds)
    ax1.legend(loc="best")
    ax1.set_title("collapse per round")
    bottom = [0] * len(rows)
    colours = {"accepted": "tab:green", "repaired": "tab:orange", "fallback": "tab:red"}
    drew = False
    for status in STATUS_ORDER:
        ys = [row.get(status) or 0 for row in rows]
        if any(ys):
            drew = True
        ax2.bar(rounds, ys, bottom=bottom, label=status, color=colours[status])
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax2.set_xlabel("round")
    ax2.set_ylabel("hints")
    ax2.set_xticks(rounds)
    ax2.set_title("hint status per round" if drew else "hint status per round (no hints)")
    ax2.legend(loc="best")
    fig.tight_layout()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return out


def to_json(obj: Any) -> str:
    """Valid JSON (NaN/inf -> null)."""
    return json.dumps(_clean(obj), indent=2, sort_keys=False, ensure_ascii=False, allow_nan=False, default=str)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return _r(obj, 6)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _short(v: Any, width: int = 100) -> str:
    s = v if isinstance(v, str) else json.dumps(_clean(v), ensure_ascii=False, default=str)
    s = s.replace("\n", " ")
    return s if len(s) <= width else s[: width - 1] + "…"


# Table headers on a terminal (JSON keeps the full names).
SHORT_HEADERS = {
    "mean_correct": "mean_correct",
    "collapse_rate": "collapse",
    "all_correct_rate": "all_correct",
    "hinted_share": "hinted",
    "rescued_next": "rescued_next",
    "rescued_next_rate": "rescued_next%",
    "rescue_rate_hinted": "rescue_hinted",
    "rescue_rate_unhinted": "rescue_unhinted",
}


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}".rstrip("0").rstrip(".") if not math.isnan(v) else "-"
    if isinstance(v, (str, list, dict)):
        return _short(v, 70)
    return str(v)


def render_table(obj: dict[str, Any], title: str | None = None) -> str:
    """Terminal form: scalars as aligned key/value lines, lists of records as polars tables."""
    lines: list[str] = []
    if title:
        lines.append(title)
    _render(obj, lines, indent=0)
    return "\n".join(lines)


def _render(obj: dict[str, Any], lines: list[str], indent: int) -> None:
    pad = " " * indent
    width = max((len(str(k)) for k in obj), default=0)
    for key, value in obj.items():
        if key == "details":
            continue  # per-round details: in --format json
        if key == "history" and isinstance(value, list) and all(isinstance(v, dict) and "round" in v for v in value):
            # One problem across rounds: a block per round reads better than a wide table.
            for entry in value:
                lines.append(f"{pad}round {entry['round']}:")
                _render({k: v for k, v in entry.items() if k != "round"}, lines, indent + 2)
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"{pad}{key}:")
            keys = list(dict.fromkeys(k for row in value for k in row))
            frame = pl.DataFrame(
                [{SHORT_HEADERS.get(k, k): _cell(row.get(k)) for k in keys} for row in value],
                schema={SHORT_HEADERS.get(k, k): pl.String for k in keys},
            )
            with pl.Config(
                tbl_rows=50, tbl_cols=30, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
                fmt_str_lengths=70, tbl_width_chars=1000, tbl_formatting="ASCII_MARKDOWN",
            ):
                lines.extend(pad + "  " + ln for ln in str(frame).splitlines())
        elif isinstance(value, dict) and value and any(isinstance(v, (dict, list)) for v in value.values()):
            lines.append(f"{pad}{key}:")
            _render(value, lines, indent + 2)
        elif isinstance(value, dict):
            inner = ", ".join(f"{k}={_short(v, 60)}" for k, v in value.items()) or "-"
            lines.append(f"{pad}{key:<{width}}  {inner}")
        else:
            limit = 400 if key in ("hint", "error") else 120
            lines.append(f"{pad}{key:<{width}}  {'-' if value is None else _short(value, limit)}")


__all__ = ["detect", "inspect_path", "plot", "problem_history", "render_table", "summarize_run", "to_json"]
