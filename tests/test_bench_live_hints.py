"""The live-hints benchmark's reading of a round (the rounds themselves are run by hand: tests/benchmarks/bench_live_hints.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mentor.training.rollout_log import check_record, make_record

BENCH = Path(__file__).parent / "benchmarks" / "bench_live_hints.py"
# Two lines as TRL 1.16 writes them to train.log (a progress bar, then the logged metrics; values as text).
TRAIN_LOG = (
    " 50%|#####     | 1/2 [04:22<04:22, 262.09s/it]   {'loss': '-1.49e-08', 'reward': '0.125', "
    "'frac_reward_zero_std': '0.5', 'mentor/live_hint_seconds': '117.2', 'mentor/live_reroll_seconds': '26.68', "
    "'step_time': '261', 'epoch': '1'}\n"
    "2026-12-07 03:27:55,059 INFO mentor.training.trl_live: live hints step 1: 2 group(s)\n"
    "100%|##########| 2/2 [08:52<00:00, 267.11s/it]   {'loss': '0', 'frac_reward_zero_std': '1', "
    "'mentor/live_hint_seconds': '114.8', 'step_time': '269.6', 'epoch': '2'}\n"
)


def group(pid: str, prompt: str, rewards: list[float], step: int, status: str | None = None, rerolled: bool = False):
    out = []
    for r in rewards:
        rec = make_record(problem_id=pid, round_=1, domain="math", prompt=prompt, response="The answer is 3.",
                          correct=r, reward=r, step=step, trainer="trl")
        if status is not None:
            rec |= {"live_status": status, "live_rerolled": rerolled}
        check_record(rec)
        out.append(rec)
    return out


def write(folder: Path, name: str, records: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_offline_share_counts_groups_whose_rewards_differ(bench, tmp_path):
    log = tmp_path / "log"
    write(log, "trl-a.jsonl", group("p-a", "A?", [0, 0, 0, 0], 0) + group("p-b", "B?", [1, 0, 0, 0], 0)
          + group("p-a", "A?", [1, 1, 1, 1], 1))  # all right: a reward, but no advantage
    write(log, "trl-b.jsonl", group("p-b", "B?", [0, 1, 0, 1], 1)
          + group("p-c", "C?", [0, 0, 1, 0, 0, 0, 0, 0], 1))  # one problem drawn twice in a step: two groups
    write(log, ".trl-live-tmp.jsonl", group("p-z", "Z?", [1, 0, 1, 0], 0))  # a killed step's temp shard: not read
    shares = bench.advantage_share(bench.read_records(log), 4)
    assert shares == {0: {"groups": 2, "nonzero_adv": 1, "share": 0.5},
                      1: {"groups": 4, "nonzero_adv": 2, "share": 0.5}}


def test_live_share_is_on_what_was_trained_and_first_pass_on_the_first_generation(bench, tmp_path):
    log = tmp_path / "log"
    write(log, "trl-live-s0.jsonl",
          group("p-b", "B?", [0, 1, 0, 0], 0, "scored")
          + group("p-c", "C?", [0, 0, 0, 0], 0, "collapsed_over_budget")
          + group("p-a", "A?", [0, 0, 0, 0], 0, "hinted")  # the replaced first pass: not trained on
          + group("p-a", "A? Hint: count the legs.", [1, 0, 0, 0], 0, "rerolled", rerolled=True))
    records = bench.read_records(log)
    assert bench.advantage_share(records, 4) == {0: {"groups": 3, "nonzero_adv": 2, "share": 0.6667}}
    assert bench.advantage_share(records, 4, keep=bench.first_pass) == {0: {"groups": 3, "nonzero_adv": 1, "share": 0.3333}}


def test_a_group_of_another_size_is_refused(bench, tmp_path):
    with pytest.raises(SystemExit, match="not a whole number of groups of 4"):
        bench.advantage_share(group("p-a", "A?", [0, 1, 0], 0), 4)


def test_trl_step_metrics_are_read_from_train_log(bench, tmp_path):
    (tmp_path / "train.log").write_text(TRAIN_LOG)
    steps = bench.logged_steps(tmp_path / "train.log")
    assert [s["step_time"] for s in steps] == [261.0, 269.6]
    assert [s["mentor/live_hint_seconds"] for s in steps] == [117.2, 114.8]
    assert steps[0]["frac_reward_zero_std"] == 0.5 and "mentor/live_reroll_seconds" not in steps[1]


def test_first_pass_pairing_compares_the_responses_of_each_step(bench):
    off = group("p-a", "A?", [0, 0, 0, 0], 0) + group("p-a", "A?", [0, 0, 0, 0], 1)
    live = (group("p-a", "A?", [0, 0, 0, 0], 0, "hinted")
            + group("p-a", "A? Hint: halve it.", [1, 0, 0, 0], 0, "rerolled", rerolled=True)  # not a first pass
            + [r | {"response": "Another draw."} for r in group("p-a", "A?", [0, 0, 0, 0], 1, "collapsed_over_budget")])
    assert bench.same_first_pass(off, live) == {0: True, 1: False}


def test_the_bench_reaches_mentors_commands(bench, tmp_path):
    """The bench runs mentor's commands as `python -m <the CLI module>`: that module is today's."""
    log = tmp_path / "help.log"
    bench.mentor("--help", log=log)
    assert "Commands:" in log.read_text() and "serve" in log.read_text()


def test_micro_batches_keep_one_generation_batch_per_step(bench, tmp_path):
    """--micro-batch splits the loss into micro-batches by gradient accumulation; each step still generates, scores
    and trains on all its prompts x completions at once (TRL's generation batch), as the measured share needs."""
    from mentor.training.trl.launcher import parse_config, resolve_grpo

    args = bench.parse_args(["--hinter", "smollm2-135m", "--micro-batch", "4", "--gradient-checkpointing",
                             "--work", str(tmp_path)])
    cfg = json.loads(bench.round_yaml(args, tmp_path, tmp_path / "prompts", "policy", live=False))
    assert (cfg["per_device_train_batch_size"], cfg["gradient_accumulation_steps"], cfg["gradient_checkpointing"]) == (4, 4, True)
    grpo = resolve_grpo(parse_config(cfg))  # TRL's own GRPOConfig checks
    assert (grpo.generation_batch_size, grpo.steps_per_generation, grpo.per_device_train_batch_size) == (16, 4, 4)
    whole = bench.parse_args(["--hinter", "smollm2-135m", "--work", str(tmp_path)])  # default: one micro-batch, as before
    assert (whole.micro_batch, whole.gradient_checkpointing) == (16, False)
    assert bench.settings_key(args) != bench.settings_key(whole)


def test_a_micro_batch_that_splits_the_step_unevenly_is_refused(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--hinter", "smollm2-135m", "--micro-batch", "5", "--work", str(tmp_path)])
    assert "--micro-batch 5: must divide --prompts-per-step x --group-size (16)" in capsys.readouterr().err


def test_temperature_reaches_trls_config_and_a_live_only_run_pairs_its_own_steps(bench, tmp_path):
    """--temperature is GRPOConfig's (first pass and re-rolls); --modes live summarises the live round against its
    own first pass, with no off round to compare."""
    from mentor.training.trl.launcher import parse_config, resolve_grpo

    args = bench.parse_args(["--hinter", "smollm2-135m", "--temperature", "0.6", "--modes", "live", "--work", str(tmp_path)])
    assert args.modes == ("live",)
    cfg = json.loads(bench.round_yaml(args, tmp_path, tmp_path / "prompts", "policy", live=True))
    assert resolve_grpo(parse_config(cfg)).temperature == 0.6
    default = bench.parse_args(["--hinter", "smollm2-135m", "--work", str(tmp_path)])
    assert "temperature" not in json.loads(bench.round_yaml(default, tmp_path, tmp_path / "p", "policy", live=False))
    assert bench.settings_key(args) != bench.settings_key(default)
    lines = [{"mode": "live", "share": 0.5, "first_pass_share": 0.25, "step_time_s": 10.0, "hint_s": 1.0, "problems": []},
             {"mode": "live", "share": 0.25, "first_pass_share": 0.0, "step_time_s": 12.0, "hint_s": 1.0, "problems": []}]
    out = bench.summary(lines, args)
    assert (out["live_gain_over_first_pass"], out["off_mean_share"], out["temperature"]) == (0.25, None, 0.6)
    assert "same_problems_per_step" not in out and "added_s_per_step" not in out


def test_an_unknown_mode_is_refused(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--hinter", "smollm2-135m", "--modes", "live,of", "--work", str(tmp_path)])
    assert "--modes live,of: a comma-separated choice of off, live" in capsys.readouterr().err
