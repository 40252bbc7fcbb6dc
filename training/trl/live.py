"""Live hints in TRL 1.16: a ``rollout_func`` for ``GRPOTrainer`` that hints and re-rolls collapsed groups.

TRL's live hook (`TrlLauncher.live`). A round with ``live_hints`` runs the live-hints entry as its process
(``python -m mentor.stages.hint.live trl <train>/trl_round.json``, `mentor.training.trl.launcher.build_command`),
which runs this module's `main` with the hint call (`mentor.training.live_hints.Hinter`; this folder never
imports the hint stage): the TRL round process (`mentor.training.trl.train.main`) with `LiveRollout` as its
rollout function and `LiveReward` as its reward.

TRL's contract (``trl/trainer/grpo_trainer.py``, ``_generate``): ``rollout_func(prompts, trainer)``
receives this process's prompts of the generation batch (the sampler repeats each prompt
``num_generations`` times, in a row) and returns ``prompt_ids``, ``completion_ids`` and ``logprobs``,
one per prompt entry; every other key reaches the reward functions as a column. The trainer then
builds its loss from the returned ``prompt_ids`` as the context of each completion.

`LiveRollout` does, per call (one generation batch):

1. tokenizes the prompts with TRL's own prompt tokenization and generates with TRL's own generation
   (``_tokenize_prompts``, ``_generate_single_turn``: transformers ``generate`` on the trainer's
   model, or TRL's vLLM when ``use_vllm`` is on);
2. scores every completion with mentor's verifiers (the label of each prompt row, as the TRL reward);
3. for each group whose rewards are all 0, within the step's budget, runs the four hint agents on the
   hint engine (the hint call, `Hinter.hint`: the hint stage's machine, Attribution on these
   very rollouts), renders the hinted prompt for the placement, re-rolls the group from it (every hinted
   group of the step in one generation call) and scores the re-rolls; the hinted group (its hinted prompt
   ids) replaces the collapsed one;
4. writes every rollout of the batch (the replaced first pass too) to one rollout shard, temp name
   then rename (`write_shard`), as the reward functions' records plus ``live_*`` fields;
5. returns the rewards as the ``mentor_correct`` column, which `LiveReward` (the round's reward
   function in this mode) hands back to TRL, with the step's live counters as metrics
   (``mentor/live_hint_seconds`` beside TRL's own ``step_time``).

A record's ``live_status``: ``scored`` (the group earned reward), ``collapsed_over_budget``,
``collapsed_offline_hint`` (its prompt already carries a hint), ``collapsed_no_problem`` (a text
prompt: no problem text to hint), ``collapsed_hint_failed`` (the hint engine answered nothing),
``collapsed_eval`` (an evaluation batch: never hinted), ``hinted`` (the first pass of a group that was
re-rolled; not trained on) and ``rerolled`` (trained on).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from mentor.pipeline.errors import DataError, EngineError
from mentor.pipeline.llm import Backend
from mentor.pipeline.prompts import render_prompt
from mentor.pipeline.schemas import parse_prompt_label
from mentor.training.live_hints import Hinter, HinterFactory, LiveHintsConfig, collapsed_row, live_score, problem_text, with_hint_id
from mentor.training.reward_core import count, target_from_label
from mentor.training.rollout_log import make_record
from mentor.training.trl.reward import TrlReward

log = logging.getLogger(__name__)

SHARD_PREFIX = "trl-live-"
TMP_PREFIX = ".trl-live-"
REWARD_COLUMN = "mentor_correct"
STATS_COLUMN = "mentor_live"


def prompt_key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)


def label_index(rows: list[dict[str, Any]]) -> dict[str, str]:
    """prompt -> label of the round's rows (the rollout function sees prompts only).

    Two rows with one prompt and two different references would score one completion two ways: a `DataError`."""
    out: dict[str, str] = {}
    for row in rows:
        key = prompt_key(row["prompt"])
        if key in out and out[key] != row["label"]:
            a, b = _reference(out[key]), _reference(row["label"])
            if a != b:
                raise DataError(f"two prompt rows have the same prompt and different references ({a!r}, {b!r}): "
                                "live hints cannot tell which label a completion is scored against; deduplicate the prompts")
            count("live_duplicate_prompt")
            continue
        out[key] = row["label"]
    return out


def _reference(label: str) -> Any:
    try:
        obj = parse_prompt_label(label)
    except (TypeError, ValueError):
        return label
    return {k: v for k, v in obj.items() if k not in ("problem_id", "hint_id", "round")}


def clear_temp_shards(directory: str | os.PathLike) -> int:
    """Temp shards of a killed step (never renamed into place): removed before the round logs anew."""
    d = Path(directory)
    stale = sorted(d.glob(f"{TMP_PREFIX}*.tmp")) if d.is_dir() else []
    for f in stale:
        f.unlink()
    return len(stale)


def write_shard(directory: str | os.PathLike, records: list[dict[str, Any]], step: int) -> Path | None:
    """All of a batch's records in one shard, written under a temp name and renamed: a kill leaves none or all."""
    if not records:
        return None
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    name = f"trl-live-{socket.gethostname().split('.')[0] or 'host'}-{pid}-s{step:06d}-{uuid.uuid4().hex[:8]}.jsonl"
    now = time.time()
    lines = [json.dumps(rec | {"ts": now, "pid": pid, "seq": i}, ensure_ascii=False, allow_nan=False) for i, rec in enumerate(records)]
    tmp = d / f".{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
        fh.flush()
        if os.environ.get("MENTOR_ROLLOUT_FSYNC", "") not in ("", "0"):
            os.fsync(fh.fileno())
    os.replace(tmp, d / name)
    return d / name


