"""Every prompt of a verl round trains: verl 0.9.1's own dataset and dataloader over one epoch of the round.

verl's ``RayPPOTrainer._create_dataloader`` batches with ``drop_last=True`` (``data.train_batch_size``
1024 by default): before the batch plan, 295 of GSM8K's 1,319 prompts (shuffled, hinted ones too) were
never seen in an epoch, and a round smaller than its batch failed after start-up. Here verl's own
``_create_dataloader`` (its ``create_rl_dataset``, ``create_rl_sampler`` and ``StatefulDataLoader``) runs
on the config composed from the command mentor prints, with the rows mentor writes before launch.
"""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import polars as pl
import pytest

pytest.importorskip("hydra")
pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from mentor.pipeline.errors import ConfigError  # noqa: E402
from mentor.stages.build import BUILD, BuildConfig  # noqa: E402
from mentor.training.verl.batches import pad_path, plan_batches, write_pad  # noqa: E402
from mentor.training.verl.hydra import compose  # noqa: E402
from mentor.training.verl.launcher import batch_plan, dry_run_text, parse_config, train_files  # noqa: E402


@pytest.fixture(scope="module")
def hinted_round(tmp_path_factory):
    """round-001: GSM8K's 1,319 prompts in two shards (700 + 619), 40 of them hinted."""
    from test_build import make_hints

    from mentor.data import bundled

    d = tmp_path_factory.mktemp("run") / "round-001"
    hints = d.parent / "hints.parquet"
    ids = pl.read_parquet(bundled("gsm8k_problems.parquet"))["problem_id"].to_list()
    make_hints([{"problem_id": i, "hint": "Write down what each quantity stands for first."} for i in ids[::33]], hints)
    BUILD({}, BuildConfig(base="gsm8k", hints=[str(hints)], round=1, shard_rows=700), d / "prompts")
    return d


def _cfg(round_dir, tokenizer, **overrides):
    return parse_config({"kind": "verl", "round": 0, "round_dir": str(round_dir), "base_model": str(tokenizer),
                         "n_gpus_per_node": 1, "overrides": overrides})


def _one_epoch(cfg, tokenizer_dir) -> tuple[list[tuple], object]:
    """The rows verl's own train dataloader yields in one epoch, for the command the dry run prints."""
    from transformers import AutoTokenizer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    out = dry_run_text(cfg)
    cmd = shlex.split(next(ln for ln in out.splitlines() if "verl.trainer.main_ppo" in ln))
    composed = compose(cmd[3:])
    composed.data.dataloader_num_workers = 0
    write_pad(train_files(cfg), batch_plan(cfg), pad_path(cfg.train_path))  # what run_round writes before launch
    trainer = SimpleNamespace(config=composed, tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir), processor=None)
    RayPPOTrainer._create_dataloader(trainer, None, None, None, None)
    seen = []
    for batch in trainer.train_dataloader:
        assert len(batch["extra_info"]) == composed.data.train_batch_size
        seen += [(e["problem_id"], e.get("hint_id")) for e in batch["extra_info"]]
    return seen, out


def test_one_epoch_of_verls_dataloader_sees_every_prompt(hinted_round, shared_data):
    tok = shared_data / "tokenizers" / "qwen3"
    rows = pl.read_parquet(hinted_round / "prompts" / "*.parquet")
    info = rows["extra_info"].to_list()
    want = {(e["problem_id"], e.get("hint_id")) for e in info}
    hinted = {k for k in want if k[1]}
    assert rows.height == 1319 and len(hinted) == 40
    seen, out = _one_epoch(_cfg(hinted_round, tok), tok)
    assert set(seen) == want  # every prompt, every hinted one, in one epoch
    assert len(seen) - rows.height == len(seen) - len(want) < 2  # 2 steps of 660: one row repeated
    assert "# batches: 1319 prompts, data.train_batch_size=660 (set by mentor), 2 step(s) per epoch" in out
    # A batch the overrides set: kept, and whole batches by repeating rows.
    seen, out = _one_epoch(_cfg(hinted_round, tok, **{"data.train_batch_size": 512,
                                                      "actor_rollout_ref.actor.ppo_mini_batch_size": 128}), tok)
    assert set(seen) == want and len(seen) == 3 * 512
    assert "the round's first 217 row(s) are repeated" in out


def test_a_round_smaller_than_its_batch_is_refused_before_launch(tmp_path, hinted_round, shared_data):
    import pyarrow.parquet as pq

    d = tmp_path / "round-000"
    (d / "prompts").mkdir(parents=True)
    first = sorted((hinted_round / "prompts").glob("part-*.parquet"))[0]
    pq.write_table(pq.read_table(first).slice(0, 12), d / "prompts" / "part-00000.parquet")
    tok = shared_data / "tokenizers" / "qwen3"
    with pytest.raises(ConfigError, match=r"the round has 12 prompts, fewer than one batch \(data.train_batch_size=64\)"):
        dry_run_text(_cfg(d, tok, **{"data.train_batch_size": 64, "actor_rollout_ref.actor.ppo_mini_batch_size": 32}))
    assert not (d / "train").exists()
    # Left unset: one step with all 12 (verl's own validate_config accepts the mini batch mentor sets with it).
    seen, out = _one_epoch(_cfg(d, tok), tok)
    assert len(seen) == 12 and len(set(seen)) == 12
    assert "12 prompts, data.train_batch_size=12 (set by mentor), 1 step(s) per epoch; every prompt trains" in out


def test_the_plan_in_numbers():
    assert plan_batches(1319, {}).batch == 660 and plan_batches(1319, {}).pad == 1
    assert plan_batches(1319, {}, gpus=8).batch == 664 and plan_batches(1319, {}, gpus=8).pad == 9
    assert plan_batches(3000, {"data.train_batch_size": 1000}).pad == 0
    assert plan_batches(20, {}).overrides() == ["data.train_batch_size=20", "actor_rollout_ref.actor.ppo_mini_batch_size=20"]
    with pytest.raises(ConfigError, match="not a whole number"):
        plan_batches(20, {"data.train_batch_size": "many"})
