"""Offline rollouts and the rescue check, through the LLM backend seam.

`mentor rollout PROMPTS --policy MODEL --k 4 --out DIR` samples k responses per
prompt, verifies each with `mentor.training.verify`, and writes canonical
rollout shards (schema ROLLOUTS, source ``mentor-rollout``): the loop can run
without a trainer, and hints can be checked before training.

`mentor rescue --collapsed C --hints H --policy MODEL --k 4 --out DIR` re-rolls
every collapsed problem under several *arms* and reports, per arm, how many
collapsed problems now get at least one correct rollout. The arm
``unhinted`` (the plain problem) is always there; ``--hints H`` adds the arm
``hinted``, ``--arm NAME=H`` any named one (e.g. one per hint-stage ablation).
A hinted prompt has the layout `mentor build` writes, through the same function
(`build_render.prompt_messages`: the hint before or after the problem, or in the
system message, as ``placement`` says; per arm with ``arm_placements``). Only
problems with a hint in every arm are re-rolled, and rollout j of a problem has
the same seed in every arm, so the arms are a paired comparison: same problems, same seeds, one engine batch.
Outputs: ``DIR/rescue.parquet`` (one row per problem; per arm ``correct_<arm>``,
``rescued_<arm>``, ``mean_correct_<arm>``, ``hint_id_<arm>``), ``DIR/rescue.json``
(totals and rates per arm) and the rollouts in ``DIR/rollouts/`` (arm a's
sample j has ``sample_idx = a * k + j``; unhinted rows have no ``hint_id``).

`--collapsed` may also be a problems dataset or a bundled set name: then each
of its problems that has a hint is re-rolled.

Inputs of `rollout`: PROMPTS shards (from `mentor build`; the label carries
problem id, hint id and round), a PROBLEMS dataset (each problem becomes one
user message with the domain's instruction), or a bundled set name
(``gsm8k``, ``math500``, ``humaneval``). Inputs are read and checked before any
engine starts.

Shards. The prompts are sampled in shards of ``shard_size`` prompts, one
engine call each (vLLM schedules the whole shard). Each shard is written
atomically with a done marker keyed by its prompts, the sampling settings and
the model; a rerun (after a crash, a kill, or an engine failure, which is
reported as one error naming the shard) reuses the finished shards and
samples only the rest. Seeds depend on a prompt's position in the whole set
(rollout) or on its problem id (rescue), never on the shard size.
"""

from __future__ import annotations

import json
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

from mentor.pipeline.errors import ConfigError, DataError, EngineError
from mentor.pipeline.ids import content_hash
from mentor.pipeline.io import (
    config_hash,
    read_dataset,
    read_parquet_schema,
    resolve_inputs,
    write_json_atomic,
    write_parquet_atomic,
)
from mentor.pipeline.llm import Backend, GenRequest, release_engines
from mentor.pipeline.prompts import INSTRUCTIONS
from mentor.pipeline.schemas import SCHEMA_VERSION, check_schema, parse_prompt_label
from mentor.pipeline.stage import read_done, write_done, write_stats
from mentor.stages.build_render import DEFAULT_PLACEMENT, PLACEMENTS, hint_template, prompt_messages
from mentor.training.verify import reference_of

log = logging.getLogger(__name__)

SOURCE = "mentor-rollout"
UNHINTED = "unhinted"


