"""Offline rollouts through the LLM backend seam, and the sampler the rescue check shares.

`mentor rollout PROMPTS --policy MODEL --k 4 --out DIR` samples k responses per
prompt, verifies each with `mentor.training.verify`, and writes canonical
rollout shards (schema ROLLOUTS, source ``mentor-rollout``): the loop can run
without a trainer, and hints can be checked before training.

`mentor rescue` (`mentor.stages.rescue`) re-rolls collapsed problems with and
without hints through the same sampler (`run_shards`).

Inputs of `rollout`: PROMPTS shards (from `mentor build`; the label carries
problem id, hint id and round), a PROBLEMS dataset (each problem becomes one
user message with the domain's instruction), or a bundled set name
(``gsm8k``, ``math500``, ``humaneval``). Inputs are read and checked before any
engine starts.

A rollout that got no response (a server's error after its retries, a prompt
longer than the engine's context) is never written as a failed rollout: its
shard fails with the reason, and a rerun samples it again.

Shards. The prompts are sampled in shards of ``shard_size`` prompts, one
engine call each (vLLM schedules the whole shard), in this process, as
resumable shards (`mentor.pipeline.shards`: ``part-NNNNN.parquet`` with a done
marker under ``_done/`` keyed by the shard's prompts and position, the sampling
settings and the model); a rerun (after a crash, a kill, or an engine failure,
which is reported as one error naming the shard) reuses the finished shards and
samples only the rest. Seeds depend on a prompt's position in the whole set
(rollout) or on its problem id (rescue), never on the shard size.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field
from tqdm.auto import tqdm

from mentor.pipeline.backends import kind as backend_kind
from mentor.pipeline.backends import kinds as backend_kinds
from mentor.pipeline.errors import ConfigError, DataError, EngineError
from mentor.pipeline.llm import Backend, GenRequest, OnDone, describe_backend
from mentor.pipeline.outdir import Owns
from mentor.pipeline.prompts import INSTRUCTIONS, answer_template
from mentor.pipeline.schemas import ROLLOUTS, SCHEMA_VERSION
from mentor.pipeline.shards import Shard, ShardPlan
from mentor.pipeline.stage import Context, Source, Stage, Stats, StatsLayout
from mentor.stages.rollout_prompts import PromptItem, is_dataset, load_prompt_items, resolve_sources
from mentor.stages.build_render import (
    DEFAULT_PLACEMENT,
    PLACEMENTS,
    TEXT_PLACEMENTS,
    hint_template,
    resolve_placement,
)
from mentor.training.prompt_format import sampling_template_kwargs

log = logging.getLogger(__name__)

SOURCE = "mentor-rollout"
UNHINTED = "unhinted"
# The largest base seed: rollout seeds are taken modulo 2**31 - 1 (what every engine takes), so base seeds stay below it.
SEED_MAX = 2**31 - 2


class RolloutConfig(BaseModel):
    """Sampling settings of `mentor rollout` / `mentor rescue`."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(4, ge=1, description="Rollouts per prompt.")
    max_tokens: int = Field(1024, ge=1, description="Max new tokens per rollout.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (GRPO trains at 1.0).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="Base seed, 0 to 2**31 - 2; rollout j of prompt i gets its own "
                      "derived seed (modulo 2**31 - 1: a larger base would repeat a smaller one's seeds).")
    limit: int | None = Field(None, ge=1, description="Only the first N prompts / problems (demos, tests).")
    round: int | None = Field(None, ge=0, description="Round stamped on the rollouts (default: from the prompt label, else 0).")
    verify_workers: int = Field(4, ge=1, description="Threads verifying responses (code runs in sandbox processes).")
    placement: Literal[PLACEMENTS] | None = Field(  # type: ignore[valid-type]
        None, description=f"Where the hint goes, as in `mentor build`: {', '.join(PLACEMENTS)} (default: assistant where "
        f"the policy's tokenizer is known, i.e. a vllm policy or --tokenizer, for math; else {DEFAULT_PLACEMENT}).")
    tokenizer: str | None = Field(None, description="Tokenizer whose chat template renders placement assistant "
                                  "(default: the vllm policy's own).")
    answer_template: str | None = Field(None, description="How the hint opens the answer (placement assistant), as "
                                        "`mentor build --answer-template`.")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Variables for the policy's chat template, the same the trainer passes (e.g. "
        "{enable_thinking: false} for Qwen3's non-thinking mode): sent with every chat prompt and used to render "
        "placement assistant. {}: the template's defaults.")
    hint_template: str | None = Field(None, description="User message of a hinted prompt ({hint}, {problem}); default: the placement's.")
    instructions: dict[str, str] = Field(default_factory=lambda: dict(INSTRUCTIONS), description="Instruction appended per domain.")
    shard_size: int = Field(256, ge=1, description="Prompts per shard (one engine call, one file, one done marker).")

    def semantic(self) -> dict[str, Any]:
        """The settings that change outputs (not how the work is split).

        The hinted layout enters as the resolved user template (plus ``placement`` only for
        "system" and the text placements, with their tokenizer and answer template), so outputs
        of runs made before placements existed keep their keys.
        """
        placement = self.placement or DEFAULT_PLACEMENT
        out = self.model_dump(mode="json", exclude={"shard_size", "verify_workers", "placement", "tokenizer", "answer_template",
                                                    "chat_template_kwargs"})
        if self.chat_template_kwargs:
            out["chat_template_kwargs"] = self.chat_template_kwargs
        out["hint_template"] = hint_template(placement, self.hint_template)
        if placement == "system":
            out["placement"] = placement
        if placement in TEXT_PLACEMENTS:
            out |= {"placement": placement, "tokenizer": self.tokenizer, "answer_template": answer_template(self.answer_template)}
        return out

    def for_policy(self, backend: Any, placements: Sequence[str | None] = (), domains: Sequence[str] = ()) -> "RolloutConfig":
        """This config with its placement and tokenizer settled for this policy backend: the tokenizer is
        --tokenizer, else the vllm policy's model; the placement is asked for, else assistant where a tokenizer
        is known and no prompt is a code task (`domains`). A text placement (here or in `placements`, e.g. a
        rescue arm's) without a tokenizer is a `ConfigError`."""
        tok = self.tokenizer or policy_tokenizer(backend)
        try:
            placement = resolve_placement(self.placement, tok, domains)
            for p in placements:
                resolve_placement(p, tok)
        except ValueError as exc:
            raise ConfigError(f"{exc} (the {getattr(backend, 'kind', None) or getattr(backend, 'name', 'policy')} backend "
                              "gives none)") from None
        uses_text = any(p in TEXT_PLACEMENTS for p in (placement, *placements))
        return self.model_copy(update={"placement": placement, "tokenizer": tok if uses_text else self.tokenizer})


