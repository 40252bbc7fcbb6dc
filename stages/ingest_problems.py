"""The original problem text of rollouts whose log has only the prompt as sent (OpenRLHF, verl).

`ingest` fills the ``problem`` column by problem_id from a PROBLEMS dataset,
else the base set of the run the logs lie in, else a bundled set holding those
ids (`ProblemRecovery.by_id`); what is still missing is recovered from the
prompt itself (`recover_problem`: chat template, mentor's ``Hint:`` block and
the default instruction removed), or counted as ``problem_missing``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pyarrow as pa

from mentor.data import BUNDLED_SETS, bundled
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.ids import text_id
from mentor.pipeline.io import read_dataset
from mentor.pipeline.prompts import HINT_PREFIX, INSTRUCTION_SEPARATOR, INSTRUCTIONS
from mentor.pipeline.schemas import RECORDS_FORMAT
from mentor.pipeline.stage import Stats

log = logging.getLogger("mentor.stages.ingest")  # the stage's logger: `mentor ingest` quiets it as one


def problem_texts(problems: str) -> dict[str, str]:
    """problem_id -> problem of a PROBLEMS dataset or a bundled set (gsm8k, math500, humaneval)."""
    if problems in BUNDLED_SETS:
        problems = str(bundled(BUNDLED_SETS[problems]))
    elif not Path(problems).exists():
        raise ConfigError(f"--problems {problems}: no such file, and not a bundled set ({', '.join(BUNDLED_SETS)})")
    df = read_dataset([problems], "problems").select("problem_id", "problem").drop_nulls()
    return dict(df.iter_rows())


def run_base_texts(paths: list[Path]) -> dict[str, str] | None:
    """The base set of the mentor run directory the logs lie in (runs/<name>/base/problems.parquet), if any."""
    for path in paths[:1]:
        for parent in list(path.resolve().parents)[:6]:
            base = parent / "base" / "problems.parquet"
            if base.is_file() and (parent / "workflow.yaml").is_file():
                log.info("original problem texts from the run's base set %s", base)
                return problem_texts(str(base))
    return None


class ProblemRecovery:
    """Fills the `problem` column where the log has only the prompt as sent."""

    def __init__(self, texts: dict[str, str] | None):
        self.texts = texts
        self._bundled: dict[str, str] | None = None
        self._cache: dict[tuple, str | None] = {}

    def bundled(self) -> dict[str, str]:
        if self._bundled is None:
            self._bundled = {}
            for name in BUNDLED_SETS:
                self._bundled.update(problem_texts(name))
        return self._bundled

    def by_id(self, table: pa.Table) -> pa.Table:
        """Problem texts by problem_id: the given/run's base set first, then the bundled sets."""
        current = table.column("problem").to_pylist()
        if all(c is not None for c in current):
            return table
        pids = table.column("problem_id").to_pylist()
        out = []
        for pid, cur in zip(pids, current):
            if cur is None and pid is not None:
                cur = (self.texts or {}).get(pid)
                if cur is None:
                    cur = self.bundled().get(pid)
            out.append(cur)
        return table.set_column(table.schema.get_field_index("problem"), "problem", pa.array(out, pa.string()))

    def from_prompt(self, table: pa.Table, stats: Stats, kind: str) -> pa.Table:
        """`recover_problem` where the text is still missing; counts recovered and missing rows."""
        current = table.column("problem").to_pylist()
        if all(c is not None for c in current):
            return table
        pids = table.column("problem_id").to_pylist()
        prompts = table.column("prompt").to_pylist()
        hint_ids = table.column("hint_id").to_pylist()
        # Only mentor's own records carry hint_id; verl's and mapped logs' ids may come from the prompt itself.
        ours = kind == RECORDS_FORMAT
        out = []
        for pid, cur, prompt, hid in zip(pids, current, prompts, hint_ids):
            if cur is None:
                key = (pid if ours else None, prompt, bool(hid) if ours else None)
                if key not in self._cache:
                    self._cache[key] = recover_problem(prompt, key[0], hid if ours else None, ours)
                cur = self._cache[key]
                if cur is None:
                    stats.problem_missing += 1
                else:
                    stats.problem_recovered += 1
            out.append(cur)
        return table.set_column(table.schema.get_field_index("problem"), "problem", pa.array(out, pa.string()))


