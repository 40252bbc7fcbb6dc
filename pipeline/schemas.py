"""The canonical Arrow schemas: the only place they are defined.

Stages meet only through these datasets:

- ``ROLLOUTS``  one row per sampled trajectory (input of `mine`)
- ``COLLAPSED`` one row per collapsed problem (output of `mine`, input of `hint`)
- ``HINTS``     one row per hinted problem (output of `hint`, input of `build`)
- ``PROMPTS``   next-epoch prompt shards (output of `build`, input of the trainer)
- ``PROBLEMS``  a base problem set (bundled MATH-500 / HumanEval / GSM8K, or the user's)

plus ``RECORD_FIELDS``, the JSONL record our reward files append for
every rollout (read back by ``mentor ingest --format openrlhf``).

Every dataset written by mentor carries ``mentor.schema_version`` and
``mentor.dataset`` in its Parquet key-value metadata.

Labels. ``label`` in ROLLOUTS / COLLAPSED / PROBLEMS is the reference in its
domain form: for ``math`` the reference answer as text (LaTeX allowed); for
``code`` a JSON object ``{"tests": str, "entry_point": str|null, "kind":
"humaneval"|"stdio", "setup": str}`` (``setup``, optional: trusted code the
tests may call, e.g. a HumanEval prompt's helpers; see `code_label`). In PROMPTS the ``label`` is a JSON
object with the reference plus ``problem_id``, ``hint_id`` and ``round``,
because OpenRLHF passes only the label to the reward function.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from mentor.pipeline.code_label import CodeLabel, code_label, parse_code_label  # noqa: F401  (the code label's form)
from mentor.pipeline.errors import SchemaError

SCHEMA_VERSION = "1"
DOMAINS = ("math", "code")
HINT_STATUSES = ("accepted", "repaired", "fallback")

ROLLOUTS = pa.schema(
    [
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),
        pa.field("sample_idx", pa.int32(), nullable=False),
        # Original problem text, without any hint (null when the log only has
        # the prompt as sent; `mine` then falls back to `prompt`).
        pa.field("problem", pa.string()),
        pa.field("prompt", pa.string(), nullable=False),  # as sent, hint included
        pa.field("response", pa.string(), nullable=False),
        pa.field("correct", pa.float64(), nullable=False),  # raw correctness in [0, 1]
        pa.field("reward", pa.float64()),  # as the trainer used it (may be shaped)
        pa.field("hint_id", pa.string()),  # null when unhinted
        pa.field("domain", pa.string(), nullable=False),
        pa.field("label", pa.string()),
        pa.field("source", pa.string(), nullable=False),  # which importer
        pa.field("truncated", pa.bool_()),
        pa.field("step", pa.int64()),
    ]
)

COLLAPSED = pa.schema(
    [
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),  # round the rollouts came from
        pa.field("domain", pa.string(), nullable=False),
        pa.field("problem", pa.string(), nullable=False),
        pa.field("label", pa.string()),
        pa.field("n_rollouts", pa.int32(), nullable=False),
        pa.field("failed", pa.list_(pa.string()), nullable=False),
        pa.field("streak", pa.int32(), nullable=False),
        pa.field("previous_hints", pa.list_(pa.string()), nullable=False),
        pa.field("solution", pa.string()),  # the reference solution, when known (stages/solutions.py)
    ]
)

TRACE_ENTRY = pa.struct(
    [
        pa.field("agent", pa.string()),  # attribution | generation | judgment | repair
        pa.field("attempt", pa.int32()),
        pa.field("raw", pa.string()),  # the model's text, always kept
        pa.field("parsed", pa.string()),  # JSON of the parsed fields, null on parse failure
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
    ]
)

# hints.vouch: candidates tried, the kept one (0-based), its re-rolls and how many were correct,
# and whether that earned reward (rescued). See stages/hint/vouch.py.
VOUCH = pa.struct(
    [
        pa.field("candidates", pa.int32()),
        pa.field("kept", pa.int32()),
        pa.field("samples", pa.int32()),
        pa.field("correct", pa.int32()),
        pa.field("rescued", pa.bool_()),
    ]
)

HINTS = pa.schema(
    [
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),
        pa.field("hint_id", pa.string(), nullable=False),  # content hash
        pa.field("hint", pa.string(), nullable=False),
        pa.field("keywords", pa.list_(pa.string()), nullable=False),
        pa.field("error", pa.string()),  # the attributed conceptual error
        pa.field("status", pa.string(), nullable=False),  # accepted | repaired | fallback
        pa.field("retries", pa.int32(), nullable=False),
        pa.field("refines", pa.int32(), nullable=False),
        pa.field("judge_score", pa.float64()),
        pa.field("violations", pa.list_(pa.string()), nullable=False),
        pa.field("trace", pa.list_(TRACE_ENTRY), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("prompt_version", pa.string(), nullable=False),  # hash of the templates
        pa.field("config_hash", pa.string(), nullable=False),
        # What the policy did with the kept hint when it vouched (HintConfig.vouch); null otherwise.
        pa.field("vouch", VOUCH),
    ]
)

MESSAGE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])

PROMPTS = pa.schema(
    [
        # A message is never null (readers ignore nullability; schemas.compatible too).
        pa.field("prompt", pa.list_(pa.field("item", MESSAGE, nullable=False)), nullable=False),
        pa.field("label", pa.string(), nullable=False),  # JSON, see module docstring
        pa.field("data_source", pa.string(), nullable=False),  # verl
        pa.field("datasource", pa.string()),  # the same, under the name OpenRLHF's PromptDataset reads
        pa.field("ability", pa.string(), nullable=False),
        pa.field(
            "reward_model",
            pa.struct([pa.field("style", pa.string()), pa.field("ground_truth", pa.string())]),
            nullable=False,
        ),
        pa.field(
            "extra_info",
            pa.struct(
                [
                    pa.field("problem_id", pa.string()),
                    pa.field("hint_id", pa.string()),
                    pa.field("round", pa.int32()),
                    pa.field("index", pa.int64()),
                ]
            ),
            nullable=False,
        ),
        # Convenience copies for inspection with polars (trainers ignore them).
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("hint_id", pa.string()),
        pa.field("round", pa.int32(), nullable=False),
    ]
)

# Prompt shards rendered to text with the policy's chat template (placement "assistant": the hint opens
# the answer, which no trainer renders from messages): the same columns, ``prompt`` the text as sent.
PROMPTS_TEXT = PROMPTS.set(PROMPTS.get_field_index("prompt"), pa.field("prompt", pa.string(), nullable=False))

PROBLEMS = pa.schema(
    [
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("problem", pa.string(), nullable=False),
        pa.field("label", pa.string(), nullable=False),  # domain form, see docstring
        pa.field("data_source", pa.string(), nullable=False),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "rollouts": ROLLOUTS,
    "collapsed": COLLAPSED,
    "hints": HINTS,
    "prompts": PROMPTS,
    "problems": PROBLEMS,
}

# The JSONL record every trainer's reward file (OpenRLHF, verl, TRL) appends per rollout.
# Required keys first; `ingest --format openrlhf` reads exactly these.
RECORDS_FORMAT = "openrlhf"  # their `ingest --format` (a format name, after the first trainer that wrote them; kept)
RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "v": int,  # record format version (== int(SCHEMA_VERSION))
    "problem_id": str,
    "round": int,
    "domain": str,
    "prompt": str,  # chat-templated prompt as the trainer sent it
    "response": str,
    "correct": (int, float),  # raw verifier correctness in [0, 1]
    "reward": (int, float),  # reward returned to the trainer
}
RECORD_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "hint_id": str,
    "label": str,  # reference in domain form
    "truncated": bool,
    "step": int,
    "ts": float,  # wall-clock time of the record
    "pid": int,  # writer process
    "seq": int,  # per-process sequence number (orders records within a shard)
    "trainer": str,  # "openrlhf" | "verl" | "trl"
    "run": str,  # the run's identity (MENTOR_RUN_ID; rollout_log.run_identity)
}


def prompt_label(domain: str, reference: str | None, problem_id: str, hint_id: str | None, round_: int) -> str:
    """The PROMPTS `label`: a JSON string the reward functions parse with `parse_prompt_label`.

    math: ``{"domain": "math", "answer": ..., "problem_id", "hint_id", "round"}``
    code: ``{"domain": "code", "tests", "entry_point", "kind", "problem_id", "hint_id", "round"}``
    (`reference` is the domain-form label: the answer text, or `code_label` JSON).
    """
    obj: dict = {"domain": domain, "problem_id": problem_id, "hint_id": hint_id, "round": int(round_)}
    if domain == "code":
        obj.update(json.loads(reference) if reference else {"tests": None, "entry_point": None, "kind": "humaneval"})
    else:
        obj["answer"] = reference
    # Compact, keys sorted: the text polars' struct.json_encode gives, which `mentor build` uses for math rows.
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def parse_prompt_label(label: str) -> dict:
    """Inverse of `prompt_label`; raises ValueError on anything else."""
    obj = json.loads(label)
    if not isinstance(obj, dict) or "problem_id" not in obj or "domain" not in obj:
        raise ValueError("not a mentor prompt label (needs a JSON object with domain and problem_id)")
    return obj


def schema_metadata(dataset: str) -> dict[bytes, bytes]:
    return {b"mentor.schema_version": SCHEMA_VERSION.encode(), b"mentor.dataset": dataset.encode()}


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Problem:
    column: str
    found: str
    expected: str

    def __str__(self) -> str:
        if self.found == "missing":
            return f"column {self.column!r} missing"
        return f"column {self.column!r} has type {self.found}, expected {self.expected}"


def _kind(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return "list"
    if pa.types.is_struct(t):
        return "struct"
    return str(t)


# What an expected kind accepts from a file (all are cast losslessly on read).
_ACCEPTS = {
    "string": {"string", "null"},
    "int": {"int", "null"},
    "float": {"float", "int", "bool", "null"},
    "bool": {"bool", "null"},
    "list": {"list", "null"},
    "struct": {"struct", "null"},
}


def compatible(found: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a column of type `found` can be read as `expected` without loss."""
    fk, ek = _kind(found), _kind(expected)
    if fk not in _ACCEPTS.get(ek, {ek}):
        return False
    if ek == "list" and fk == "list":
        return compatible(found.value_type, expected.value_type)
    if ek == "struct" and fk == "struct":
        names = {found.field(i).name: found.field(i).type for i in range(found.num_fields)}
        for i in range(expected.num_fields):
            f = expected.field(i)
            if f.name not in names or not compatible(names[f.name], f.type):
                return False
    return True


