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

from collections.abc import Sequence

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


def screen_control_tokens(problems: pl.DataFrame, hints: pl.DataFrame, tokens: Sequence[str], stats: Stats,
                          strict: bool, where: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`problems` and `hints` without the rows whose problem / hint text carries a chat-control token, counted
    (``base_dropped`` reason ``special_token``, ``hints_special_token``) and warned about; `strict`: a DataError."""
    bad = problems.filter(carries_control_token("problem", tokens))
    if bad.height:
        msg = (f"{where}: {bad.height} base problem(s) dropped (special_token): the problem text carries the chat-control "
               f"token(s) {_examples(bad, 'problem', tokens)}, which would open chat turns in the prompt; "
               "remove the tokens from the problem text")
        if strict:
            raise DataError(msg + " (--strict)")
        stats.add("base_dropped", bad.height, reason="special_token")
        stats.warn(msg)
        problems = problems.filter(~carries_control_token("problem", tokens))
        if problems.height == 0:
            raise DataError(f"{where}: no usable base problems ({dict(stats.base_dropped)})")
    bad = hints.filter(carries_control_token("hint", tokens))
    if bad.height:
        msg = (f"{bad.height} hint(s) not used (special_token): the hint text carries the chat-control token(s) "
               f"{_examples(bad, 'hint', tokens)}, which would open chat turns in the prompt; those problems get "
               "their unhinted prompt (`mentor check-hint --tokenizer` shows the tokens; re-hint them)")
        if strict:
            raise DataError(msg + " (--strict)")
        stats.hints_special_token = bad.height
        stats.warn(msg)
        hints = hints.filter(~carries_control_token("hint", tokens))
    return problems, hints
