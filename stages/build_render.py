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
from mentor.pipeline.prompts import (DEFAULT_PLACEMENT, HINT_TEMPLATE, INSTRUCTION_SEPARATOR, PLACEHOLDER_RE, PLACEMENTS, PLAIN_TEMPLATE,
                                     TEXT_PLACEMENTS, answer_template)
from mentor.pipeline.schemas import prompt_label
from mentor.pipeline.stage import Stats

if TYPE_CHECKING:
    from mentor.stages.build import BuildConfig

# --------------------------------------------------------------------------- where the hint goes

# The placements themselves (PLACEMENTS, TEXT_PLACEMENTS, DEFAULT_PLACEMENT) are `pipeline.prompts`': live hints'
# settings (`training/live_hints.py`) name them too.
DEFAULT_TOKENIZED_PLACEMENT = "assistant"  # math, where the policy's tokenizer is known: the measured best
# Code tasks keep DEFAULT_PLACEMENT: with text opening its answer, the 0.5B coder explains that text instead of
# writing the program (the whole working solution there: 0 of 42 collapsed HumanEval tasks right, against 38
# in the user turn; docs/benchmarks.md#hints-that-open-the-answer).
USER_TURN_DOMAINS = frozenset({"code"})


def resolve_placement(placement: str | None, tokenizer: str | None, domains=()) -> str:
    """The placement a stage uses: the one asked for, else the default for whether a tokenizer is known and
    which `domains` the prompts have (assistant for math with a tokenizer; after with a code task among them).

    A text placement without a tokenizer is a `ValueError` naming the fix."""
    if placement is None:
        return DEFAULT_TOKENIZED_PLACEMENT if tokenizer and not USER_TURN_DOMAINS & set(domains) else DEFAULT_PLACEMENT
    if placement in TEXT_PLACEMENTS and not tokenizer:
        raise ValueError(f"placement {placement} renders the prompt with the policy's chat template: give the policy's "
                         "tokenizer (--tokenizer MODEL) or another placement")
    return placement
# The hinted user message of the placements that put the hint there; "system" keeps the
# plain user message and puts SYSTEM_HINT into the system message.
PLACEMENT_TEMPLATES = {"before": HINT_TEMPLATE, "after": "{problem}\n\nHint: {hint}"}
SYSTEM_HINT = "Hint: {hint}"
SYSTEM_SEPARATOR = "\n\n"


def hint_template(placement: str, template: str | None = None) -> str:
    """The hinted user message: `template` when given, else the placement's (the plain one for "system" and
    "assistant", which put the hint elsewhere)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r}: use one of {', '.join(PLACEMENTS)}")
    if template is not None and placement not in TEXT_PLACEMENTS:
        return template
    return PLACEMENT_TEMPLATES.get(placement, PLAIN_TEMPLATE)


def messages_expr(placement: str, template: str | None, plain_template: str, system_prompt: str | None,
                  instructions: dict[str, str]) -> pl.Expr:
    """The ``prompt`` column (chat messages) over columns ``problem``, ``hint`` (null: unhinted), ``domain``.

    The one definition of the layout: `mentor build` writes it and `mentor rescue`
    re-rolls with it (`prompt_messages`), so a rescue measures the prompts training sees.
    With placement "assistant", `template` is the opening of the answer ({hint} only;
    `prompts.answer_template`) and a hinted chat ends with that open assistant message.
    """
    instruction = pl.col("domain").replace_strict(instructions, default="", return_dtype=pl.String)
    hinted = pl.col("hint").is_not_null()
    user = (
        pl.when(hinted)
        .then(fill_template(hint_template(placement, template), instruction))
        .otherwise(fill_template(plain_template, instruction))
    )
    user_msg = pl.struct(role=pl.lit("user"), content=user)
    lead = f"{system_prompt}{SYSTEM_SEPARATOR}" if system_prompt else ""
    if placement == "assistant":
        head = [pl.struct(role=pl.lit("system"), content=pl.lit(system_prompt))] if system_prompt else []
        opened = pl.struct(role=pl.lit("assistant"), content=fill_template(answer_template(template), pl.lit(""),
                                                                            instruction_tail=False))
        return pl.when(hinted).then(pl.concat_list([*head, user_msg, opened])).otherwise(pl.concat_list([*head, user_msg]))
    if placement == "system":
        system_hint = pl.concat_str([pl.lit(lead), fill_template(SYSTEM_HINT, pl.lit(""), instruction_tail=False)])
        hinted_msgs = pl.concat_list([pl.struct(role=pl.lit("system"), content=system_hint), user_msg])
        if system_prompt:
            plain_msgs = pl.concat_list([pl.struct(role=pl.lit("system"), content=pl.lit(system_prompt)), user_msg])
        else:
            plain_msgs = pl.concat_list([user_msg])
        return pl.when(hinted).then(hinted_msgs).otherwise(plain_msgs)
    if system_prompt:
        return pl.concat_list([pl.struct(role=pl.lit("system"), content=pl.lit(system_prompt)), user_msg])
    return pl.concat_list([user_msg])


def prompt_messages(rows: list[dict], placement: str = DEFAULT_PLACEMENT, template: str | None = None,
                    plain_template: str = PLAIN_TEMPLATE, system_prompt: str | None = None,
                    instructions: dict[str, str] | None = None) -> list[list[dict[str, str]]]:
    """`messages_expr` for a few rows in Python (``problem``, ``hint`` or None, ``domain`` each): what rescue sends."""
    if not rows:
        return []
    frame = pl.DataFrame(
        {c: [r.get(c) for r in rows] for c in ("problem", "hint", "domain")},
        schema={"problem": pl.String, "hint": pl.String, "domain": pl.String},
    )
    expr = messages_expr(placement, template, plain_template, system_prompt, dict(instructions or {}))
    return [[{"role": m["role"], "content": m["content"]} for m in msgs] for msgs in frame.select(expr.alias("m"))["m"].to_list()]

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


def fill_template(template: str, instruction: pl.Expr, instruction_tail: bool = True) -> pl.Expr:
    """`template` filled in per row: {hint} and {problem} from the columns, {instruction}
    the domain's; other braces stay literal (LaTeX is safe). Null where the hint is.
    `instruction_tail`: append the instruction when the template does not place it."""
    parts: list[pl.Expr] = []
    pos = 0
    for m in PLACEHOLDER_RE.finditer(template):
        parts += [pl.lit(template[pos : m.start()]), instruction if m.group(1) == "instruction" else pl.col(m.group(1))]
        pos = m.end()
    parts.append(pl.lit(template[pos:]))
    if "{instruction}" not in template and instruction_tail:
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
    # prepare_rows gives a hint exactly to the rows with a hint_id.
    placement = cfg.resolved_placement()
    template = cfg.answer_template if placement in TEXT_PLACEMENTS else cfg.template
    messages = messages_expr(placement, template, cfg.plain_template, cfg.system_prompt, cfg.instructions)
    label = _math_label(round_)
    if "_code_label" in rows.columns:
        label = pl.when(pl.col("domain") == "code").then(pl.col("_code_label")).otherwise(label)
    rnd = pl.lit(round_, pl.Int32)
    return [
        messages.alias("prompt"),
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


__all__ = ["DEFAULT_PLACEMENT", "DEFAULT_TOKENIZED_PLACEMENT", "PLACEMENTS", "TEXT_PLACEMENTS", "USER_TURN_DOMAINS", "fill_template", "hint_template", "messages_expr", "prepare_rows",
           "prompt_messages", "render_exprs", "resolve_placement", "shuffle_key"]