class RolloutConfig(BaseModel):
    """Sampling settings of `mentor rollout` / `mentor rescue`."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(4, ge=1, description="Rollouts per prompt.")
    max_tokens: int = Field(1024, ge=1, description="Max new tokens per rollout.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (GRPO trains at 1.0).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    seed: int = Field(0, description="Base seed; rollout j of prompt i gets its own derived seed.")
    limit: int | None = Field(None, ge=1, description="Only the first N prompts / problems (demos, tests).")
    round: int | None = Field(None, ge=0, description="Round stamped on the rollouts (default: from the prompt label, else 0).")
    verify_workers: int = Field(4, ge=1, description="Threads verifying responses (code runs in sandbox processes).")
    placement: Literal[PLACEMENTS] = Field(  # type: ignore[valid-type]
        DEFAULT_PLACEMENT, description=f"Where the hint goes, as in `mentor build`: {', '.join(PLACEMENTS)}.")
    hint_template: str | None = Field(None, description="User message of a hinted prompt ({hint}, {problem}); default: the placement's.")
    instructions: dict[str, str] = Field(default_factory=lambda: dict(INSTRUCTIONS), description="Instruction appended per domain.")
    shard_size: int = Field(256, ge=1, description="Prompts per shard (one engine call, one file, one done marker).")

    def semantic(self) -> dict[str, Any]:
        """The settings that change outputs (not how the work is split).

        The hinted layout enters as the resolved user template (plus ``placement`` only for
        "system"), so outputs of runs made before placements existed keep their keys.
        """
        out = self.model_dump(mode="json", exclude={"shard_size", "verify_workers", "placement"})
        out["hint_template"] = hint_template(self.placement, self.hint_template)
        if self.placement == "system":
            out["placement"] = self.placement
        return out


@dataclass
class PromptItem:
    """One prompt to sample: what is sent, and what the rollouts are verified and filed under."""

    messages: list[dict]
    domain: str
    reference: str | None  # domain-form label
    problem_id: str
    hint_id: str | None
    round: int
    problem: str | None  # original text without hint, when known
    arm: str = "plain"  # rescue: the arm this prompt belongs to
    arm_index: int = 0


# --------------------------------------------------------------------------- reading prompts


def resolve_sources(sources: Sequence[str]) -> list[Path]:
    """Files, folders and globs (as every stage), plus the bundled set names."""
    from mentor.data import BUNDLED_SETS, bundled

    paths: list[Path] = []
    for s in sources:
        if str(s) in BUNDLED_SETS and not Path(s).exists():
            paths.append(bundled(BUNDLED_SETS[str(s)]))
        else:
            paths.extend(resolve_inputs([s]))
    return paths


def _is_dataset(paths: list[Path], dataset: str) -> bool:
    return all(not check_schema(read_parquet_schema(p), dataset) for p in paths)


def load_prompt_items(sources: Sequence[str], cfg: RolloutConfig) -> list[PromptItem]:
    """PROMPTS shards, a PROBLEMS dataset or a bundled set name -> prompt items (in file order)."""
    paths = resolve_sources(sources)
    if _is_dataset(paths, "prompts"):
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
            items.append(
                PromptItem(
                    messages=[{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
                    domain=domain,
                    reference=ref,
                    problem_id=str(label.get("problem_id") or row["problem_id"]),
                    hint_id=label.get("hint_id"),
                    round=cfg.round if cfg.round is not None else int(label.get("round") or row["round"] or 0),
                    problem=None,
                )
            )
        return items
    if _is_dataset(paths, "problems"):
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


# --------------------------------------------------------------------------- sampling + verifying


def _seed(base: int, i: int, j: int, k: int) -> int:
    return (base * 1_000_003 + i * k + j) % (2**31 - 1)


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
) -> list[dict[str, Any]]:
    """k rollouts per item in ONE backend call, each verified; rows in item order, then sample order.

    `first_index` is the position of ``items[0]`` in the whole set (seeds
    depend on it); `seed_fn(i, item, j)` replaces the positional seeds.
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
        )
        for i, item in enumerate(items)
        for j in range(cfg.k)
    ]
    t0 = time.monotonic()
    results = backend.generate(requests)
    log.info("sampled %d rollouts in %.1fs", len(results), time.monotonic() - t0)
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
                "prompt": "\n\n".join(m["content"] for m in item.messages),
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
    from mentor.pipeline.schemas import ROLLOUTS

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


def _describe(backend: Backend | Callable[[], Backend]) -> Any:
    if hasattr(backend, "describe"):
        return backend.describe()
    return {"model": getattr(backend, "model", type(backend).__name__)}


def _items_key(items: Sequence[PromptItem]) -> str:
    blob = json.dumps([[it.messages, it.domain, it.reference, it.problem_id, it.hint_id, it.round, it.arm] for it in items],
                      sort_keys=True, ensure_ascii=False)
    return content_hash(blob, length=24)


@contextmanager
def _heartbeat(bar: Any, every: float = 10.0):
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
    """What the sharded sampler did: rows of every shard (read back for reused ones) and counters."""

    rows: list[dict[str, Any]]
    shards: int = 0
    computed: int = 0
    engine_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str | None = None