def expected_schema(dataset: str, found: pa.Schema | None = None) -> pa.Schema:
    """The canonical schema of `dataset` for a file of schema `found`: prompt shards hold chat messages
    (`PROMPTS`) or rendered text (`PROMPTS_TEXT`), told by the type of their ``prompt`` column."""
    if dataset == "prompts" and found is not None and "prompt" in found.names and _kind(found.field("prompt").type) == "string":
        return PROMPTS_TEXT
    return SCHEMAS[dataset]


def prompts_are_text(found: pa.Schema) -> bool:
    """Whether prompt shards of schema `found` hold pre-rendered text prompts (placement "assistant")."""
    return expected_schema("prompts", found) is PROMPTS_TEXT


def check_schema(
    found: pa.Schema, dataset: str, required_only: Iterable[str] | None = None
) -> list[Problem]:
    """Every way `found` differs from the canonical schema of `dataset`.

    Columns absent from `found` are problems only when the canonical field is
    non-nullable (optional columns may be missing and are filled with nulls).
    """
    expected = expected_schema(dataset, found)
    problems: list[Problem] = []
    names = set(found.names)
    for field in expected:
        if field.name not in names:
            if not field.nullable:
                problems.append(Problem(field.name, "missing", str(field.type)))
            continue
        t = found.field(field.name).type
        if not compatible(t, field.type):
            problems.append(Problem(field.name, str(t), str(field.type)))
    return problems


def require_schema(found: pa.Schema, dataset: str, where: str, fix: str | None = None) -> None:
    """Raise `SchemaError` naming the file, each bad column and the fix."""
    problems = check_schema(found, dataset)
    if problems:
        detail = "; ".join(str(p) for p in problems)
        have = ", ".join(found.names[:12]) + (", ..." if len(found.names) > 12 else "")
        hint = fix or f"write it with mentor (schema '{dataset}' v{SCHEMA_VERSION})"
        raise SchemaError(f"{where}: not a '{dataset}' dataset: {detail} (found: {have}); {hint}")


def conform(table: pa.Table, dataset: str) -> pa.Table:
    """Cast/reorder `table` to the canonical schema, filling absent optional columns."""
    expected = expected_schema(dataset, table.schema)
    columns = []
    for field in expected:
        if field.name in table.column_names:
            col = table.column(field.name)
            if not col.type.equals(field.type):
                col = col.cast(field.type)
        else:
            col = pa.nulls(table.num_rows, type=field.type)
        columns.append(col)
    schema = pa.schema(list(expected), metadata=schema_metadata(dataset))
    return pa.Table.from_arrays(columns, schema=schema)
