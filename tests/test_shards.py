"""Resumable shards (`mentor.pipeline.shards`): keyed by input + config, atomic, resumable after kill -9."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mentor.pipeline import shards as shards_mod
from mentor.pipeline.shards import ShardPlan

ITEMS = [{"x": i} for i in range(5)]


def square(shard, calls: list) -> tuple[pa.Table, dict]:
    calls.append(shard.index)
    xs = [it["x"] for it in shard.items]
    return pa.table({"x": xs, "y": [x * x for x in xs]}), {"sum": sum(xs)}


def run(folder, items=ITEMS, config=None, **kw) -> tuple[list[int], list]:
    calls: list[int] = []
    plan = ShardPlan(folder, "test", items, 2, config or {"power": 2}, **kw)
    results = [res for _, res in plan.run(square, calls)]
    plan.finish()
    return calls, results


def test_done_shards_are_reused_and_a_change_recomputes_only_what_it_affects(tmp_path):
    calls, results = run(tmp_path)
    assert calls == [0, 1, 2] and [r.reused for r in results] == [False] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_done", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert json.loads((tmp_path / "_done" / "part-00001.json").read_text())["sum"] == 5  # 2 + 3, with index and rows
    assert results[2].record == {"index": 2, "rows": 1, "sum": 4} and results[0].ran["engine_started"] is False
    calls, results = run(tmp_path)
    assert calls == [] and [r.reused for r in results] == [True] * 3 and results[1].record["sum"] == 5
    changed = [*ITEMS[:3], {"x": 30}, ITEMS[4]]  # shard 1's input
    calls, _ = run(tmp_path, changed)
    assert calls == [1] and pq.read_table(tmp_path / "part-00001.parquet").column("y").to_pylist() == [4, 900]
    calls, _ = run(tmp_path, changed, {"power": 3})  # the config: every shard
    assert calls == [0, 1, 2]


def test_position_keys_and_stale_shards(tmp_path):
    run(tmp_path, by_position=True)
    calls, _ = run(tmp_path, ITEMS[1:], by_position=True)  # every shard moved
    assert calls == [0, 1]
    # The folder is also the stage's output: only part-* files of an earlier, larger run go.
    (tmp_path / "stats.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.glob("part-*")) == ["part-00000.parquet", "part-00001.parquet"]
    assert sorted(p.name for p in (tmp_path / "_done").iterdir()) == ["part-00000.json", "part-00001.json"]
    run(tmp_path, ITEMS[:1], by_position=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_done", "part-00000.parquet", "stats.json"]
    # A folder of shards only: anything else (an older layout's files) goes too.
    (tmp_path / "old.done.json").write_text("{}")
    run(tmp_path, ITEMS[:1], by_position=True, owns_folder=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_done", "part-00000.parquet"]


def test_an_earlier_runs_marker_never_vouches_for_a_new_parquet(tmp_path, monkeypatch):
    """Killed between a shard's Parquet and its marker: the old marker is already gone, so the shard is redone."""
    run(tmp_path)
    before = pq.read_table(tmp_path / "part-00000.parquet")

    def killed(*a, **k):
        raise KeyboardInterrupt("killed before the marker")

    monkeypatch.setattr(shards_mod, "write_done", killed)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, config={"power": 3})
    monkeypatch.undo()
    assert not (tmp_path / "_done" / "part-00000.json").exists()
    calls, _ = run(tmp_path)
    assert calls == [0] and pq.read_table(tmp_path / "part-00000.parquet").equals(before)


def test_killed_with_sigkill_after_a_shard_resumes_with_the_rest(tmp_path):
    code = textwrap.dedent(f"""
        import pyarrow as pa
        from mentor.pipeline.shards import ShardPlan
        def compute(shard):
            print(shard.index, flush=True)
            return pa.table({{"x": [it["x"] for it in shard.items]}}), {{}}
        for _ in ShardPlan({str(tmp_path)!r}, "test", [{{"x": i}} for i in range(5)], 2, {{}}).run(compute):
            pass
    """)
    env = dict(os.environ, MENTOR_FAULT="test.after_shard", MENTOR_FAULT_SKIP="1")
    killed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9 and killed.stdout.split() == ["0", "1"]
    resumed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0 and resumed.stdout.split() == ["2"]