def run_shards(
    stage: str,
    items: list[PromptItem],
    cfg: RolloutConfig,
    backend: Backend | Callable[[], Backend],
    parts_dir: Path,
    seed_fn: SeedFn | None = None,
    progress: bool = False,
) -> ShardRun:
    """Sample `items` shard by shard into ``parts_dir/part-NNNNN.parquet`` (+ ``_done/`` markers); resumable.

    The engine is built (a `BackendSpec` is called) only when a shard needs sampling.
    `progress`: a bar of rollouts on stderr, moved as each shard finishes (one engine call
    each, so smaller shards move it more often), its postfix naming the shard being sampled.
    """
    from tqdm.auto import tqdm

    run_key = config_hash({"stage": stage, "sampling": cfg.semantic(), "backend": _describe(backend), "schema": SCHEMA_VERSION})
    done_dir = parts_dir / "_done"
    engine: Backend | None = backend if hasattr(backend, "generate") else None  # type: ignore[assignment]
    out = ShardRun(rows=[])
    starts = list(range(0, len(items), cfg.shard_size))
    names = set()
    with tqdm(total=len(items) * cfg.k, desc=stage, unit="rollout", disable=not progress, dynamic_ncols=True) as bar:
        for index, start in enumerate(starts):
            chunk = items[start : start + cfg.shard_size]
            key = content_hash(run_key, _items_key(chunk), str(start), length=24)
            part = parts_dir / f"part-{index:05d}.parquet"
            marker = done_dir / f"{part.stem}.json"
            names.add(part.name)
            out.shards += 1
            done = read_done(marker, key) if part.is_file() else None
            if done is not None:
                rows = pl.read_parquet(part).to_dicts()
                for r, extra in zip(rows, done["tokens"]):
                    r["_prompt_tokens"], r["_completion_tokens"] = extra
                out.rows.extend(rows)
                out.prompt_tokens += done["prompt_tokens"]
                out.completion_tokens += done["completion_tokens"]
                out.model = out.model or done.get("model")
                bar.update(len(rows))
                continue
            if engine is None:
                bar.set_postfix_str("starting the engine", refresh=True)
                engine = backend()  # type: ignore[operator]
            bar.set_postfix_str(f"sampling shard {index + 1}/{len(starts)} ({len(chunk) * cfg.k} rollouts)", refresh=True)
            try:
                with _heartbeat(bar):
                    rows = sample_and_verify(engine, chunk, cfg, first_index=start, seed_fn=seed_fn)
            except EngineError as exc:
                raise EngineError(
                    f"{stage}: shard {index + 1} of {len(starts)} ({len(chunk)} prompts from {chunk[0].problem_id}) failed: {exc}. "
                    f"{index} finished shard(s) are kept in {parts_dir}: rerun the same command to redo only the unfinished ones"
                ) from exc
            write_parquet_atomic(_rollouts_table(rows), part, dataset="rollouts")
            pt = sum(r["_prompt_tokens"] for r in rows)
            ct = sum(r["_completion_tokens"] for r in rows)
            out.model = getattr(engine, "model", None)
            write_done(marker, key, index=index, rows=len(rows), prompt_tokens=pt, completion_tokens=ct,
                       tokens=[[r["_prompt_tokens"], r["_completion_tokens"]] for r in rows], model=out.model)
            from mentor.pipeline.faults import fault_point

            fault_point(f"{stage}.after_shard")
            out.rows.extend(rows)
            out.computed += 1
            out.engine_calls += 1
            out.prompt_tokens += pt
            out.completion_tokens += ct
            bar.update(len(rows))
            bar.set_postfix_str(f"{index + 1}/{len(starts)} shards", refresh=True)
    # Shards of an earlier, larger run are not part of this output.
    for stale in parts_dir.glob("part-*.parquet"):
        if stale.name not in names:
            stale.unlink()
            (done_dir / f"{stale.stem}.json").unlink(missing_ok=True)
    return out


