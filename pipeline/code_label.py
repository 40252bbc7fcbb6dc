"""The code label's form: `code_label` writes it, `parse_code_label` reads it.

The standard library only: the code verifier (`mentor.training.code_verify`) reads labels inside the trainers'
reward processes, which have no pyarrow (`pip install '.[reward]'`); `mentor.pipeline.schemas` re-exports these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


def code_label(tests: str, entry_point: str | None, kind: str = "humaneval", setup: str | None = None) -> str:
    """The domain-form label of a code problem (a JSON string).

    `setup` is trusted code the verifier runs beside the tests, never beside the
    candidate (HumanEval: the task's prompt, whose helpers such as ``poly`` some
    tests call); see `mentor.training.code_verify`.
    """
    obj = {"tests": tests, "entry_point": entry_point, "kind": kind}
    if setup is not None:
        obj["setup"] = setup
    return json.dumps(obj, sort_keys=True)


@dataclass(frozen=True)
class CodeLabel:
    tests: str | list
    entry_point: str | None
    kind: str
    setup: str | None  # trusted code run in the tester before the tests (HumanEval: the prompt)


def parse_code_label(label: dict | str) -> CodeLabel:
    """A code label from its dict or JSON form (`code_label` writes it); ValueError naming what is wrong."""
    if isinstance(label, str):
        label = json.loads(label)
    if not isinstance(label, dict):
        raise ValueError("a code label is a JSON object {tests, entry_point, kind, setup}")
    kind = label.get("kind") or "humaneval"
    tests = label.get("tests")
    if not tests:
        raise ValueError("code label has no tests")
    if kind == "humaneval":
        entry = label.get("entry_point")
        # "f", or "Solution.f": the method f of a Solution() instance (LeetCode-style problems, e.g. LiveCodeBench's).
        if not isinstance(entry, str) or not all(p.isidentifier() for p in entry.split(".")) or entry.count(".") > 1 \
                or not isinstance(tests, str):
            raise ValueError("humaneval label needs tests (Python source) and entry_point (a function name, or Class.method)")
        setup = label.get("setup")
        if setup is not None and not isinstance(setup, str):
            raise ValueError("code label 'setup' must be Python source")
        return CodeLabel(tests, entry, kind, setup)
    if kind == "stdio":
        cases = json.loads(tests) if isinstance(tests, str) else tests
        if not isinstance(cases, list) or not cases or not all(
            isinstance(c, dict) and isinstance(c.get("input", ""), str) and isinstance(c.get("output", ""), str) for c in cases
        ):
            raise ValueError("stdio tests must be a non-empty JSON list of {input: str, output: str}")
        return CodeLabel(cases, None, kind, None)
    raise ValueError(f"unknown test kind {kind!r} (expected humaneval or stdio)")
