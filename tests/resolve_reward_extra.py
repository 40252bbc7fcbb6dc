"""Does ``mentor[reward]`` install beside a trainer's own pins without moving them? pip's resolver, dry run.

For each trainer as its GPU recipe installs it (``openrlhf[vllm]==0.11.2``, ``verl[vllm]==0.9.1``,
``trl[vllm]==1.16.0``), on the oldest Python it supports, pip resolves the trainer's requirements
alone and then together with this checkout's ``mentor[reward]`` (``--dry-run --report``, nothing
installed). A package pinned or chosen by the trainer alone that the second resolution puts at
another version is "moved"; packages only the second one has are "added". Requirements that pip
cannot resolve on a machine without CUDA are left out and named (``flash-attn`` is an sdist whose
build imports torch). The trainers' requirement lists are read from their installed metadata
(`mentor setup-cpu --openrlhf` and the ``trl`` extra install them).

Run by hand (it needs the package index, a few minutes):

    python tests/resolve_reward_extra.py [--python3.10 PATH] [--python3.11 PATH]

One JSON line per trainer: python, packages resolved, moved, added, left out.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
TRAINERS = {"openrlhf": ("0.11.2", "vllm", "3.10"), "verl": ("0.9.1", "vllm", "3.10"), "trl": ("1.16.0", "vllm", "3.11")}
NEEDS_CUDA_TO_BUILD = {"flash-attn"}


def requirements(dist: str, extra: str, left_out: list[str] | None = None) -> list[str]:
    """The trainer's own requirements with its extra (and the extras that extra names of the trainer itself);
    the ones pip cannot resolve without CUDA go to `left_out`."""
    out: list[str] = []
    extras, seen = [extra], set()
    while extras:
        current = extras.pop()
        if current in seen:
            continue
        seen.add(current)
        for text in md.requires(dist) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": current}):
                continue
            if req.name.lower() == dist:
                extras += sorted(req.extras)
                continue
            if req.name.lower() in NEEDS_CUDA_TO_BUILD:
                if left_out is not None and req.name not in left_out:
                    left_out.append(req.name)
                continue
            req.marker = None
            if str(req) not in out:
                out.append(str(req))
    return out


def venv_pip(python: str, where: Path) -> str:
    subprocess.run([python, "-m", "venv", str(where)], check=True)
    pip = str(where / "bin" / "pip")
    subprocess.run([pip, "install", "-q", "-U", "pip"], check=True, env=ENV)
    return pip


def resolve(pip: str, reqs: list[str], report: Path) -> dict[str, str]:
    proc = subprocess.run([pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), *reqs],
                          capture_output=True, text=True, env=ENV)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
        raise RuntimeError("; ".join(lines[-3:]) or proc.stderr[-800:])
    items = json.loads(report.read_text())["install"]
    return {re.sub(r"[-_.]+", "-", i["metadata"]["name"].lower()): i["metadata"]["version"] for i in items}


# The public index only: without this machine's torch cap and its local wheel store (a trainer pins its own torch).
ENV = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"} | {"PIP_CONFIG_FILE": os.devnull,
                                                                         "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python3.10", dest="py310", default=shutil.which("python3.10"))
    ap.add_argument("--python3.11", dest="py311", default=sys.executable if sys.version_info[:2] == (3, 11) else shutil.which("python3.11"))
    a = ap.parse_args()
    pythons = {"3.10": a.py310, "3.11": a.py311}
    with tempfile.TemporaryDirectory(prefix="mentor-resolve-") as tmp:
        tmp_path = Path(tmp)
        pips: dict[str, str] = {}
        for trainer, (version, extra, py) in TRAINERS.items():
            line: dict = {"trainer": f"{trainer}[{extra}]=={version}", "python": py}
            left_out: list[str] = []
            try:
                reqs = requirements(trainer, extra, left_out)
            except md.PackageNotFoundError:
                print(json.dumps(line | {"skipped": f"{trainer} is not installed here (its requirement list is read from it)"}))
                continue
            if not pythons[py]:
                print(json.dumps(line | {"skipped": f"no Python {py}"}))
                continue
            pip = pips.get(py) or pips.setdefault(py, venv_pip(pythons[py], tmp_path / f"venv-{py}"))
            try:
                alone = resolve(pip, reqs, tmp_path / f"{trainer}-alone.json")
                both = resolve(pip, [*reqs, f"mentor[reward] @ {REPO.as_uri()}"], tmp_path / f"{trainer}-both.json")
            except RuntimeError as exc:
                print(json.dumps(line | {"error": str(exc)}))
                continue
            moved = {n: f"{v} -> {both[n]}" for n, v in alone.items() if n in both and both[n] != v}
            added = sorted(f"{n}=={v}" for n, v in both.items() if n not in alone)
            print(json.dumps(line | {"resolved": len(alone), "moved": moved, "added": added,
                                     "pins": {n: alone.get(n) for n in ("torch", "transformers", "vllm", "ray")},
                                     "left_out": left_out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
