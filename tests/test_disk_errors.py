"""Out of disk space and read-only output folders: one line naming the folder, exit 1, the old output kept.

Two ways: a real small or read-only tmpfs (in a user+mount namespace, `unshare -rm`, where the kernel
allows it), and the same errors raised in-process where the writers meet the disk (always run).
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bad_input_lib import error_line, invoke, leftovers, snapshot
from mentor.data import bundled

ROLLOUTS = bundled("gsm8k_rollouts.parquet")


def _collapsed(tmp: Path) -> Path:
    res = invoke(["mine", str(ROLLOUTS), "--out", str(tmp / "c")])
    assert res.exit_code == 0, res.output
    return tmp / "c" / "collapsed.parquet"


def commands(tmp: Path, out: Path) -> dict[str, list[str]]:
    """Each command writing into `out` (all write more than 64 KiB, the small disk below)."""
    collapsed = _collapsed(tmp)
    wf = tmp / "wf.yaml"
    wf.write_text(json.dumps({
        "name": "disk", "base": "gsm8k", "initial_rollouts": {"source": [str(ROLLOUTS)], "format": "canonical"},
        "trainer": {"kind": "offline"}, "hint": {"sample": 2, "backend": {"backend": "fake", "options": {"script": "mentor.stages.hint.agents:fake_script"}}},
    }))
    return {
        "ingest": ["ingest", str(ROLLOUTS), "--format", "canonical", "--out", str(out)],
        "mine": ["mine", str(ROLLOUTS), "--out", str(out)],
        "build": ["build", "--base", "gsm8k", "--out", str(out)],
        "hint": ["hint", str(collapsed), "--out", str(out), "--backend", "fake", "--no-progress"],
        "run": ["run", str(wf), "--run-dir", str(out)],
    }


# --------------------------------------------------------------------------- in-process


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture(scope="module")
def cmds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmds")
    return tmp, commands(tmp, tmp / "OUT")


@pytest.mark.parametrize("name", ["ingest", "mine", "build", "hint", "run"])
def test_out_of_space_is_one_line_and_keeps_the_old_output(name, cmds, tmp_path, monkeypatch):
    _, table = cmds
    out = tmp_path / "out"
    argv = [a.replace(str(cmds[0] / "OUT"), str(out)) for a in table[name]]
    if name in ("ingest", "mine", "build"):  # a previous output that must survive
        res = invoke(argv)
        assert res.exit_code == 0, res.output
    before = snapshot(out)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", _enospc)
    res = invoke(argv)
    line = error_line(res)
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output
    assert line.startswith(f"Error: {out}") and "No space left on device (ENOSPC)" in line and "free disk space" in line, line
    if name in ("ingest", "mine", "build"):
        assert snapshot(out) == before
        assert leftovers(tmp_path) == []


def test_verbose_prints_the_traceback(cmds, tmp_path, monkeypatch):
    monkeypatch.setattr(pq.ParquetWriter, "write_table", _enospc)
    res = invoke(["-v", "mine", str(ROLLOUTS), "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "Traceback (most recent call last)" in res.output and "No space left" in error_line(res)


@pytest.mark.parametrize("name", ["ingest", "mine", "build"])
def test_read_only_parent_is_one_line(name, cmds, tmp_path, monkeypatch):
    """The new output goes into a folder made beside the target: a parent that refuses it is named."""
    import tempfile

    _, table = cmds
    out = tmp_path / "out"
    argv = [a.replace(str(cmds[0] / "OUT"), str(out)) for a in table[name]]

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    res = invoke(argv)
    line = error_line(res)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert line.startswith(f"Error: {out}: cannot create the temporary folder beside it") and "(EROFS)" in line, line
    assert not out.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file modes (the namespace test covers read-only for root)")
@pytest.mark.parametrize("name", ["ingest", "mine", "build"])
def test_read_only_output_folder_by_mode(name, cmds, tmp_path):
    _, table = cmds
    out = tmp_path / "out"
    argv = [a.replace(str(cmds[0] / "OUT"), str(out)) for a in table[name]]
    assert invoke(argv).exit_code == 0
    before = snapshot(out)
    out.chmod(0o555)
    try:
        res = invoke(argv)
    finally:
        out.chmod(0o755)
    assert res.exit_code == 1 and "the output folder is not writable" in error_line(res)
    assert snapshot(out) == before


# --------------------------------------------------------------------------- a real full / read-only disk


def _namespaces_work(tmp: Path) -> bool:
    if not shutil.which("unshare"):
        return False
    d = tmp / "probe"
    d.mkdir(exist_ok=True)
    r = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k none {shlex.quote(str(d))}"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


@pytest.fixture(scope="module")
def real_disk(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("realdisk")
    if not _namespaces_work(tmp):
        pytest.skip("no user+mount namespaces here (unshare -rm): the in-process tests cover the same errors")
    return tmp


def _in_namespace(disk: Path, argv: list[str], setup: str = "", size: str = "64k", read_only: bool = False) -> tuple[int, str, str]:
    """Run `mentor argv` with `disk` a fresh tmpfs of `size` (made read-only after `setup`); returns (rc, stderr, listing)."""
    disk.mkdir(exist_ok=True)
    cli = shlex.join([sys.executable, "-m", "mentor.workflows.cli", *argv])
    d = shlex.quote(str(disk))
    script = (f"mount -t tmpfs -o size={size} none {d} && {setup} "
              + (f"mount -o remount,ro {d} && " if read_only else "")
              + f"{cli} 2>{d}/../stderr.txt; rc=$?; find {d} -mindepth 1 | sort > {d}/../listing.txt 2>/dev/null; "
              + f"(cd {d} && find . -type f -exec sha256sum {{}} + | sort) > {d}/../sums.txt; exit $rc")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300, env=env)
    return r.returncode, (disk.parent / "stderr.txt").read_text(), (disk.parent / "sums.txt").read_text()


@pytest.mark.parametrize("name", ["ingest", "mine", "build", "hint", "run"])
def test_real_full_disk(name, real_disk, cmds):
    tmp, table = cmds
    disk = real_disk / f"full-{name}"
    argv = [a.replace(str(tmp / "OUT"), str(disk / "out")) for a in table[name]]
    rc, err, _ = _in_namespace(disk, argv, size="16k" if name == "hint" else "64k")
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert rc == 1, err
    assert "Traceback" not in err and lines, err
    assert "No space left on device (ENOSPC)" in lines[0], lines[0]


@pytest.mark.parametrize("name", ["ingest", "mine", "build"])
def test_real_full_disk_keeps_the_old_output(name, real_disk, cmds):
    """An old output that fits, a new one that does not: the old one is left byte for byte, nothing beside it."""
    tmp, table = cmds
    old = real_disk / f"old-{name}"
    small = {"ingest": ["ingest", str(ROLLOUTS), "--format", "canonical", "--out", str(old)],
             "mine": ["mine", str(ROLLOUTS), "--out", str(old), "--k-failed", "0"],
             "build": ["build", "--base", "math500", "--out", str(old), "--instruction", "math="]}[name]
    assert invoke(small).exit_code == 0
    want = subprocess.run(f"cd {shlex.quote(str(old))} && find . -type f -exec sha256sum {{}} + | sort", shell=True,
                          capture_output=True, text=True).stdout.replace("./", "./out/")
    disk = real_disk / f"keep-{name}"
    argv = [a.replace(str(tmp / "OUT"), str(disk / "out")) for a in table[name]]
    if name == "mine":
        argv += ["--k-failed", "50", "--failed-budget", "100000"]
    size = {"ingest": "1400k", "mine": "200k", "build": "200k"}[name]  # the old output fits, old + new do not
    rc, err, sums = _in_namespace(disk, argv, setup=f"cp -r {shlex.quote(str(old))} {shlex.quote(str(disk / 'out'))} && ", size=size)
    assert rc == 1 and "No space left on device (ENOSPC)" in err and "Traceback" not in err, err
    assert sums == want  # exactly the old output, and no other file on the disk


@pytest.mark.parametrize("name", ["ingest", "mine", "build", "hint", "run"])
def test_real_read_only_disk(name, real_disk, cmds):
    tmp, table = cmds
    disk = real_disk / f"ro-{name}"
    argv = [a.replace(str(tmp / "OUT"), str(disk / "out")) for a in table[name]]
    rc, err, _ = _in_namespace(disk, argv, setup=f"mkdir {shlex.quote(str(disk / 'out'))} && ", read_only=True)
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert rc == 1 and lines and "Traceback" not in err, err
    assert str(disk / "out") in lines[0] and "read-only file system (erofs)" in lines[0].lower(), lines[0]
