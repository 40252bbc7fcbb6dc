"""The report's two outputs besides JSON-able dicts: a PNG per round and the terminal table.

`plot(summary, OUT)` draws collapse rate and hint statuses per round;
`render_table(summary)` is the terminal form; `to_json(obj)` is valid JSON
(NaN/inf as null). The summaries come from `mentor.workflows.report`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.io import atomic_path
from mentor.workflows.report_datasets import STATUS_ORDER, rounded


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
        import matplotlib  # optional (the plot extra) and slow to import

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # after use("Agg"), which must come first
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
        return rounded(obj, 6)
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


__all__ = ["plot", "plot_rows", "render_table", "to_json"]