class LiveRollout:
    """``GRPOTrainer(rollout_func=LiveRollout(...))`` (see the module docstring)."""

    def __init__(self, cfg: LiveHintsConfig, rows: list[dict[str, Any]], tokenizer: Any, rollout_dir: str | os.PathLike | None,
                 hinter: Hinter, backend: Backend | None = None) -> None:
        self.cfg = cfg
        self.labels = label_index(rows)
        self.tokenizer = tokenizer
        self.scorer = TrlReward(tokenizer=tokenizer)  # its prompt text and truncation rule, as the offline reward
        self.rollout_dir = Path(rollout_dir) if rollout_dir else None
        self._backend = backend
        self.hinter = hinter  # built before the first step: its solutions file read, a missing one fails the start
        self.totals: Counter = Counter()
        self.steps: list[dict[str, Any]] = []  # one summary per call (tests, metrics.json)
        if self.rollout_dir is not None:
            clear_temp_shards(self.rollout_dir)

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = self.cfg.backend.spec()()
        return self._backend

    # -- TRL's call

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        g = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        groups = _groups(prompts, g)
        step = int(getattr(trainer.state, "global_step", 0) or 0)
        t0 = time.perf_counter()
        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)  # TRL's own tokenization and generation (no copy of them)
        completion_ids, logprobs = trainer._generate_single_turn(prompt_ids, None, {}, g)
        prompt_ids, completion_ids = [list(p) for p in prompt_ids], [list(c) for c in completion_ids]
        logprobs = list(logprobs) if logprobs is not None else None
        texts = [self.prompt_text(p) for p in prompts]
        labels = [self.labels.get(prompt_key(p)) for p in prompts]
        rewards = [self.score(labels[i], texts[i], completion_ids[i]) for i in range(len(prompts))]

        status = ["scored"] * len(groups)
        collapsed: dict[int, dict[str, Any]] = {}
        for k, (a, b) in enumerate(groups):
            if any(r > 0 for r in rewards[a:b]):
                continue
            target = target_from_label(labels[a], texts[a])
            problem = problem_text(prompts[a], target.domain, self.cfg.instructions)
            if not trainer.model.training:  # evaluation measures the policy as it is: no hint
                status[k] = "collapsed_eval"
            elif target.hint_id and not self.cfg.hint_prompts_with_hints:
                status[k] = "collapsed_offline_hint"
            elif problem is None or labels[a] is None:
                status[k] = "collapsed_no_problem"
            else:
                responses = [self.decode(c) for c in completion_ids[a:b]]
                collapsed[k] = collapsed_row(target.problem_id, target.round, target.domain, problem, target.label_text, responses)
        gen_s = time.perf_counter() - t0

        found = None
        if collapsed:
            try:
                found = self.hinter.hint(collapsed, self.backend)
            except EngineError as exc:
                log.error("live hints step %d: the hint engine answered none of %d collapsed group(s) (%s); they go on unhinted",
                          step, len(collapsed), exc)
                self.totals["hint_engine_errors"] += 1
        hinted = found.hints if found else {}
        for k in collapsed:
            if k in hinted:
                status[k] = "hinted"
            else:
                status[k] = "collapsed_over_budget" if found else "collapsed_hint_failed"

        records = [self.record(labels[i], texts[i], completion_ids[i], rewards[i], step, status[k], None, False)
                   for k, (a, b) in enumerate(groups) for i in range(a, b) if k not in hinted]
        t1 = time.perf_counter()
        rescued = 0
        # Every hinted group re-rolled in one generation (one call per group took 3-4x the first pass on CPU):
        # each group's hinted prompt repeated over its slots, in group order, as TRL lays out a step's prompts.
        hinted_prompts = {k: self.hinted_prompt(trainer, collapsed[k], hint["hint"], prompts[groups[k][0]])
                          for k, hint in sorted(hinted.items())}
        rerolls = [ids for k, (ids, _) in hinted_prompts.items() for _ in range(*groups[k])]
        new_ids, new_lp = trainer._generate_single_turn(rerolls, None, {}, g) if rerolls else ([], None)
        offset = 0
        for k, hint in sorted(hinted.items()):
            a, b = groups[k]
            row = collapsed[k]
            records += [self.record(labels[i], texts[i], completion_ids[i], rewards[i], step, "hinted", hint, False)
                        for i in range(a, b)]
            ids, text = hinted_prompts[k]
            label = with_hint_id(labels[a], hint["hint_id"])
            for j, i in enumerate(range(a, b), start=offset):
                prompt_ids[i], completion_ids[i] = list(ids), list(new_ids[j])
                if logprobs is not None:
                    logprobs[i] = list(new_lp[j]) if new_lp is not None else None
                texts[i], labels[i] = text, label
                rewards[i] = self.score(label, text, completion_ids[i], problem=row["problem"])
                records.append(self.record(label, text, completion_ids[i], rewards[i], step, "rerolled", hint, True,
                                           problem=row["problem"]))
            offset += b - a
            rescued += int(any(r > 0 for r in rewards[a:b]))
        reroll_s = time.perf_counter() - t1

        if self.rollout_dir is not None:
            write_shard(self.rollout_dir, records, step)
        summary = {
            "step": step, "groups": len(groups), "collapsed": sum(s != "scored" for s in status),
            "hinted": len(hinted), "rescued": rescued,
            "over_budget": status.count("collapsed_over_budget"), "offline_hint": status.count("collapsed_offline_hint"),
            "no_problem": status.count("collapsed_no_problem"), "hint_failed": status.count("collapsed_hint_failed"),
            "hint_seconds": round(found.seconds, 3) if found else 0.0, "generate_seconds": round(gen_s, 3),
            "reroll_seconds": round(reroll_s, 3), "hinted_groups": [collapsed[k]["problem_id"] for k in sorted(hinted)],
            "statuses": {collapsed[k]["problem_id"]: hinted[k]["status"] for k in sorted(hinted)},
        }
        self.steps.append(summary)
        self.totals.update({k: v for k, v in summary.items() if isinstance(v, int) and k != "step"})
        log.info("live hints step %d: %d group(s), %d collapsed, %d hinted and re-rolled (%d earned reward), %d over budget, "
                 "%d with an offline hint, %d without a problem text, %d hint engine failure(s); hint engine %.1f s, "
                 "generation %.1f s, re-roll %.1f s; hinted: %s", step, summary["groups"], summary["collapsed"], summary["hinted"],
                 rescued, summary["over_budget"], summary["offline_hint"], summary["no_problem"], summary["hint_failed"],
                 summary["hint_seconds"], gen_s, reroll_s, ", ".join(f"{p} ({s})" for p, s in summary["statuses"].items()) or "-")
        metrics = {f"mentor/live_{k}": float(summary[k]) for k in
                   ("collapsed", "hinted", "rescued", "over_budget", "hint_seconds", "reroll_seconds")}
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs,
                REWARD_COLUMN: rewards, STATS_COLUMN: metrics}

    # -- pieces

    def prompt_text(self, prompt: Any) -> str:
        return self.scorer.prompt_text(prompt)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def score(self, label: str | None, prompt: str, ids: list[int], problem: str | None = None) -> float:
        return live_score(label, prompt, self.decode(ids))

    def record(self, label: str | None, prompt: str, ids: list[int], reward: float, step: int, status: str,
               hint: dict[str, Any] | None, rerolled: bool, problem: str | None = None) -> dict[str, Any]:
        target = target_from_label(label, prompt)
        rec = make_record(problem_id=target.problem_id, round_=target.round, domain=target.domain, prompt=prompt,
                          response=self.decode(ids), correct=reward, reward=reward, hint_id=target.hint_id,
                          label=target.label_text, truncated=self.scorer.truncated(ids), step=step, trainer="trl")
        if problem is not None:
            rec["problem"] = problem  # the problem without the hint, for mine
        rec["live_status"] = status
        rec["live_rerolled"] = rerolled
        if hint is not None:
            rec |= {"live_hint": hint["hint"], "live_hint_id": hint["hint_id"], "live_hint_status": hint["status"]}
        return rec

    def hinted_prompt(self, trainer: Any, row: dict[str, Any], hint: str, original: Any) -> tuple[list[int], str]:
        """The hinted prompt's ids (as TRL tokenizes a chat prompt; placement assistant: the rendered text, its
        special tokens as the template writes them, so one BOS) and its text as the model sees it."""
        messages = self.hinter.messages(row["problem"], hint, row["domain"], original)
        if messages[-1]["role"] == "assistant":
            text = render_prompt(self.tokenizer, messages)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            return list(ids), text
        ids, _, _ = trainer._tokenize_prompts([messages])
        return list(ids[0]), self.prompt_text(messages)


