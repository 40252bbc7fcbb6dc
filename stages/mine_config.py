"""Mine's settings (`mentor mine`'s options, a workflow's ``mine:`` section, what its resume key hashes)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class MineConfig(BaseModel):
    """Settings of `mentor mine` (also the `mine:` section of a workflow)."""

    model_config = ConfigDict(extra="forbid")

    correct_col: str = Field("correct", description="Column holding raw correctness in [0, 1]. Never a shaped reward.")
    threshold: float = Field(0.0, ge=0.0, lt=1.0, description="A rollout counts as failed when correctness <= threshold.")
    min_rollouts: int = Field(2, ge=1, le=2**31 - 1, description="Problems with fewer valid rollouts are not judged.")
    k_failed: int = Field(2, ge=0, le=10_000, description="Failed responses kept per collapsed problem (deduplicated).")
    failed_budget_chars: int = Field(
        2000, ge=64, le=2**31 - 1, description="Each kept failed response is cut to this many characters, keeping mostly its end."
    )
    cut_share: float = Field(
        0.5, ge=0.0, le=1.0, description="A collapsed problem is set apart as cut at the response limit (not hinted, counted "
        "in `cut`) when more than this share of its valid rollouts were cut (truncated); the fix is a longer response limit. "
        "1.0: never set apart (hint every collapsed problem)."
    )
    solutions: str | None = Field(
        None, description="Reference solutions carried into the collapsed set (its solution column, which the hint agents "
        "read): a Parquet or JSONL file with problem_id and solution, e.g. a base set with a solution column; default: the "
        "bundled GSM8K, MATH-500 and HumanEval solutions, by problem id."
    )

    @field_validator("correct_col")
    @classmethod
    def _not_reward(cls, v: str) -> str:
        if v == "reward":
            raise ValueError("'reward' may be shaped; mine on raw correctness (e.g. 'correct' or 'acc')")
        return v
