"""Hints the policy vouches for: a hint is kept when the policy, re-rolled with it, earns reward.

The method's goal is that a hinted collapsed problem earns non-zero reward again.
With ``vouch:`` in HintConfig (opt-in) the hint stage asks the policy itself:

    candidate 1 = the hint stage's own result for the problem (generated, repaired, or the fallback)
    re-roll it with the policy: `samples` responses, the round's sampling settings, seeds
        disjoint from the evaluation's, the prompt laid out exactly as `mentor build`
        lays it (`build_render.prompt_messages`, the configured placement; placement
        ``assistant``, the default for a vllm policy, renders it with the policy's chat
        template and sends the text)
    any response verified correct (`training.verify`) -> kept: the policy vouched for it
    none -> candidate 2: the stage runs again for the problem with candidate 1 as the
        previous hint (the escalation path a next round takes: "an earlier hint did not
        work, go one step further"; the rules reject a repeat), a fresh seed; and so on,
        up to `candidates`

``pick: first`` keeps the first candidate that earns reward; ``pick: best`` tries all
`candidates` and keeps the one with the most correct re-rolls. A problem no candidate
rescues keeps its best-judged candidate (the highest judge score; the first on a tie or
without scores) and is not marked rescued, so it stays collapsed, its `streak` grows and
the next round escalates from the hint it kept.

Each round of candidates is one `hint_shard` over the problems still unvouched (its waves
are hint-engine calls) and ONE policy call for all of their re-rolls. The row written is
the kept candidate's, with the traces of every candidate before it and one ``vouch``
trace entry per re-roll (correct count, tokens); the ``vouch`` column records what the
policy did (schema HINTS, ``VOUCH``). Counters in stats ``vouch``: problems, rescued,
candidates tried, policy calls, requests and tokens.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.ids import content_hash
from mentor.pipeline.llm import Backend, GenRequest
from mentor.pipeline.prompts import load_tokenizer, render_prompt
from mentor.pipeline.schemas import HINTS, schema_metadata
from mentor.pipeline.stage import Stats
from mentor.stages.build_render import TEXT_PLACEMENTS, prompt_messages, resolve_placement
from mentor.stages.hint.prompt_templates import Templates
from mentor.stages.hint.config import HintConfig, VouchConfig
from mentor.stages.hint.machine import HintStats, hint_shard
from mentor.stages.rollout import policy_tokenizer, problem_seed
from mentor.training.verify import verify

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- seeds


def reroll_seed(cfg: VouchConfig, problem_id: str, candidate: int, j: int) -> int:
    """Seed of re-roll j of candidate `candidate`; never one of `mentor rescue`'s seeds for this problem."""

    taken = {problem_seed(b, problem_id, jj) for b in cfg.avoid_seeds for jj in range(256)}
    salt = 0
    while True:
        s = zlib.crc32(f"vouch|{cfg.seed}|{problem_id}|{candidate}|{j}|{salt}".encode()) & 0x7FFFFFFF
        if s not in taken:
            return s
        salt += 1


# --------------------------------------------------------------------------- one round of re-rolls


def reroll_layout(cfg: VouchConfig, domains: Sequence[str] = ()) -> tuple[str, str | None]:
    """The re-rolls' placement (for prompts of these `domains`) and the tokenizer that renders it (None: sent
    as chat messages)."""

    tok = cfg.tokenizer or policy_tokenizer(cfg.policy.spec())
    try:
        placement = resolve_placement(cfg.placement, tok, domains)
    except ValueError as exc:

        raise ConfigError(f"vouch: {exc} (vouch.tokenizer)") from None
    return placement, (tok if placement in TEXT_PLACEMENTS else None)


def row_domains(rows: Sequence[dict]) -> set[str]:
    return {r.get("domain") or "math" for r in rows}


def reroll_messages(rows: Sequence[dict], hints: Sequence[str], cfg: VouchConfig) -> list[list[dict]]:
    """The policy's prompts: build's layout (the same function `mentor build` and `mentor rescue` use)."""

    placement, tok = reroll_layout(cfg, row_domains(rows))
    return prompt_messages([{"problem": r["problem"], "hint": h, "domain": r.get("domain") or "math"} for r, h in zip(rows, hints)],
                           placement=placement, template=cfg.answer_template if tok else None,
                           system_prompt=cfg.system_prompt, instructions=cfg.instructions)


