"""The toy plugins of the extension tests, each ONE file of a ``MENTOR_PLUGIN_PATH`` folder (issue 60).

A stage (``stages/toy.py``), an agent (``agents/toy_focus.py``), a rule (``rules/toy_exactly.py``), a backend
(``backends/toy.py``), a trainer (``trainers/toy/launcher.py``) and a command (``commands/toy_count.py``):
`write_plugins` lays any of them into a folder, `mentor` runs a command in its own process with that folder on the plugin path (the path is read
when mentor starts). The toy backend's canned hint says "exactly", which the toy rule rejects.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOY_STAGE = '''
"""A toy stage: one line per collapsed problem (the whole stage is this file)."""
import json

import polars as pl
from pydantic import BaseModel, ConfigDict

from mentor.pipeline.outdir import Owns
from mentor.pipeline.stage import RoundJob, Stage, StatsLayout

TOY_STATS = StatsLayout(counters=("problems",), logger=__name__)


class ToyInputs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    collapsed: list[str]


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = "toy"


class ToyStage(Stage):
    name = "toy"
    Inputs = ToyInputs
    Config = ToyConfig
    owns = Owns(("toy.jsonl", "stats.json"))
    summary = ("problems",)
    round_dir, round_order = "toys", 60
    status_columns = {"rows": ("problems",), "toy_labelled": ("problems",)}

    def status_note(self, row):
        return f"round {row['round']}: the toy labelled {row['toy_labelled']} problems" if row.get("toy_labelled") else None

    def run(self, inputs, cfg, out_dir, ctx):
        stats = TOY_STATS()
        ids = pl.read_parquet(inputs.collapsed)["problem_id"].to_list()
        (out_dir / "toy.jsonl").write_text("".join(json.dumps({"problem_id": i, "label": cfg.label}) + "\\n" for i in ids))
        stats.problems = len(ids)
        return stats

    def round_job(self, rnd):
        collapsed = rnd.run_dir.stage(rnd.index, "mine").path / "collapsed.parquet"
        return RoundJob({"label": "round"}, {"collapsed": [str(collapsed)]}, {"label": "round"}, upstream=[rnd.tokens["mine"]])


STAGE = ToyStage()
'''

TOY_AGENT = '''
"""A toy analysis agent: names the one thing the student should focus on."""
from mentor.stages.hint.agent import Agent, Switch, object_schema, text_field

FOCUS = "toy focus on the units"


class ToyFocus(Agent):
    name = "toy_focus"
    role = "analysis"  # after attribution, before generation
    switch = Switch("toy_focus", "Run the toy focus agent.")
    max_tokens_default, max_tokens_help = 64, "max_tokens of a toy_focus call."
    state = {"focus": lambda: None}
    counters = ("toy_focus_used",)
    fake = '{"focus": "%s"}' % FOCUS

    def messages(self, s, cfg, t):
        return [{"role": "system", "content": "Name the one thing to focus on, as JSON {\\"focus\\": ...}."},
                {"role": "user", "content": s.row["problem"]}]

    def schema(self, cfg, limits):
        return object_schema({"focus": text_field(60)})

    def fields(self, obj, cfg):
        return {"focus": obj["focus"]} if isinstance(obj.get("focus"), str) and obj["focus"].strip() else None

    def consume(self, p, res, parsed, m):
        if parsed is not None:
            p.focus = parsed["focus"]
            m.st.toy_focus_used += 1
            p.keywords = [*p.keywords, parsed["focus"]]
        m.transition(p, "analysed")


AGENT = ToyFocus()
'''

TOY_RULE = '''
"""A toy rule: a hint may not say "exactly"."""
from mentor.stages.rules.registry import RuleRegistry


@RuleRegistry.add("toy_exactly", "the hint says 'exactly'; say it without that word")
def toy_exactly(text, ctx):
    return "exactly" in text.lower()
'''

TOY_BACKEND = '''
"""A toy backend: every answer comes from one canned rule (the JSON schema's fields, filled in by name and type)."""

import json

from mentor.pipeline.backends import BackendKind
from mentor.pipeline.llm import CountingBackend, GenResult

HINT = "Toy hint: name exactly the quantity the question asks for, with its unit, before computing anything."
CANNED = {"hint": HINT, "error": "The attempts answer a different quantity than the one asked.",
          "feedback": "Specific and answer-free."}


def _value(name, prop):
    kind = prop.get("type")
    if kind == "array":
        return ["the quantity asked"]
    if kind in ("integer", "number"):
        return prop.get("maximum", 1)
    if kind == "boolean":
        return True
    return CANNED.get(name, "toy")


class ToyBackend(CountingBackend):
    name = "toy"

    def _answer(self, req):
        props = (req.json_schema or {}).get("properties", {})
        text = json.dumps({k: _value(k, p) for k, p in props.items()}) if req.json_schema else "toy says 42"
        return GenResult(req.id, text, "stop", 1, len(text) // 4)


class Toy(BackendKind):
    name = "toy"
    what = "a canned rule"
    help = "answers every request by one canned rule (a plugin)"

    serves = True  # `mentor serve --backend toy`: a stand-in server, the command only

    def make(self, model, options):
        return ToyBackend(model or "toy")

    def serve_command(self, model, settings):
        return ["/bin/echo", "toy-server", model or "toy", str(settings["port"])], {"TOY_SERVER": "1"}

    def cpu_setup(self, installed):
        return [["uninstall", "-y", "toy-cpu-conflict"]], "the toy needs no CPU fixes but this note"


BACKEND = Toy()
'''

TOY_TRAINER = '''
"""A toy trainer: one round answers each prompt row k times through mentor's reward core."""

import os
import subprocess
import time
from typing import ClassVar

from mentor.training.launcher import LauncherBase, RoundConfig, finish_round, outcome_record

ROUND = """
import glob, json, os, sys
import pyarrow.parquet as pq
from mentor.training.reward_core import score_and_log, target_from_label
sources, solved, k = sys.argv[1].split(","), set(json.loads(sys.argv[2])), int(sys.argv[3])
files = [f for s in sources for f in (sorted(glob.glob(os.path.join(s, "part-*.parquet"))) if os.path.isdir(s) else [s])]
for f in files:
    for row in pq.read_table(f).to_pylist():
        prompt = row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"])
        target = target_from_label(row["label"], prompt)
        answer = target.reference if target.problem_id in solved else "-1"
        for _ in range(k):
            score_and_log(target, "So the answer is \\\\\\\\boxed{" + str(answer) + "}.", prompt, "toy", truncated=False)
"""


class ToyConfig(RoundConfig):
    k: int = 4
    solved: list[str] = []


class ToyLauncher(LauncherBase):
    kind: ClassVar[str] = "toy"
    Config: ClassVar[type[ToyConfig]] = ToyConfig

    def command(self, cfg):
        return [cfg.python, "-c", ROUND, ",".join(cfg.prompt_sources), __import__("json").dumps(cfg.solved), str(cfg.k)]

    def env(self, cfg):
        return {"MENTOR_ROLLOUT_DIR": str(cfg.rollout_dir), "MENTOR_ROUND": str(cfg.round)}

    def run_round(self, cfg):
        cmd, env, started = self.command(cfg), self.env(cfg), time.time()
        cfg.rollout_dir.mkdir(parents=True, exist_ok=True)
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        with open(cfg.log_file, "wb") as fh:
            code = subprocess.run(cmd, env=os.environ | env, stdout=fh, stderr=subprocess.STDOUT).returncode
        outcome = outcome_record(cfg, code, cfg.output_dir if code == 0 else None, cfg.actor_model or "toy", cmd, env, started)
        return finish_round(cfg, outcome, f"the toy trainer exited with code {code}" if code else None)


LAUNCHER = ToyLauncher()
'''

TOY_COMMAND = '''
"""A toy command, `mentor toy-count`: the problems of collapsed datasets (the whole command is this file)."""
import click

COMMANDS = {"toy-count": "Count the problems of collapsed datasets (a toy command from one plugin file)."}


@click.command("toy-count")
@click.argument("collapsed", nargs=-1, required=True)
def toy_count(collapsed):
    """Print how many problems the COLLAPSED datasets hold."""
    import polars as pl

    click.echo(sum(pl.read_parquet(path).height for path in collapsed))
'''

FOCUS = "toy focus on the units"  # the toy agent's answer on the fake backend (its ``fake``)
BACKEND_HINT = "Toy hint: name exactly the quantity the question asks for, with its unit, before computing anything."

# kind -> (its one file in the plugin folder, its source)
PLUGINS = {
    "stage": ("stages/toy.py", TOY_STAGE),
    "agent": ("agents/toy_focus.py", TOY_AGENT),
    "rule": ("rules/toy_exactly.py", TOY_RULE),
    "backend": ("backends/toy.py", TOY_BACKEND),
    "trainer": ("trainers/toy/launcher.py", TOY_TRAINER),
    "command": ("commands/toy_count.py", TOY_COMMAND),
}


def write_plugins(folder: Path, *kinds: str) -> Path:
    """Write the toy plugins of `kinds` (keys of `PLUGINS`) into `folder`, one file each; returns `folder`."""
    for kind in kinds:
        name, source = PLUGINS[kind]
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(source)
    return folder


def mentor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`mentor ARGS` in its own process with `env` (its ``MENTOR_PLUGIN_PATH``), output captured as text."""
    return subprocess.run([sys.executable, "-m", "mentor.workflows.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600)