def rollout_to_dir(sources: Sequence[str], out_dir: str | Path, cfg: RolloutConfig, backend: Backend | Callable[[], Backend],
                   progress: bool = False) -> dict[str, Any]:
    """`mentor rollout`: writes ``out_dir/part-NNNNN.parquet`` (ROLLOUTS) and ``out_dir/stats.json``."""
    items = load_prompt_items(sources, cfg)
    if not items:
        raise DataError(f"no prompts in {', '.join(map(str, sources))}")
    _number_repeats(items)
    t0 = time.monotonic()
    out_dir = Path(out_dir)
    try:
        run = run_shards("rollout", items, cfg, backend, out_dir, progress=progress)
    finally:
        release_engines()  # the stage's engine ends with it: the next stage (a trainer) gets the memory
    rows = run.rows
    frame = pl.DataFrame({"pid": [r["problem_id"] for r in rows], "c": [r["correct"] for r in rows]})
    per = frame.group_by("pid").agg(pl.col("c").max().alias("best"), pl.col("c").min().alias("worst"))
    stats = {
        "schema_version": SCHEMA_VERSION,
        "prompts": len(items),
        "problems": per.height,
        "rollouts": len(rows),
        "k": cfg.k,
        "correct": int(sum(r["correct"] > 0 for r in rows)),
        "mean_correct": round(float(frame["c"].mean()), 6) if rows else 0.0,
        "collapsed": int((per["best"] <= 0).sum()),
        "all_correct": int((per["worst"] > 0).sum()),
        "truncated": int(sum(bool(r["truncated"]) for r in rows)),
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "engine_calls": run.engine_calls,
        "shards": run.shards,
        "shards_reused": run.shards - run.computed,
        "model": run.model or getattr(backend, "model", None),
        "seconds": round(time.monotonic() - t0, 3),
        "inputs": [str(s) for s in sources],
        "config": cfg.model_dump(mode="json"),
    }
    write_stats(out_dir, stats)
    return stats


# --------------------------------------------------------------------------- rescue


def _latest_hints(hints: pl.DataFrame) -> pl.DataFrame:
    return (
        hints.sort("round")
        .group_by("problem_id", maintain_order=True)
        .agg(pl.col("hint_id").last(), pl.col("hint").last(), pl.col("round").last().alias("hint_round"))
    )


def read_collapsed_or_problems(sources: Sequence[str]) -> pl.DataFrame:
    """A collapsed set (`mentor mine`), or a problems dataset / bundled set name whose problems are all re-rolled."""
    paths = resolve_sources(sources)
    if _is_dataset(paths, "collapsed"):
        return read_dataset(paths, "collapsed")
    if _is_dataset(paths, "problems"):
        return read_dataset(paths, "problems").select("problem_id", "domain", "problem", "label").with_columns(
            pl.lit(0, pl.Int32).alias("round"))
    found = ", ".join(read_parquet_schema(paths[0]).names[:10])
    raise DataError(f"{paths[0]}: --collapsed takes collapsed.parquet from `mentor mine`, a problems dataset or a bundled "
                    f"set name (gsm8k, math500, humaneval); found columns: {found}")


