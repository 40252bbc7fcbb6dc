"""What both reward functions (OpenRLHF, verl) do for one rollout: verify, then log.

Kept apart from the trainer-specific files so the two paths score and log the
same way. Nothing here raises for bad input: an unusable label or an internal
error gives correctness 0, is logged, and is counted in `STATS`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mentor.pipeline.ids import text_id
from mentor.pipeline.schemas import parse_prompt_label
from mentor.training.code_verify import strip_trailing_tokens
from mentor.training.rollout_log import ENV_POLICY_TOKENIZER, ENV_RESPONSE_LIMIT, make_record, resolve_rollout_dir, rollout_log
from mentor.training.verify import reference_of, verify

log = logging.getLogger(__name__)

STATS: Counter = Counter()
_STATS_LOCK = threading.Lock()

# One end-of-turn token a decoded query may end with (chat models' EOS markers); a run of them is
# removed right to left by `strip_trailing_tokens`, in linear time (a regex for the run is quadratic).
END_TOKEN = re.compile(r"<\|[^<>|\s]{1,40}\|>|<｜[^<>]{1,40}｜>|</s>|<eos>|<end_of_turn>")
# Where an assistant turn starts in common chat templates (fallback when the
# query does not start with the prompt text).
ASSISTANT_MARKERS = (
    "<|im_start|>assistant\n",
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "<start_of_turn>model\n",
    "<|assistant|>\n",
    "<|assistant|>",
    "<｜Assistant｜>",
    "[/INST]",
)


def count(key: str, n: int = 1) -> None:
    with _STATS_LOCK:
        STATS[key] += n


@dataclass
class Target:
    """What a label tells the reward function about one prompt."""

    domain: str
    reference: str | dict | None
    problem_id: str
    hint_id: str | None
    round: int
    label_text: str | None  # domain-form reference, as logged


def target_from_label(label, prompt: str) -> Target:
    """Parse a mentor prompt label; anything else is treated as a bare math answer (counted)."""
    if isinstance(label, dict):
        obj = label
    else:
        try:
            obj = parse_prompt_label(label)
        except (TypeError, ValueError):
            obj = None
    if obj is not None:
        ref = reference_of(obj)
        text = json.dumps(ref, sort_keys=True) if isinstance(ref, dict) else ref
        return Target(obj.get("domain") or "math", ref, str(obj["problem_id"]), obj.get("hint_id"), int(obj.get("round") or 0), text)
    count("label_not_mentor")
    ref = None if label is None else str(label)
    return Target("math", ref, text_id(prompt or ""), None, 0, ref)


def split_query(query: str, prompt: str) -> tuple[str, bool]:
    """(response, ended) from OpenRLHF's query = prompt + response (special tokens kept).

    `ended` is True when the response ends with an end-of-turn token (so it was
    not cut at max_tokens). The trailing special tokens are removed.
    """
    query = query or ""
    if prompt and query.startswith(prompt):
        response = query[len(prompt):]
    else:
        # Detokenising the prompt's tokens may not reproduce the prompt text
        # exactly (whitespace, a left-truncated prompt): find its tail instead.
        response = None
        for size in (200, 80, 30):
            tail = (prompt or "")[-size:]
            if tail and tail in query:
                response = query[query.rindex(tail) + len(tail):]
                break
        if response is None:
            cut = max((query.rfind(m) + len(m) if m in query else -1) for m in ASSISTANT_MARKERS)
            response = query[cut:] if cut >= 0 else query
            count("query_prompt_mismatch")
    return strip_trailing_tokens(response, END_TOKEN, starts="<")


_TOKENIZERS: dict[str, Any] = {}
_TOK_LOCK = threading.Lock()


def counted_truncation(response: str) -> bool | None:
    """Whether `response` hit the response limit, by counting its tokens against ``MENTOR_RESPONSE_LIMIT`` with the
    tokenizer in ``MENTOR_POLICY_TOKENIZER`` (for trainers that pass only the decoded text: verl). A response the
    trainer cut has exactly the limit's tokens; decoded and tokenized again it can come out a few shorter, so it
    counts as cut from the limit less 1% (at least 4 tokens). None when either variable is unset or the tokenizer
    cannot be loaded."""
    limit, name = os.environ.get(ENV_RESPONSE_LIMIT), os.environ.get(ENV_POLICY_TOKENIZER)
    if not limit or not name:
        return None
    try:
        limit_n = int(limit)
        with _TOK_LOCK:
            if name not in _TOKENIZERS:
                try:
                    from transformers import AutoTokenizer  # the trainer's: heavy

                    _TOKENIZERS[name] = AutoTokenizer.from_pretrained(name)
                except Exception:
                    log.exception("mentor reward: cannot load the tokenizer %s; truncation is not recorded", name)
                    _TOKENIZERS[name] = None
            tok = _TOKENIZERS[name]
        if tok is None:
            return None
        n = len(tok(response or "", add_special_tokens=False)["input_ids"])
    except Exception:
        count("truncation_count_error")
        return None
    return n >= limit_n - max(4, limit_n // 100)


_DIRS: dict[str, Path | None] = {}
_WARNED: set[str] = set()


def log_dir(beside: str | None) -> Path | None:
    key = f"{os.environ.get('MENTOR_ROLLOUT_DIR', '')}|{beside}"
    if key not in _DIRS:
        _DIRS[key] = resolve_rollout_dir(beside)
        if _DIRS[key] is None and key not in _WARNED:
            _WARNED.add(key)
            log.warning("mentor reward: no MENTOR_ROLLOUT_DIR and no mentor_reward.json beside %s; rollouts are not logged", beside)
    return _DIRS[key]


def score_and_log(
    target: Target,
    response: str,
    prompt: str,
    trainer: str,
    truncated: bool | None = None,
    step: int | None = None,
    beside: str | None = None,
) -> float:
    """Verify `response`, append the rollout record, return correctness (= the reward)."""
    correct = 0.0
    try:
        correct = float(verify(target.domain, response, target.reference)) if target.reference is not None else 0.0
        if target.reference is None:
            count("label_without_reference")
    except Exception:  # verify() already guards; this is the last line of defence
        log.exception("mentor reward: verification failed for %s", target.problem_id)
        count("verify_error")
    reward = correct
    count("scored")
    count("correct", int(correct > 0))
    directory = log_dir(beside)
    if directory is not None:
        try:
            rec = make_record(
                problem_id=target.problem_id,
                round_=target.round,
                domain=target.domain,
                prompt=prompt or "",
                response=response,
                correct=correct,
                reward=reward,
                hint_id=target.hint_id,
                label=target.label_text,
                truncated=truncated,
                step=step,
                trainer=trainer,
            )
            rollout_log(directory, trainer).write(rec)
        except Exception:  # a full disk must not stop training; it is logged loudly
            log.exception("mentor reward: could not log the rollout to %s", directory)
            count("log_error")
    return reward