def policy_tokenizer(backend: Any) -> str | None:
    """The tokenizer of a policy (a `BackendSpec` or an engine) whose kind runs its model here (`BackendKind.tokenizer`):
    its model, or the embedded one; None for a server's."""
    kind = getattr(backend, "kind", None) or getattr(backend, "name", None)
    if kind not in backend_kinds():  # a backend object of the caller's own
        return None
    return backend_kind(kind).tokenizer(getattr(backend, "model", None))


# --------------------------------------------------------------------------- sampling + verifying


def _seed(base: int, i: int, j: int, k: int) -> int:
    return (base * 1_000_003 + i * k + j) % (SEED_MAX + 1)


def problem_seed(base: int, problem_id: str, j: int) -> int:
    """Seed of rollout j of a problem, the same in every rescue arm (a paired comparison)."""
    return zlib.crc32(f"{base}|{problem_id}|{j}".encode()) & 0x7FFFFFFF


SeedFn = Callable[[int, PromptItem, int], int]


def sample_and_verify(
    backend: Backend,
    items: Sequence[PromptItem],
    cfg: RolloutConfig,
    verifier: Callable[[str, str, str | None], float] | None = None,
    first_index: int = 0,
    seed_fn: SeedFn | None = None,
    on_done: OnDone | None = None,
) -> list[dict[str, Any]]:
    """k rollouts per item in ONE backend call, each verified; rows in item order, then sample order.

    `first_index` is the position of ``items[0]`` in the whole set (seeds
    depend on it); `seed_fn(i, item, j)` replaces the positional seeds;
    `on_done(n)` is told as rollouts finish sampling (progress bars).
    """
    if verifier is None:
        from mentor.training.verify import verify as verifier  # noqa: N813
    seed_of = seed_fn or (lambda i, item, j: _seed(cfg.seed, i, j, cfg.k))
    requests = [
        GenRequest(
            id=f"{i}:{j}",
            messages=item.messages,
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            seed=seed_of(first_index + i, item, j),
            chat_template_kwargs=dict(cfg.chat_template_kwargs) or None,
            prompt=item.prompt,
        )
        for i, item in enumerate(items)
        for j in range(cfg.k)
    ]
    t0 = time.monotonic()
    results = backend.generate(requests, on_done=on_done)
    log.info("sampled %d rollouts in %.1fs", len(results), time.monotonic() - t0)
    missing = [(req, res) for req, res in zip(requests, results) if res.finish_reason == "error"]
    if missing:
        # A rollout that never got a response is not a failed rollout: scored 0 it would make a collapsed problem.
        req, res = missing[0]
        raise EngineError(f"{len(missing)} of {len(requests)} rollouts got no response from the model (e.g. problem "
                          f"{items[int(req.id.split(':')[0])].problem_id}: {res.error or 'no reason given'}); "
                          "no rollout of these prompts is written")
    pairs = list(zip(requests, results))

    def check(pair) -> float:
        req, res = pair
        item = items[int(req.id.split(":")[0])]
        return float(verifier(item.domain, res.text, item.reference))

    with ThreadPoolExecutor(max_workers=cfg.verify_workers) as pool:
        scores = list(pool.map(check, pairs))
    rows = []
    for (req, res), correct in zip(pairs, scores):
        i, j = (int(x) for x in req.id.split(":"))
        item = items[i]
        rows.append(
            {
                "problem_id": item.problem_id,
                "round": item.round,
                "sample_idx": item.arm_index * cfg.k + j,
                "problem": item.problem,
                "prompt": item.prompt if item.prompt is not None else "\n\n".join(m["content"] for m in item.messages),
                "response": res.text,
                "correct": correct,
                "reward": correct,
                "hint_id": item.hint_id,
                "domain": item.domain,
                "label": item.reference,
                "source": SOURCE,
                "truncated": res.finish_reason == "length",
                "step": None,
                "_prompt_tokens": res.prompt_tokens,
                "_completion_tokens": res.completion_tokens,
            }
        )
    return rows


