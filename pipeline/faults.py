"""Fault injection for resume tests: ``MENTOR_FAULT=<point>`` kills the process there with SIGKILL.

Points are named ``<stage>.<where>`` (e.g. ``mine.after_collapsed``,
``<stage>.after_shard`` for hint, rollout and rescue (`mentor.pipeline.shards`),
``build.after_shards``, ``<stage>.before_marker``, and
``outdir.staged_output_dir``'s ``<stage>.before_swap`` ...). With
``MENTOR_FAULT_SKIP=N`` the first N passes through the point are let go. The
hook costs one environment lookup; nothing happens unless the variable is set.
"""

from __future__ import annotations

import os
import signal

_passes: dict[str, int] = {}


def fault_point(name: str) -> None:
    if os.environ.get("MENTOR_FAULT") != name:
        return
    seen = _passes.get(name, 0)
    _passes[name] = seen + 1
    if seen >= int(os.environ.get("MENTOR_FAULT_SKIP", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
