"""The stage contract: Stats counters merge by summing, stats.json and done markers, executors."""

from __future__ import annotations

import json
import pickle

import pytest

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.executor import LocalExecutor
from mentor.pipeline.stage import StatsLayout, read_done, write_done, write_stats

LAYOUT = StatsLayout(
    counters=("rows", "kept"),
    groups={"dropped": ("empty", "too_long"), "seen": ()},
    values={"round": 0},
    ratios={"kept_share": ("kept", "rows")},
    totals={"dropped_total": "dropped"},
)


def test_counters_by_reason_merge_by_summing():
    a, b = LAYOUT(round=2), LAYOUT()
    a.rows += 10
    a.kept = 7
    a.add("dropped", 2, reason="empty")
    a.add("seen", reason="x")
    b.add("rows", 5)
    b.add("kept", 5)
    b.dropped["too_long"] += 1
    b.add("seen", 0, reason="never")  # a zero does not list a reason
    a += b
    assert a.as_dict() == {
        "rows": 15, "kept": 12, "dropped": {"empty": 2, "too_long": 1}, "seen": {"x": 1},
        "kept_share": 0.8, "dropped_total": 3, "round": 2,
    }
    # The ``as_dict()`` of a shard (e.g. read back from its done marker) merges the same way.
    a.merge(b.as_dict())
    assert (a.rows, a.kept, dict(a.dropped), a.round) == (20, 17, {"empty": 2, "too_long": 2}, 2)
    assert pickle.loads(pickle.dumps(a)).as_dict() == a.as_dict()


def test_a_misspelt_counter_fails_loudly():
    s = LAYOUT()
    with pytest.raises(AttributeError, match="rowz"):
        s.rowz += 1
    with pytest.raises(AttributeError):
        _ = s.nothing
    with pytest.raises(TypeError, match="unknown stats value"):
        LAYOUT(mode="x")
    assert LAYOUT().as_dict()["kept_share"] == 0.0  # no rows: no division by zero


def test_stats_file_and_done_markers(tmp_path):
    s = LAYOUT()
    s.rows = 3
    write_stats(tmp_path, s, config={"k": 1})
    assert json.loads((tmp_path / "stats.json").read_text())["rows"] == 3
    marker = tmp_path / "_done" / "abc.done"
    write_done(marker, "abc", rows=3)
    assert read_done(marker, "abc")["rows"] == 3
    assert read_done(marker, "other") is None  # another key: not done
    marker.write_text('{"key": "ab')  # cut short by a kill: not done, redone
    assert read_done(marker, "abc") is None
    assert read_done(tmp_path / "missing.done") is None


def test_local_executor_keeps_item_order_and_streams():
    seen = []

    def task(x: int, k: int) -> int:
        seen.append(x)
        return x * k

    ex = LocalExecutor()
    assert ex.map(task, [3, 1, 2], 10) == [30, 10, 20]
    it = ex.imap(task, iter([5, 6]), 2)
    assert seen == [3, 1, 2]  # nothing runs before the first result is asked for
    assert next(it) == 10 and seen[-1] == 5
    assert list(it) == [12]


def test_dask_executor_gives_results_in_item_order():
    pytest.importorskip("distributed")
    from mentor.pipeline.executor import DaskExecutor, dask_client

    # A builtin as the task: dask workers import it by name (this test module is not importable there).
    with dask_client(workers=2) as client:
        ex = DaskExecutor(client, window=2)
        assert ex.map(pow, range(6), 2) == [x**2 for x in range(6)]
        assert list(ex.imap(pow, iter(range(7)), 3)) == [x**3 for x in range(7)]
        assert ex.map(pow, [], 2) == [] and list(ex.imap(pow, [], 2)) == []


# --------------------------------------------------------------------------- one way to be a stage


def test_every_stage_has_the_stage_shape():
    from pydantic import BaseModel

    from mentor.pipeline.stage import Stage
    from mentor.stages import names, stage

    assert names() == ("build", "hint", "ingest", "mine", "rescue", "rollout", "train")  # found by file name
    for name in names():
        s = stage(name)
        assert isinstance(s, Stage) and s.name == name
        assert issubclass(s.Inputs, BaseModel) and issubclass(s.Config, BaseModel), name
        # generating stages (and the trainer) resume and release the engines; the others write all or nothing
        assert s.needs_engine == (not s.staged) == (name in ("hint", "rollout", "rescue", "train")), name
        assert "stats.json" in s.owns.files, name
    with pytest.raises(KeyError, match="no stage 'inspect'"):
        stage("inspect")


