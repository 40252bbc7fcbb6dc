"""Build's rendering: base problems + hints -> rows in final order -> the PROMPTS columns.

`prepare_rows` does everything that needs the whole set (hint matching,
``--mode both``, the seeded order, the row index, code labels); `render_exprs`
turns its rows into the PROMPTS columns as polars expressions, applied shard by
shard. The only per-row Python is the label of *code* problems (their
reference is itself JSON to merge; code sets are small).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from mentor.pipeline.errors import DataError
from mentor.pipeline.prompts import INSTRUCTION_SEPARATOR, PLACEHOLDER_RE
from mentor.pipeline.schemas import prompt_label
from mentor.pipeline.stage import Stats

if TYPE_CHECKING:
    from mentor.stages.build import BuildConfig

# --------------------------------------------------------------------------- rows


_U64 = pl.UInt64
_M64 = 1 << 64


def shuffle_key(seed: int) -> pl.Expr:
    """splitmix64 of (row number, seed): a per-row sort key that gives a seeded permutation.

    Plain integer arithmetic (wrapping u64), so the order is the same on every
    platform and polars/NumPy version -- unlike hash() or shuffle(), whose
    streams may change between releases. splitmix64 is a bijection, so keys never tie.
    """
    z = (pl.int_range(pl.len(), dtype=_U64) + 1) * pl.lit(0x9E3779B97F4A7C15, _U64) + pl.lit(seed % _M64, _U64)
    z = (z ^ (z // pl.lit(1 << 30, _U64))) * pl.lit(0xBF58476D1CE4E5B9, _U64)
    z = (z ^ (z // pl.lit(1 << 27, _U64))) * pl.lit(0x94D049BB133111EB, _U64)
    return z ^ (z // pl.lit(1 << 31, _U64))


def prepare_rows(base: pl.DataFrame, hints: pl.DataFrame, cfg: BuildConfig, round_: int, stats: Stats,
                 where: str = "base") -> pl.DataFrame:
    """Base problems joined with their hints, in final row order, with ``index`` (and ``_code_label``)."""
    joined = base.join(hints.select("problem_id", "hint_id", "hint"), on="problem_id", how="left", maintain_order="left")
    # Base ids and hint ids are both unique here, so matched hints = hinted base rows.
    stats.hints_used = joined.get_column("hint_id").is_not_null().sum()
    stats.hints_unmatched = hints.height - stats.hints_used
    if stats.hints_unmatched:
        ids = hints.join(base.select("problem_id"), on="problem_id", how="anti").get_column("problem_id").head(5).to_list()
        msg = f"{stats.hints_unmatched} hint(s) for problem ids not in the base set {where} (e.g. {ids}); they are not used"
        if cfg.strict:
            raise DataError(msg + " (--strict); build against the base set the hints were made for")
        stats.warn(msg)
    if cfg.mode == "both":  # each hinted problem's unhinted row, then its hinted one
        joined = joined.with_row_index("_order")
        plain = joined.with_columns(pl.lit(None, pl.String).alias("hint_id"), pl.lit(None, pl.String).alias("hint"), _variant=0)
        hinted = joined.filter(pl.col("hint_id").is_not_null()).with_columns(_variant=1)
        rows = pl.concat([plain, hinted]).sort("_order", "_variant").drop("_variant", "_order")
    else:
        rows = joined
    if cfg.seed is not None:
        rows = rows.with_columns(shuffle_key(cfg.seed).alias("_key")).sort("_key").drop("_key")
    rows = rows.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("index"), pl.all())
    if (rows.get_column("domain") == "code").any():
        code = rows.filter(pl.col("domain") == "code")
        rows = rows.join(code.select("index").with_columns(_code_labels(code, round_, where)), on="index", how="left",
                         maintain_order="left")
    stats.rows = rows.height
    stats.hinted_rows = stats.hinted_problems = rows.get_column("hint_id").is_not_null().sum()
    stats.unhinted_rows = stats.rows - stats.hinted_rows
    return rows


def _code_labels(df: pl.DataFrame, round_: int, where: str) -> pl.Series:
    """`prompt_label` per code row: their reference is JSON to merge (code sets are small)."""
    out = []
    for pid, hid, ref in df.select("problem_id", "hint_id", "label").iter_rows():
        try:
            out.append(prompt_label("code", ref, pid, hid, round_))
        except (ValueError, TypeError) as exc:
            raise DataError(
                f"{where}: problem {pid}: label is not a code label JSON ({exc}); "
                "code labels are schemas.code_label(tests, entry_point, kind)"
            ) from exc
    return pl.Series("_code_label", out, dtype=pl.String)


# --------------------------------------------------------------------------- columns


def fill_template(template: str, instruction: pl.Expr) -> pl.Expr:
    """`prompts.user_message` per row: {hint} and {problem} from the columns, {instruction}
    the domain's; other braces stay literal (LaTeX is safe). Null where the hint is."""
    parts: list[pl.Expr] = []
    pos = 0
    for m in PLACEHOLDER_RE.finditer(template):
        parts += [pl.lit(template[pos : m.start()]), instruction if m.group(1) == "instruction" else pl.col(m.group(1))]
        pos = m.end()
    parts.append(pl.lit(template[pos:]))
    if "{instruction}" not in template:
        parts.append(pl.when(instruction == "").then(pl.lit("")).otherwise(pl.lit(INSTRUCTION_SEPARATOR) + instruction))
    return pl.concat_str(parts)


def _math_label(round_: int) -> pl.Expr:
    """`schemas.prompt_label` of a math row: the same JSON text (keys sorted, compact)."""
    return pl.struct(
        answer=pl.col("label"),
        domain=pl.lit("math"),
        hint_id=pl.col("hint_id"),
        problem_id=pl.col("problem_id"),
        round=pl.lit(round_, pl.Int64),
    ).struct.json_encode()


def render_exprs(rows: pl.DataFrame, cfg: BuildConfig, round_: int) -> list[pl.Expr]:
    """The PROMPTS columns as expressions over `prepare_rows`'s output (any slice of it)."""
    instruction = pl.col("domain").replace_strict(cfg.instructions, default="", return_dtype=pl.String)
    user = (
        pl.when(pl.col("hint_id").is_not_null())
        .then(fill_template(cfg.template, instruction))
        .otherwise(fill_template(cfg.plain_template, instruction))
    )
    messages = [pl.struct(role=pl.lit("user"), content=user)]
    if cfg.system_prompt:
        messages.insert(0, pl.struct(role=pl.lit("system"), content=pl.lit(cfg.system_prompt)))
    label = _math_label(round_)
    if "_code_label" in rows.columns:
        label = pl.when(pl.col("domain") == "code").then(pl.col("_code_label")).otherwise(label)
    rnd = pl.lit(round_, pl.Int32)
    return [
        pl.concat_list(messages).alias("prompt"),
        label.alias("label"),
        pl.col("data_source"),
        pl.col("data_source").alias("datasource"),  # OpenRLHF's per-source metrics read this name
        pl.col("domain").alias("ability"),
        pl.struct(style=pl.lit("rule"), ground_truth=pl.col("label")).alias("reward_model"),
        pl.struct(pl.col("problem_id"), pl.col("hint_id"), rnd.alias("round"), pl.col("index")).alias("extra_info"),
        pl.col("problem_id"),
        pl.col("hint_id"),
        rnd.alias("round"),
    ]


__all__ = ["fill_template", "prepare_rows", "render_exprs", "shuffle_key"]
