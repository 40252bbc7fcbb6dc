"""Build's screen for chat-control tokens: no hint and no problem text becomes a chat turn.

Trainers tokenize the rendered prompt with the tokenizer's added tokens split out, so a hint or a
problem that carries ``<|im_end|>``, ``<|start_header_id|>``, ``<｜User｜>``, ... closes its turn and
opens new ones in the prompt the policy trains on (every placement: a user or system message as much
as placement ``assistant``). The tokens are those of rule ``special_token``
(`stages.rules.special_tokens`): the policy's (``--tokenizer``) where it is known, and always the
common chat templates' tokens and anything shaped like ``<|name|>`` / ``<｜name｜>``.

- a hint that carries one is dropped: its problem gets the unhinted prompt; counted as
  ``hints_special_token``;
- a base problem that carries one is dropped (there is no plain text of it to train on without
  rewriting the problem); counted as ``base_dropped.special_token``.

Both are warnings, and errors with ``--strict``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import polars as pl

from mentor.pipeline.errors import DataError
from mentor.pipeline.stage import Stats
from mentor.stages.rules.special_tokens import CONTROL_SHAPE, control_tokens_in, describe_tokens


def carries_control_token(column: str, tokens: Sequence[str]) -> pl.Expr:
    """Whether the text in `column` holds one of `tokens` or a token of `CONTROL_SHAPE` (null: False)."""
    return (pl.col(column).str.contains_any(list(tokens)) | pl.col(column).str.contains(CONTROL_SHAPE)).fill_null(False)


def _examples(frame: pl.DataFrame, column: str, tokens: Sequence[str]) -> str:
    found: dict[str, None] = {}
    for text in frame.get_column(column).head(20).to_list():
        found.update(dict.fromkeys(control_tokens_in(text, tokens)))
    ids = frame.get_column("problem_id").head(5).to_list()
    return f"{describe_tokens(found)}; e.g. problem_id {ids}"


def _screen(frame: pl.DataFrame, column: str, tokens: Sequence[str], stats: Stats, strict: bool,
            count: Callable[[int], None], message: Callable[[int, str], str]) -> pl.DataFrame:
    """`frame` without the rows whose `column` carries a chat-control token: counted (`count`) and warned about
    (`message` of their number and the tokens found); `strict`: a DataError instead."""
    bad = frame.filter(carries_control_token(column, tokens))
    if not bad.height:
        return frame
    msg = message(bad.height, _examples(bad, column, tokens))
    if strict:
        raise DataError(msg + " (--strict)")
    count(bad.height)
    stats.warn(msg)
    return frame.filter(~carries_control_token(column, tokens))


def screen_control_tokens(problems: pl.DataFrame, hints: pl.DataFrame, tokens: Sequence[str], stats: Stats,
                          strict: bool, where: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`problems` and `hints` without the rows whose problem / hint text carries a chat-control token, counted
    (``base_dropped`` reason ``special_token``, ``hints_special_token``) and warned about; `strict`: a DataError."""
    def drop_base(n: int) -> None:
        stats.add("base_dropped", n, reason="special_token")

    def drop_hints(n: int) -> None:
        stats.hints_special_token = n

    kept = _screen(problems, "problem", tokens, stats, strict, drop_base, lambda n, found: (
        f"{where}: {n} base problem(s) dropped (special_token): the problem text carries the chat-control "
        f"token(s) {found}, which would open chat turns in the prompt; remove the tokens from the problem text"))
    if kept.height == 0 and problems.height:
        raise DataError(f"{where}: no usable base problems ({dict(stats.base_dropped)})")
    hints = _screen(hints, "hint", tokens, stats, strict, drop_hints, lambda n, found: (
        f"{n} hint(s) not used (special_token): the hint text carries the chat-control token(s) {found}, which would "
        "open chat turns in the prompt; those problems get their unhinted prompt (`mentor check-hint --tokenizer` shows "
        "the tokens; re-hint them)"))
    return kept, hints