def rescue_items(collapsed: pl.DataFrame, arms: dict[str, pl.DataFrame], cfg: RolloutConfig,
                 arm_placements: dict[str, str] | None = None) -> tuple[list[PromptItem], list[str], dict[str, int]]:
    """Prompt items per problem and arm (the unhinted arm first), the problems kept, and the problems
    without a hint per arm (``"*"``: without a hint in some arm).

    A problem is kept only when every hinted arm has a hint for it (a paired comparison). Each
    arm's prompts are laid out as `mentor build` does (`build_render.prompt_messages`), with
    ``cfg.placement`` or the arm's own in `arm_placements`.
    """
    arm_placements = arm_placements or {}
    latest = {name: _latest_hints(h) for name, h in arms.items()}
    joined = collapsed
    for a, (name, lh) in enumerate(latest.items()):
        joined = joined.join(lh.rename({"hint_id": f"_hid{a}", "hint": f"_hint{a}", "hint_round": f"_round{a}"}),
                             on="problem_id", how="left", maintain_order="left")
    if cfg.limit:
        joined = joined.head(cfg.limit)
    missing = {name: int(joined[f"_hint{a}"].is_null().sum()) for a, name in enumerate(latest)}
    before = joined.height
    if latest:
        joined = joined.filter(pl.all_horizontal(pl.col(f"_hint{a}").is_not_null() for a in range(len(latest))))
    missing["*"] = before - joined.height
    items: list[PromptItem] = []
    kept: list[str] = []
    rows = list(joined.iter_rows(named=True))
    names = [UNHINTED, *latest]
    layouts = {}  # arm -> the messages of every kept problem, in row order
    for a, name in enumerate(names):
        hints = [None] * len(rows) if name == UNHINTED else [r[f"_hint{a - 1}"] for r in rows]
        layouts[name] = prompt_messages(
            [{"problem": r["problem"], "hint": h, "domain": r["domain"]} for r, h in zip(rows, hints)],
            placement=arm_placements.get(name, cfg.placement), template=cfg.hint_template, instructions=cfg.instructions,
        )
    for n, r in enumerate(rows):
        kept.append(r["problem_id"])
        rnd = cfg.round if cfg.round is not None else int(max([r[f"_round{a}"] for a in range(len(latest))], default=r.get("round") or 0))
        variants = [(UNHINTED, None, None)] + [(name, r[f"_hint{a}"], r[f"_hid{a}"]) for a, name in enumerate(latest)]
        for arm_index, (arm, hint, hint_id) in enumerate(variants):
            items.append(
                PromptItem(
                    messages=layouts[arm][n],
                    domain=r["domain"],
                    reference=r["label"],
                    problem_id=r["problem_id"],
                    hint_id=hint_id,
                    round=rnd,
                    problem=r["problem"],
                    arm=arm,
                    arm_index=arm_index,
                )
            )
    return items, kept, missing