def test_run_stage_is_what_the_command_runs(tmp_path):
    """`mentor mine` and `run_stage(stage("mine"), ...)` on the bundled real rollouts: the same outputs."""
    from click.testing import CliRunner

    from mentor.workflows.cli import cli
    from mentor.data import bundled
    from mentor.pipeline.stage import Context, Stats, run_stage
    from mentor.stages import stage

    logs = str(bundled("gsm8k_rollouts.parquet"))
    stats = run_stage(stage("mine"), {"sources": [logs]}, {"k_failed": 1}, tmp_path / "api", Context(executor=LocalExecutor()))
    assert isinstance(stats, Stats) and stats.collapsed > 0
    res = CliRunner().invoke(cli, ["mine", logs, "--out", str(tmp_path / "cli"), "--k-failed", "1"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == stats.as_dict()
    assert (tmp_path / "api" / "collapsed.parquet").read_bytes() == (tmp_path / "cli" / "collapsed.parquet").read_bytes()
    with pytest.raises(ConfigError, match="mine settings: histroy: unknown key"):  # the inputs are a model: a misspelt
        run_stage(stage("mine"), {"sources": [logs], "histroy": []}, {}, tmp_path / "typo")  # input is refused, by name


# --------------------------------------------------------------------------- the driver


class _Parts:
    """A small real stage for the driver: writes `n` part files and a note, then fails when told to."""

    from pydantic import BaseModel as _Base

    class Inputs(_Base):
        n: int

    class Config(_Base):
        fail: bool = False
        refuse: bool = False


def _stage(staged: bool = True, needs_engine: bool = False):
    from mentor.pipeline.outdir import Owns
    from mentor.pipeline.stage import Stage

    class PartsStage(Stage):
        name = "parts"
        Inputs = _Parts.Inputs
        Config = _Parts.Config
        owns = Owns(("stats.json", "note.txt"), shards=True)
        summary = ("rows",)

        def plan(self, inputs, cfg, out_dir):
            if cfg.refuse:
                raise ValueError("refused before any output")
            return inputs

        def run(self, inputs, cfg, out_dir, ctx):
            stats = LAYOUT()
            out_dir.mkdir(parents=True, exist_ok=True)
            for i in range(inputs.n):
                (out_dir / f"part-{i:05d}.parquet").write_text(str(i))
                stats.rows += 1
                if cfg.fail and i == 1:
                    raise RuntimeError("killed half way")
            (out_dir / "note.txt").write_text("done")
            stats.extra["inputs"] = inputs.n
            return stats

    PartsStage.staged, PartsStage.needs_engine = staged, needs_engine
    return PartsStage()


def test_driver_stages_an_all_or_nothing_output(tmp_path):
    stage, out = _stage(), tmp_path / "out"
    with pytest.raises(ValueError, match="refused"):
        stage({"n": 3}, {"refuse": True}, out)
    assert not out.exists()  # the plan's checks come before any output
    stats = stage({"n": 3}, {}, out)
    assert stats.rows == 3 and stage.summary == ("rows",)
    assert sorted(p.name for p in out.iterdir()) == ["note.txt", "part-00000.parquet", "part-00001.parquet",
                                                      "part-00002.parquet", "stats.json"]
    written = json.loads((out / "stats.json").read_text())
    assert written["rows"] == 3 and written["inputs"] == 3 and "inputs" not in stats.as_dict()  # extra: the file only
    (out / "mine.txt").write_text("a file the stage does not own")
    with pytest.raises(RuntimeError, match="half way"):
        stage({"n": 2}, {"fail": True}, out)
    # The failed run left the folder as it was: three parts, the old stats, the user's file; no temporary folder.
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt", "note.txt", "part-00000.parquet", "part-00001.parquet",
                                                      "part-00002.parquet", "stats.json"]
    assert json.loads((out / "stats.json").read_text())["rows"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    stage({"n": 1}, {}, out)  # a new output replaces the stage's files, keeps the others
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt", "note.txt", "part-00000.parquet", "stats.json"]


def test_driver_releases_the_engines_however_a_stage_ends(tmp_path):
    from mentor.pipeline.stage import Context

    class Workers(LocalExecutor):
        closed = 0

        def close_engines(self):
            Workers.closed += 1

    stage = _stage(staged=False, needs_engine=True)
    stage({"n": 2}, {}, tmp_path / "a", Context(executor=Workers()))
    assert Workers.closed == 1 and json.loads((tmp_path / "a" / "stats.json").read_text())["rows"] == 2
    with pytest.raises(RuntimeError):
        stage({"n": 3}, {"fail": True}, tmp_path / "b", Context(executor=Workers()))
    assert Workers.closed == 2
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]  # resumable: kept
    _stage(staged=False)({"n": 1}, {}, tmp_path / "c", Context(executor=Workers()))
    assert Workers.closed == 2  # a stage without an engine releases none
