"""`mentor inspect`: what a researcher wants to see at a glance, computed with polars.

`inspect_path(PATH)` tells what PATH is from its layout and columns (`detect`)
and returns a JSON-able summary: one of the per-dataset summaries of
`mentor.workflows.report_datasets` (rollouts, collapsed, hints, prompts,
problems, rescue), or, for a run directory
``runs/<name>/round-NNN/{rollouts,collapsed,hints,prompts,train,rescue}/``, one
row per round with those summaries (`summarize_run`).

`problem_history(PATH, ID)` follows one problem across rounds. Drawing and the
terminal form are in `mentor.workflows.report_render` (`plot`, `render_table`,
`to_json`).

Definitions. A problem (in one round) is *collapsed* when every rollout's raw
correctness is 0 (max ``correct`` <= 0), *all-correct* when every rollout's
correctness is 1. A hinted collapsed problem of round r is *rescued* when it has
at least one correct rollout (``correct`` > 0) in round r+1.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import read_parquet_schema, scan_dataset
from mentor.stages import stage_dirs
from mentor.workflows.report_datasets import (
    STATUS_ORDER,
    hint_run_extras,
    judge_cell,
    parquet_files,
    per_problem_round,
    rescue_files,
    rounded,
    summarize_collapsed,
    summarize_hints,
    summarize_problems,
    summarize_prompts,
    summarize_rescue,
    summarize_rollouts,
)

ROUND_RE = re.compile(r"^round-(\d+)$")
KINDS = ("run", "rollouts", "collapsed", "hints", "prompts", "problems", "rescue")


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


def detect(path: str | Path) -> str:
    """What `path` is: one of KINDS. `DataError`/`ConfigError` when it cannot tell."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    if path.is_dir():
        if round_dirs(path) or (ROUND_RE.match(path.name) and any(d.is_dir() for d in path.iterdir())):
            return "run"
        if rescue_files(path) and not any(p.name != "rescue.parquet" for p in path.glob("*.parquet")):
            return "rescue"
    elif path.name.startswith("rescue.") and path.suffix in (".parquet", ".json"):
        return "rescue"
    files = parquet_files(path)
    names = set(read_parquet_schema(files[0]).names)
    kind = kind_of_columns(names)
    if kind is None:
        raise DataError(
            f"{files[0]}: cannot tell which mentor dataset this is from its columns "
            f"({', '.join(sorted(names)[:12])}); inspect reads rollouts, collapsed, hints, prompts, problems, "
            "rescue outputs or a run directory (runs/<name>/round-NNN/...)"
        )
    return kind


# --------------------------------------------------------------------------- run directories


# A round folder holds each dataset in the folder named after it (rollouts/, collapsed/,
# hints/, prompts/: each round stage's ``round_dir``, `mentor.stages.stage_dirs`); any other folder
# holding the dataset is the last resort (never rescue/, whose rollouts/ are the rescue
# re-rolls, nor another stage's folder).


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
    known = {*stage_dirs().values(), "rescue"}
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
                "collapsed_cut_share": (s.get("cut_at_response_limit") or {}).get("collapsed_cut_share"),
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
            row |= {"hints": hs["hints"]} | {s: hs["status"].get(s, 0) for s in STATUS_ORDER} | {"judge_check": judge_cell(extras)}
            hinted_ids = hdf.get_column("problem_id").unique()
            collapsed_hinted[r] = hinted_ids if collapsed_ids is None else hinted_ids.filter(hinted_ids.is_in(collapsed_ids.implode()))
        folder, files = _round_dataset(d, "prompts")
        if files:
            ps = summarize_prompts(folder)
            det["prompts"] = ps
            row |= {"prompts": ps["rows"], "hinted_share": ps["hinted_share"]}
        if (d / "rescue").is_dir() and rescue_files(d / "rescue"):
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
            row["rescued_next_rate"] = rounded(rescued / nxt.height, 6) if nxt.height else None
    columns = [
        "round", "problems", "rollouts", "mean_correct", "collapse_rate", "collapsed_cut_share", "all_correct_rate", "collapsed",
        "hints",
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
                    "correct": [rounded(x) for x in c.to_list()],
                    "mean_correct": rounded(c.mean()),
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
        files = rescue_files(path)
        if "parquet" not in files:
            raise DataError(f"{path}: no rescue.parquet with per-problem rows")
        df = pl.read_parquet(files["parquet"])
    else:
        df = scan_dataset([str(f) for f in parquet_files(path)], kind).collect()
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
                {"round": r, "correct": [rounded(x) for x in c], "any_correct": any(x > 0 for x in c), "hint_ids": sorted(h)}
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
        body = summarize_rollouts(scan_dataset([str(f) for f in parquet_files(path)], "rollouts"))
    elif kind == "collapsed":
        body = summarize_collapsed(scan_dataset([str(f) for f in parquet_files(path)], "collapsed").collect())
    elif kind == "hints":
        body = summarize_hints(scan_dataset([str(f) for f in parquet_files(path)], "hints").collect())
        body |= hint_run_extras(path if path.is_dir() else path.parent)
    elif kind == "prompts":
        body = summarize_prompts(path)
    elif kind == "problems":
        body = summarize_problems(path)
    else:
        body = summarize_rescue(path)
    return {"kind": kind, "path": str(path)} | body


__all__ = ["KINDS", "detect", "inspect_path", "kind_of_columns", "problem_history", "round_dirs", "summarize_run"]