_HASH_ID = re.compile(r"^p-[0-9a-f]{16}$")
# The last user turn of common chat templates (ChatML/Qwen/SmolLM, Llama 3, Gemma, Phi, DeepSeek, Mistral, Zephyr).
_USER_TURNS = (
    re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S),
    re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", re.S),
    re.compile(r"<start_of_turn>user\n(.*?)<end_of_turn>", re.S),
    re.compile(r"<\|user\|>\n?(.*?)(?:<\|end\|>|</s>)", re.S),
    re.compile(r"<｜User｜>(.*?)<｜Assistant｜>", re.S),
    re.compile(r"\[INST\]\s*(.*?)\s*\[/INST\]", re.S),
)
_SPECIAL = re.compile(r"<\|[^<>|\s]{1,40}\|>|<｜[^<>]{1,40}｜>|<start_of_turn>|<end_of_turn>|\[INST\]")
_MAX_PARAGRAPHS = 40


def recover_problem(prompt: str | None, problem_id: str | None = None, hint_id: str | None = None,
                    knows_hint: bool = False) -> str | None:
    """The original problem text inside a prompt as sent, or None when it cannot be told.

    The user turn is taken out of the chat template. For a `problem_id` that is a
    hash of the text (``p-…``, what mentor gives problems without an id) the
    paragraphs whose text has that id are the problem: exact, whatever the
    template. Otherwise mentor's own layout is undone: the ``Hint: …`` block
    before a blank line, then a default instruction at the end. With
    `knows_hint` (the record says whether it was hinted: `hint_id`) a hinted
    prompt without that block, or an unhinted one with it, is not guessed at,
    so an old hint never passes for the problem.
    """
    if not prompt:
        return None
    user = None
    in_answer = False  # `--placement assistant`: the hint opens the answer, after the user turn
    for pattern in _USER_TURNS:
        found = list(pattern.finditer(prompt))
        if found:
            user = found[-1].group(1)
            in_answer = _SPECIAL.sub("", prompt[found[-1].end():]).strip() not in ("", "assistant", "model")
            break
    if user is None:
        if _SPECIAL.search(prompt):
            return None  # a chat template this does not know
        user = prompt
    user = user.strip()
    if problem_id is not None and _HASH_ID.match(problem_id):
        paras = user.split("\n\n")[:_MAX_PARAGRAPHS]
        for i in range(len(paras)):
            for j in range(len(paras), i, -1):
                candidate = "\n\n".join(paras[i:j]).strip()
                if candidate and text_id(candidate) == problem_id:
                    return candidate
        if knows_hint or _SPECIAL.search(prompt) or user.startswith(HINT_PREFIX):
            return None  # the id says the text is not in there as written
    before = user.startswith(HINT_PREFIX) and "\n\n" in user
    for instruction in INSTRUCTIONS.values():
        if instruction and user.endswith(INSTRUCTION_SEPARATOR + instruction):
            user = user[: -len(INSTRUCTION_SEPARATOR + instruction)]
            break
    # `mentor build --placement after`: the hint block is the last paragraph, after the problem;
    # `--placement system`: it opens a turn before the user's (the system message); `--placement
    # assistant`: the user turn is the plain problem, the hint opens the answer after it.
    after = -1 if before else user.rfind(f"\n\n{HINT_PREFIX} ")
    ahead = prompt[: max(0, prompt.find(user))]
    in_system = not before and after < 0 and re.search(rf"(?:^|\n){re.escape(HINT_PREFIX)} ", ahead) is not None
    if knows_hint and bool(hint_id) != (before or after > 0 or in_system or in_answer):
        return None  # a hint_id without mentor's hint block (a custom template), or the reverse
    if before:
        user = user.split("\n\n", 1)[1] if "\n\n" in user else ""
    elif after > 0:
        user = user[:after]
    user = user.strip()
    return user or None