def _groups(prompts: list[Any], g: int) -> list[tuple[int, int]]:
    """The (start, end) of each group: `g` equal prompts in a row, as TRL's RepeatSampler lays them out."""
    if g < 1 or len(prompts) % g:
        raise RuntimeError(f"live hints: {len(prompts)} prompts is not a whole number of groups of {g}; live hints need "
                           "every group in one process (num_processes 1)")
    out = [(a, a + g) for a in range(0, len(prompts), g)]
    for a, b in out:
        first = prompt_key(prompts[a])
        if any(prompt_key(p) != first for p in prompts[a + 1:b]):
            raise RuntimeError("live hints: a group's prompts differ; TRL did not hand over whole groups in a row")
    return out


class LiveReward:
    """The round's reward function with live hints: the rollout function already scored every completion."""

    __name__ = "mentor_correct"  # the same metric names as the offline reward (rewards/mentor_correct/mean)

    def __call__(self, completions: list[Any] | None = None, log_metric: Any = None, **kwargs: Any) -> list[float]:
        rewards = kwargs.get(REWARD_COLUMN)
        if rewards is None:
            raise RuntimeError("live hints: no mentor_correct column reached the reward; the rollout function is not LiveRollout")
        stats = kwargs.get(STATS_COLUMN)
        if callable(log_metric) and stats:
            for key, value in (stats[0] if isinstance(stats, list) else stats).items():
                log_metric(key, value)
        return [float(r) for r in rewards]


def live_hooks(cfg: Any, rows: list[dict[str, Any]], tokenizer: Any, hinter: HinterFactory) -> tuple[LiveRollout, LiveReward]:
    """The TRL round process's hooks (`mentor.training.trl.train.main`'s ``live``): the rollout function and reward."""
    from mentor.training.rollout_log import ENV_DIR

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16: mentor pins it
    return LiveRollout(cfg.live_hints, rows, tokenizer, os.environ.get(ENV_DIR), hinter(cfg.live_hints)), LiveReward()


def main(argv: list[str], hinter: HinterFactory) -> int:
    """The round process with live hints (run by the live-hints entry, which hands over the hint call's factory)."""
    from mentor.training.trl.train import main as train_main

    return train_main(argv, live=lambda cfg, rows, tokenizer: live_hooks(cfg, rows, tokenizer, hinter))


__all__ = ["LiveReward", "LiveRollout", "clear_temp_shards", "label_index", "live_hooks", "main", "write_shard"]
