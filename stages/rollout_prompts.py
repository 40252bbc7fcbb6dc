"""Rollout's prompts: prompt shards (`mentor build`), a problems dataset or a bundled set name, read as `PromptItem`s."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mentor.data import BUNDLED_SETS, bundled
from mentor.pipeline.errors import DataError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import read_dataset, read_parquet_schema
from mentor.pipeline.schemas import check_schema, parse_prompt_label
from mentor.stages.build_render import prompt_messages
from mentor.training.verify import reference_of

if TYPE_CHECKING:
    from mentor.stages.rollout import RolloutConfig


@dataclass
class PromptItem:
    """One prompt to sample: what is sent, and what the rollouts are verified and filed under."""

    messages: list[dict]  # the chat (text prompts: what was rendered, or nothing when only the text is known)
    domain: str
    reference: str | None  # domain-form label
    problem_id: str
    hint_id: str | None
    round: int
    problem: str | None  # original text without hint, when known
    arm: str = "plain"  # rescue: the arm this prompt belongs to
    arm_index: int = 0
    prompt: str | None = None  # the prompt rendered with the policy's chat template (text placements): sent as it is


def resolve_sources(sources: Sequence[str]) -> list[Path]:
    """Files, folders and globs (as every stage), plus the bundled set names."""
    paths: list[Path] = []
    for s in sources:
        if str(s) in BUNDLED_SETS and not Path(s).exists():
            paths.append(bundled(BUNDLED_SETS[str(s)]))
        else:
            paths.extend(resolve_inputs([s]))
    return paths


def is_dataset(paths: list[Path], dataset: str) -> bool:
    return all(not check_schema(read_parquet_schema(p), dataset) for p in paths)


def load_prompt_items(sources: Sequence[str], cfg: "RolloutConfig") -> list[PromptItem]:
    """PROMPTS shards, a PROBLEMS dataset or a bundled set name -> prompt items (in file order)."""
    paths = resolve_sources(sources)
    if is_dataset(paths, "prompts"):
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
            text = row["prompt"] if isinstance(row["prompt"], str) else None  # rendered by build: sent as it is
            items.append(
                PromptItem(
                    messages=[] if text is not None else [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
                    domain=domain,
                    reference=ref,
                    problem_id=str(label.get("problem_id") or row["problem_id"]),
                    hint_id=label.get("hint_id"),
                    round=cfg.round if cfg.round is not None else int(label.get("round") or row["round"] or 0),
                    problem=None,
                    prompt=text,
                )
            )
        return items
    if is_dataset(paths, "problems"):
        df = read_dataset(paths, "problems")
        if cfg.limit:
            df = df.head(cfg.limit)
        plain = prompt_messages([{"problem": r["problem"], "hint": None, "domain": r["domain"]} for r in df.iter_rows(named=True)],
                                instructions=cfg.instructions)
        return [
            PromptItem(
                messages=msgs,
                domain=r["domain"],
                reference=r["label"],
                problem_id=r["problem_id"],
                hint_id=None,
                round=cfg.round or 0,
                problem=r["problem"],
            )
            for r, msgs in zip(df.iter_rows(named=True), plain)
        ]
    found = ", ".join(read_parquet_schema(paths[0]).names[:10])
    raise DataError(
        f"{paths[0]}: neither prompt shards (mentor build) nor a problems dataset (found columns: {found}); "
        "pass the output of `mentor build`, a problems Parquet with problem_id, domain, problem, label, data_source, "
        "or a bundled set name (gsm8k, math500, humaneval)"
    )