def rescue_report(rows: list[dict[str, Any]], k: int, arms: Sequence[str]) -> pl.DataFrame:
    """One row per problem; per arm the correct rollouts, whether it rescued the problem, mean correctness, hint id."""
    arms = list(arms)
    df = pl.DataFrame(
        {
            "problem_id": [r["problem_id"] for r in rows],
            "domain": [r["domain"] for r in rows],
            "hint_id": [r["hint_id"] for r in rows],
            "arm": [arms[r["sample_idx"] // k] for r in rows],
            "correct": [float(r["correct"]) for r in rows],
        },
        schema={"problem_id": pl.String, "domain": pl.String, "hint_id": pl.String, "arm": pl.String, "correct": pl.Float64},
    )
    ok = pl.col("correct") > 0
    aggs: list[pl.Expr] = [pl.col("domain").first()]
    for arm in arms:
        mine = pl.col("arm") == arm
        aggs += [
            (ok & mine).sum().cast(pl.Int32).alias(f"correct_{arm}"),
            pl.col("correct").filter(mine).mean().alias(f"mean_correct_{arm}"),
        ]
        if arm != UNHINTED:
            aggs.append(pl.col("hint_id").filter(mine).first().alias(f"hint_id_{arm}"))
    out = df.group_by("problem_id", maintain_order=True).agg(aggs).with_columns(
        pl.lit(k, pl.Int32).alias("k"), *[(pl.col(f"correct_{a}") >= 1).alias(f"rescued_{a}") for a in arms]
    )
    if "hinted" in arms:
        out = out.with_columns(pl.col("hint_id_hinted").alias("hint_id"))
    return out


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def rescue_to_dir(
    collapsed_sources: Sequence[str],
    hints_sources: Sequence[str] | dict[str, Sequence[str]],
    out_dir: str | Path,
    cfg: RolloutConfig,
    backend: Backend | Callable[[], Backend],
    arm_placements: dict[str, str] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """`mentor rescue`: ``rescue.parquet`` + ``rescue.json`` + ``rollouts/`` in `out_dir`.

    `hints_sources` is a list of hints files (the arm ``hinted``) or a mapping
    arm name -> hints files. The arm ``unhinted`` is always added. `arm_placements`
    gives an arm its own placement (default ``cfg.placement``), e.g. to compare
    placements of the same hints in one run.
    """
    arm_sources = {"hinted": list(hints_sources)} if not isinstance(hints_sources, dict) else {k: list(v) for k, v in hints_sources.items()}
    for name in arm_sources:
        if name == UNHINTED or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"arm name {name!r}: use letters, digits, '-' and '_' (and not {UNHINTED!r}, which is always there)")
    collapsed = read_collapsed_or_problems(collapsed_sources)
    arms = {name: read_dataset(resolve_inputs(src), "hints") for name, src in arm_sources.items()}
    if collapsed.height == 0:
        raise DataError(f"{', '.join(map(str, collapsed_sources))}: no collapsed problems to re-roll")
    if collapsed["problem_id"].is_duplicated().any():
        # Several rounds' collapsed sets: keep each problem's latest row.
        collapsed = collapsed.sort("round").unique("problem_id", keep="last", maintain_order=True)
    arm_placements = dict(arm_placements or {})
    unknown = sorted(set(arm_placements) - set(arms))
    if unknown:
        raise ConfigError(f"placement for arm(s) {unknown}, which are not in the run (arms: {', '.join(arms)})")
    bad = {a: p for a, p in arm_placements.items() if p not in PLACEMENTS}
    if bad:
        a, p = next(iter(bad.items()))
        raise ConfigError(f"arm {a}: placement {p!r}; use one of {', '.join(PLACEMENTS)}")
    items, kept, missing = rescue_items(collapsed, arms, cfg, arm_placements)
    if not items or not kept:
        where = "; ".join(f"{name}: {', '.join(map(str, src))}" for name, src in arm_sources.items())
        raise DataError(
            f"none of the {collapsed.height} collapsed problems has a hint in every arm ({where}); "
            "run `mentor hint` on this collapsed set first"
        )
    names = [UNHINTED, *arms]
    t0 = time.monotonic()
    out_dir = Path(out_dir)
    per_problem = len(names)
    # Whole problems per shard, so that every arm of a problem is in the same engine batch.
    shard_cfg = cfg.model_copy(update={"shard_size": max(per_problem, cfg.shard_size // per_problem * per_problem)})
    try:
        run = run_shards("rescue", items, shard_cfg, backend, out_dir / "rollouts",
                         seed_fn=lambda i, item, j: problem_seed(cfg.seed, item.problem_id, j), progress=progress)
    finally:
        release_engines()
    rows = run.rows
    report = rescue_report(rows, cfg.k, names)
    write_parquet_atomic(report, out_dir / "rescue.parquet")
    n = report.height
    per_arm: dict[str, dict[str, Any]] = {}
    for name in names:
        rescued = int(report[f"rescued_{name}"].sum())
        lo, hi = wilson(rescued, n)
        per_arm[name] = {
            "rescued": rescued,
            "rescue_rate": round(rescued / n, 6) if n else 0.0,
            "rescue_rate_ci95": [round(lo, 6), round(hi, 6)],
            "mean_correct": round(float(report[f"mean_correct_{name}"].mean() or 0.0), 6),
            "skipped_no_hint": missing.get(name, 0),
        }
        if name != UNHINTED:
            per_arm[name]["placement"] = arm_placements.get(name, cfg.placement) if cfg.hint_template is None else "template"
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "problems": n,
        "collapsed": collapsed.height,
        "skipped_no_hint": missing["*"],
        "k": cfg.k,
        "arms": per_arm,
    }
    for name, a in per_arm.items():
        summary[f"rescued_{name}"] = a["rescued"]
        summary[f"rescue_rate_{name}"] = a["rescue_rate"]
        summary[f"mean_correct_{name}"] = a["mean_correct"]
    if "hinted" in per_arm:
        summary["lift"] = round((per_arm["hinted"]["rescued"] - per_arm[UNHINTED]["rescued"]) / n, 6) if n else 0.0
    summary.update({
        "rollouts": len(rows),
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "engine_calls": run.engine_calls,
        "shards": run.shards,
        "shards_reused": run.shards - run.computed,
        "model": run.model or getattr(backend, "model", None),
        "seconds": round(time.monotonic() - t0, 3),
        "inputs": {"collapsed": [str(s) for s in collapsed_sources], "arms": arm_sources},
        "config": cfg.model_dump(mode="json"),
    })
    write_json_atomic(summary, out_dir / "rescue.json")
    return summary


__all__ = [
    "PromptItem",
    "RolloutConfig",
    "load_prompt_items",
    "problem_seed",
    "rescue_items",
    "rescue_report",
    "rescue_to_dir",
    "rollout_to_dir",
    "run_shards",
    "sample_and_verify",
    "wilson",
]