def reroll(policy: Backend, rows: Sequence[dict], hints: Sequence[str], candidate: int, cfg: VouchConfig,
           verifier: Callable[[str, str, Any], float] | None = None) -> list[dict]:
    """`cfg.samples` re-rolls of each (row, hint) in ONE policy call; per row: correct count and tokens."""
    verifier = verifier or verify
    messages = reroll_messages(rows, hints, cfg)
    _, tok = reroll_layout(cfg, row_domains(rows))
    kwargs = cfg.chat_template_kwargs
    texts = [render_prompt(load_tokenizer(tok), m, kwargs) for m in messages] if tok else [None] * len(messages)
    requests = [GenRequest(id=f"{i}:vouch:{j}", messages=msgs, max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                           top_p=cfg.top_p, seed=reroll_seed(cfg, r["problem_id"], candidate, j), prompt=text,
                           chat_template_kwargs=dict(kwargs) or None)
                for i, (r, msgs, text) in enumerate(zip(rows, messages, texts)) for j in range(cfg.samples)]
    results = policy.generate(requests)

    def check(k: int) -> float:
        r = rows[k // cfg.samples]
        return float(verifier(r.get("domain") or "math", results[k].text, r.get("label")))

    with ThreadPoolExecutor(max_workers=4) as pool:
        scores = list(pool.map(check, range(len(results))))
    out = []
    for i in range(len(rows)):
        mine = range(i * cfg.samples, (i + 1) * cfg.samples)
        out.append({"correct": sum(1 for k in mine if scores[k] > 0),
                    "prompt_tokens": sum(results[k].prompt_tokens for k in mine),
                    "completion_tokens": sum(results[k].completion_tokens for k in mine),
                    "truncated": sum(1 for k in mine if results[k].finish_reason == "length")})
    return out


# --------------------------------------------------------------------------- the shard


def _best_judged(tried: list[dict]) -> dict:
    return max(tried, key=lambda c: (c["row"]["judge_score"] if c["row"]["judge_score"] is not None else float("-inf"),
                                     -c["n"]))


def vouch_shard(rows: Sequence[dict] | pa.Table, cfg: HintConfig, backend: Backend, stats: Stats | None = None,
                progress: Callable[[int, int], None] | None = None, policy: Backend | None = None,
                templates: Any = None) -> pa.Table:
    """`hint_shard` with policy vouching (schema hints, same order as `rows`); `cfg.vouch` must be set."""
    vc: VouchConfig = cfg.vouch  # type: ignore[assignment]
    if isinstance(rows, pa.Table):
        rows = rows.to_pylist()
    st = stats if stats is not None else HintStats()
    t = templates or Templates.load(cfg.templates_dir)
    policy = policy if policy is not None else vc.policy.spec()()
    tried: dict[int, list[dict]] = {i: [] for i in range(len(rows))}
    kept: dict[int, dict] = {}
    pending = list(range(len(rows)))
    for n in range(vc.candidates):
        if not pending:
            break
        # Candidate n+1 is what the stage writes when the earlier ones are the problem's previous hints.
        asked = [dict(rows[i], previous_hints=[*(rows[i].get("previous_hints") or []), *(c["row"]["hint"] for c in tried[i])])
                 for i in pending]
        round_cfg = cfg if n == 0 else cfg.model_copy(update={"seed": cfg.seed + n})
        table = hint_shard(asked, round_cfg, backend, stats=st, templates=t)
        produced = table.to_pylist()
        calls0 = policy.calls
        checks = reroll(policy, asked, [r["hint"] for r in produced], n, vc)
        st.vouch["policy_calls"] += policy.calls - calls0
        st.vouch["policy_requests"] += len(asked) * vc.samples
        still = []
        for i, row, chk in zip(pending, produced, checks):
            st.vouch["candidates"] += 1
            st.vouch["policy_prompt_tokens"] += chk["prompt_tokens"]
            st.vouch["policy_completion_tokens"] += chk["completion_tokens"]
            row["trace"] = [*row["trace"], {"agent": "vouch", "attempt": n, "raw": row["hint"],
                                            "parsed": json.dumps({"correct": chk["correct"], "samples": vc.samples,
                                                                  "truncated": chk["truncated"]}),
                                            "finish_reason": None, "prompt_tokens": chk["prompt_tokens"],
                                            "completion_tokens": chk["completion_tokens"]}]
            tried[i].append({"n": n, "row": row, "correct": chk["correct"]})
            if chk["correct"] > 0 and vc.pick == "first":
                kept[i] = tried[i][-1]
            else:
                still.append(i)
        if progress is not None:
            progress(len(pending) - len(still) if n + 1 < vc.candidates else len(pending), st.waves)
        pending = still
    out = []
    for i in range(len(rows)):
        cands = tried[i]
        choice = kept.get(i)
        if choice is None:
            winners = [c for c in cands if c["correct"] > 0]
            choice = max(winners, key=lambda c: (c["correct"], -c["n"])) if winners else _best_judged(cands)
        rescued = choice["correct"] > 0
        st.vouch["problems"] += 1
        st.vouch["rescued"] += rescued
        if rescued and choice["n"] == 0:
            st.vouch["rescued_by_first"] += 1
        row = dict(choice["row"])
        row["problem_id"] = rows[i]["problem_id"]
        row["hint_id"] = content_hash(row["problem_id"], row["hint"])
        # Every candidate's trace (each ends with its `vouch` entry), in order: the whole path is one read.
        row["trace"] = [e for c in cands for e in c["row"]["trace"]]
        row["vouch"] = {"candidates": len(cands), "kept": choice["n"], "samples": vc.samples, "correct": choice["correct"],
                        "rescued": rescued}
        out.append(row)
    schema = pa.schema(list(HINTS), metadata=schema_metadata("hints"))
    return pa.Table.from_pylist(out, schema=schema)


def per_rescued(stats: dict) -> dict | None:
    """Hint-engine and policy tokens per rescued problem (stats.json ``vouch_per_rescued``)."""
    v = stats.get("vouch") or {}
    if not v.get("problems"):
        return None
    rescued = v.get("rescued", 0)
    hint_tokens = stats.get("prompt_tokens", 0) + stats.get("completion_tokens", 0)
    policy_tokens = v.get("policy_prompt_tokens", 0) + v.get("policy_completion_tokens", 0)
    return {
        "problems": v["problems"],
        "rescued": rescued,
        "rescue_rate": round(rescued / v["problems"], 6),
        "hint_tokens_per_rescued": round(hint_tokens / rescued, 1) if rescued else None,
        "policy_tokens_per_rescued": round(policy_tokens / rescued, 1) if rescued else None,
    }


__all__ = ["per_rescued", "reroll", "reroll_seed", "vouch_shard"]