def _rollouts_table(rows: list[dict[str, Any]]) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in ROLLOUTS}
    return pa.Table.from_pydict(cols, schema=pa.schema([f.with_nullable(True) for f in ROLLOUTS]))


def _number_repeats(items: list[PromptItem]) -> None:
    """Two prompts of one problem (e.g. build --mode both) must not share (problem_id, round, sample_idx):
    the n-th prompt of a problem gets samples n*k .. n*k+k-1."""
    seen: dict[tuple[str, int], int] = {}
    for it in items:
        key = (it.problem_id, it.round)
        it.arm_index = seen.get(key, 0)
        seen[key] = it.arm_index + 1


def _items_view(item: PromptItem) -> list:
    """What a rollout shard's output depends on, of one prompt item (its done marker's key hashes it)."""
    view = [item.messages, item.domain, item.reference, item.problem_id, item.hint_id, item.round, item.arm]
    return view if item.prompt is None else [*view, item.prompt]


@contextmanager
def heartbeat(bar: Any, every: float = 10.0):
    """Redraw `bar` every `every` seconds while an engine call runs, so its clock moves (tqdm redraws only on updates)."""
    if bar.disable:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            bar.refresh()

    t = threading.Thread(target=beat, name="rollout-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


@dataclass
class ShardRun:
    """What the sharded sampler did: rows of every shard (read back from its Parquet) and counters."""

    rows: list[dict[str, Any]]
    shards: int = 0
    computed: int = 0
    engine_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str | None = None


class _Engine:
    """The backend, built (a `BackendSpec` called) the first time a shard needs sampling, then kept."""

    def __init__(self, backend: Backend | Callable[[], Backend]) -> None:
        self.factory = backend
        self.engine: Backend | None = backend if hasattr(backend, "generate") else None  # type: ignore[assignment]

    def get(self, bar: Any) -> Backend:
        if self.engine is None:
            bar.set_postfix_str("starting the engine", refresh=True)
            self.engine = self.factory()  # type: ignore[operator]
        return self.engine


def _sample_shard(shard: Shard, cfg: RolloutConfig, engine: _Engine, seed_fn: SeedFn | None, bar: Any) -> tuple[pa.Table, dict]:
    """One shard's rollouts (one engine call) and what its done marker records (token counts, model)."""
    backend = engine.get(bar)
    items = shard.items
    bar.set_postfix_str(f"sampling shard {shard.index + 1}/{shard.total} ({len(items) * cfg.k} rollouts)", refresh=True)
    try:
        with heartbeat(bar):
            rows = sample_and_verify(backend, items, cfg, first_index=shard.start, seed_fn=seed_fn, on_done=bar.update)
    except EngineError as exc:
        raise shard.failure(exc, f"{len(items)} prompts from {items[0].problem_id}",
                            kept=f"{shard.index} finished shard(s) are kept in {shard.path.parent}") from exc
    tokens = [[r["_prompt_tokens"], r["_completion_tokens"]] for r in rows]
    return _rollouts_table(rows), {"prompt_tokens": sum(t[0] for t in tokens), "completion_tokens": sum(t[1] for t in tokens),
                                   "tokens": tokens, "model": getattr(backend, "model", None)}


def run_shards(
    stage: str,
    items: list[PromptItem],
    cfg: RolloutConfig,
    backend: Backend | Callable[[], Backend],
    parts_dir: Path,
    seed_fn: SeedFn | None = None,
    progress: bool = False,
) -> ShardRun:
    """Sample `items` shard by shard, in this process, into resumable shards of `parts_dir` (`mentor.pipeline.shards`).

    The engine is built (a `BackendSpec` is called) only when a shard needs sampling.
    `progress`: a bar of rollouts on stderr, moved as rollouts finish (the server and vLLM
    backends tell as each request finishes), its postfix naming the shard being sampled.
    """
    plan = ShardPlan(parts_dir, stage, items, cfg.shard_size, dataset="rollouts", view=_items_view, by_position=True,
                     config={"stage": stage, "sampling": cfg.semantic(), "backend": describe_backend(backend), "schema": SCHEMA_VERSION})
    out = ShardRun(rows=[])

    def each(shard, res):
        rows = pl.read_parquet(shard.path).to_dicts()
        bar.update(len(out.rows) + len(rows) - bar.n)  # a reused shard, or what the backend did not tell
        out.rows.extend(rows)
        out.shards += 1
        out.prompt_tokens += res.record["prompt_tokens"]
        out.completion_tokens += res.record["completion_tokens"]
        out.model = out.model or res.record.get("model")
        if not res.reused:
            out.computed += 1
            out.engine_calls += 1
            bar.set_postfix_str(f"{shard.index + 1}/{shard.total} shards", refresh=True)

    with tqdm(total=len(items) * cfg.k, desc=stage, unit="rollout", disable=not progress, dynamic_ncols=True) as bar:
        plan.complete(_sample_shard, cfg, _Engine(backend), seed_fn, bar, each=each)  # shards of an earlier run removed
    return out


ROLLOUT_STATS = StatsLayout(
    counters=("prompts", "problems", "rollouts", "correct", "collapsed", "all_correct", "truncated", "prompt_tokens",
              "completion_tokens", "engine_calls", "shards", "shards_reused"),
    values={"schema_version": SCHEMA_VERSION, "k": None, "mean_correct": 0.0, "model": None, "seconds": 0.0, "inputs": [],
            "config": {}},
    logger=__name__,
)


class RolloutInputs(BaseModel):
    """What `mentor rollout` reads: prompt shards, a problems dataset, or a bundled set name."""

    model_config = ConfigDict(extra="forbid")

    prompts: list[Source]


class RolloutStage(Stage):
    """`mentor rollout`: writes ``part-NNNNN.parquet`` (ROLLOUTS) and ``stats.json``; resumable by shard."""

    name = "rollout"
    Inputs = RolloutInputs
    Config = RolloutConfig
    owns = Owns(("stats.json", "_done"), shards=True)
    staged = False
    needs_engine = True
    summary = ("problems", "rollouts", "mean_correct", "collapsed")

    def run(self, inputs: RolloutInputs, cfg: RolloutConfig, out_dir: Path, ctx: Context) -> Stats:
        sources, backend = inputs.prompts, ctx.engine("rollout")
        cfg = cfg.model_copy(update={"chat_template_kwargs": sampling_template_kwargs(cfg.chat_template_kwargs, sources)})
        items = load_prompt_items(sources, cfg)
        if not items:
            raise DataError(f"no prompts in {', '.join(map(str, sources))}")
        _number_repeats(items)
        t0 = time.monotonic()
        run = run_shards("rollout", items, cfg, backend, out_dir, progress=ctx.progress)
        rows = run.rows
        frame = pl.DataFrame({"pid": [r["problem_id"] for r in rows], "c": [r["correct"] for r in rows]})
        per = frame.group_by("pid").agg(pl.col("c").max().alias("best"), pl.col("c").min().alias("worst"))
        stats = ROLLOUT_STATS(
            k=cfg.k, mean_correct=round(float(frame["c"].mean()), 6) if rows else 0.0,
            model=run.model or getattr(backend, "model", None), seconds=round(time.monotonic() - t0, 3),
            inputs=[str(s) for s in sources], config=cfg.model_dump(mode="json"),
        )
        stats.merge({
            "prompts": len(items),
            "problems": per.height,
            "rollouts": len(rows),
            "correct": int(sum(r["correct"] > 0 for r in rows)),
            "collapsed": int((per["best"] <= 0).sum()),
            "all_correct": int((per["worst"] > 0).sum()),
            "truncated": int(sum(bool(r["truncated"]) for r in rows)),
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "engine_calls": run.engine_calls,
            "shards": run.shards,
            "shards_reused": run.shards - run.computed,
        })
        return stats


STAGE = ROLLOUT = RolloutStage()


__all__ = [
    "SEED_MAX",
    "ROLLOUT",
    "ROLLOUT_STATS",
    "STAGE",
    "RolloutInputs",
    "RolloutStage",
    "PromptItem",
    "RolloutConfig",
    "is_dataset",
    "load_prompt_items",
    "policy_tokenizer",
    "problem_seed",
    "resolve_sources",
    "run_shards",
    "sample_and_verify",
]
