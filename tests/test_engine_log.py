"""The engine's own logging stays out of the terminal unless `mentor -v` asks for it (README command 1, `mentor demo`).

No engine is started here: what decides where the logs go (`engine_to_terminal`) and what the engine's processes
inherit while they start (`stderr_to`: fd 2 and the multiprocessing resource tracker) is checked on its own.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

from mentor.pipeline.llm import engine_to_terminal


def test_mentor_progress_at_info_keeps_the_engine_quiet(monkeypatch):
    root, mentor = logging.getLogger(), logging.getLogger("mentor")
    monkeypatch.setattr(root, "level", logging.WARNING)
    monkeypatch.setattr(mentor, "level", logging.INFO)  # what `mentor demo` sets to show its progress
    logging.Logger.manager._clear_cache()
    try:
        assert not engine_to_terminal()
        monkeypatch.setattr(root, "level", logging.INFO)  # `mentor -v`
        logging.Logger.manager._clear_cache()
        assert engine_to_terminal()
    finally:
        logging.Logger.manager._clear_cache()


def test_the_resource_trackers_note_at_exit_goes_to_the_engine_log(tmp_path):
    """vLLM's engine processes register shared-memory queues with the parent's resource tracker and leave one for it
    to unlink; the tracker's note about it at exit belongs in the engine log, not under mentor's summary."""
    log = tmp_path / "engine.log"
    code = textwrap.dedent(f"""
        from pathlib import Path
        from multiprocessing import shared_memory
        from mentor.pipeline.backends.vllm.engine import stderr_to

        with stderr_to(Path({str(log)!r})):
            pass  # the engine starts here
        shm = shared_memory.SharedMemory(create=True, size=64)  # an engine's queue, never unlinked
        shm.close()
        print("summary")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "summary"
    assert "resource_tracker" not in done.stderr and "leaked" not in done.stderr, done.stderr
    assert "leaked shared_memory" in log.read_text()
