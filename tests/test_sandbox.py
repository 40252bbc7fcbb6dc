"""Hostile programs are contained by the code sandbox, and the test machine is unharmed.

Which layers apply depends on the machine (root or not, user namespaces,
whether `nobody` can read the interpreter); each run reports them in
`SandboxResult.layers` and the tests assert on the layers that are in force.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from mentor.training.sandbox import SandboxLimits, nproc_enforced, run_python

FAST = SandboxLimits(wall_seconds=6, cpu_seconds=3, memory_bytes=512 << 20)


def _own_processes() -> int:
    out = subprocess.run(["ps", "-e", "-o", "pid="], capture_output=True, text=True).stdout
    return len(out.split())


def test_plain_program_runs_with_layers():
    res = run_python("import sys\nprint(sum(range(10)))\nprint(input())", stdin="hello\n", limits=FAST)
    assert res.ok and res.stdout.split() == ["45", "hello"]
    assert {"process", "env", "workdir", "rlimits", "timeout"} <= set(res.layers)
    assert "audit" in res.layers or "netns" in res.layers
    print("sandbox layers here:", res.layers)


def test_infinite_loop_stopped():
    t = time.monotonic()
    res = run_python("while True:\n    pass\n", limits=FAST)
    assert not res.ok
    assert time.monotonic() - t < FAST.wall_seconds + 5


def test_sleeper_killed_by_wall_clock():
    res = run_python("import time\ntime.sleep(60)\n", limits=SandboxLimits(wall_seconds=2))
    assert res.timed_out and res.returncode is None
    assert res.duration < 6


def test_fork_bomb_contained():
    before = _own_processes()
    res = run_python("import os\nwhile True:\n    os.fork()\n", limits=FAST)
    assert not res.ok
    time.sleep(0.5)
    assert _own_processes() <= before + 2  # nothing left behind


@pytest.mark.skipif(not nproc_enforced(), reason="root with an interpreter `nobody` cannot read: the kernel exempts uid 0 "
                    "from RLIMIT_NPROC, so here fork is refused by the audit layer (test_fork_bomb_contained)")
def test_fork_bomb_contained_by_rlimit_nproc_alone():
    before = _own_processes()
    limits = SandboxLimits(wall_seconds=6, cpu_seconds=3, processes=16, allow_fork=True)
    res = run_python("import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n", limits=limits)
    assert not res.ok
    time.sleep(0.5)
    assert _own_processes() <= before + 2


def test_memory_bomb_contained():
    res = run_python("a = []\nwhile True:\n    a.append(bytearray(10**7))\n", limits=FAST)
    assert not res.ok
    assert "MemoryError" in res.stderr or res.returncode in (-9, 137) or res.timed_out


def test_network_blocked():
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "s.settimeout(2)\n"
        "s.connect(('1.1.1.1', 80))\n"
        "print('CONNECTED')\n"
    )
    res = run_python(code, limits=FAST)
    assert not res.ok and "CONNECTED" not in res.stdout


def test_network_namespace_alone_blocks_connections():
    """With the audit layer off, the empty network namespace still has no route (where available)."""
    probe = run_python("pass", limits=FAST)
    if "netns" not in probe.layers:
        pytest.skip(f"no network namespace on this machine (layers: {probe.layers})")
    code = "import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=2)\nprint('CONNECTED')\n"
    res = run_python(code, limits=SandboxLimits(wall_seconds=6, audit=False))
    assert not res.ok and "CONNECTED" not in res.stdout
    assert "unreachable" in res.stderr.lower() or "errno" in res.stderr.lower()


def test_files_outside_workdir_survive(tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("alive")
    victim_dir = tmp_path / "keep"
    victim_dir.mkdir()
    (victim_dir / "x").write_text("x")
    code = (
        "import os, shutil\n"
        f"for f in (lambda: open({str(canary)!r}, 'w').write('pwned'),\n"
        f"          lambda: os.remove({str(canary)!r}),\n"
        f"          lambda: os.rename({str(canary)!r}, 'stolen'),\n"
        f"          lambda: shutil.rmtree({str(victim_dir)!r}),\n"
        f"          lambda: open({str(tmp_path / 'new.txt')!r}, 'x').write('x')):\n"
        "    try:\n"
        "        f()\n"
        "        print('DID')\n"
        "    except Exception as e:\n"
        "        print('refused', type(e).__name__)\n"
        "open('inside.txt', 'w').write('ok')\n"  # its own dir is writable
        "print(open('inside.txt').read())\n"
    )
    res = run_python(code, limits=FAST)
    assert "DID" not in res.stdout, res.stdout
    assert res.stdout.strip().endswith("ok"), res.stderr
    assert canary.read_text() == "alive"
    assert (victim_dir / "x").exists() and not (tmp_path / "new.txt").exists()


def test_environment_secrets_not_visible(monkeypatch):
    monkeypatch.setenv("MENTOR_TEST_SECRET", "hunter2-secret")
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(os.environ.get('MENTOR_TEST_SECRET'))\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            print(open(f'/proc/{pid}/environ', 'rb').read().decode('latin1'))\n"
        "        except Exception:\n"
        "            pass\n"
    )
    res = run_python(code, limits=FAST)
    assert "hunter2-secret" not in res.stdout + res.stderr
    assert "None" in res.stdout


def test_output_capped_and_file_size_limited():
    res = run_python("print('x' * 10_000_000)\n", limits=SandboxLimits(max_output=1000, file_bytes=1 << 20))
    assert len(res.stdout) <= 1000 and res.stdout_truncated
    res = run_python("open('big', 'wb').write(b'0' * (4 << 20))\n", limits=SandboxLimits(file_bytes=1 << 20))
    assert not res.ok  # SIGXFSZ or OSError: File too large


def test_workdir_is_empty_and_removed():
    res = run_python("import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\n", limits=FAST)
    cwd, listing = res.stdout.splitlines()
    assert listing == "['main.py']"
    assert not os.path.exists(cwd)


def _layers() -> list[str]:
    return run_python("pass", limits=FAST).layers


def test_read_only_filesystem_alone_protects_files(tmp_path):
    """With the audit layer off, the read-only mount namespace still keeps the canary (where available)."""
    if "fsro" not in _layers():
        pytest.skip(f"no private mount namespace here (layers: {_layers()})")
    canary = tmp_path / "canary.txt"
    canary.write_text("alive")
    code = (
        "import os\n"
        f"for f in (lambda: open({str(canary)!r}, 'w').write('pwned'), lambda: os.remove({str(canary)!r})):\n"
        "    try:\n"
        "        f()\n"
        "        print('DID')\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
    )
    res = run_python(code, limits=SandboxLimits(wall_seconds=6, audit=False))
    assert "DID" not in res.stdout and res.stdout.count("refused") == 2, res.stdout + res.stderr
    assert canary.read_text() == "alive"


def test_private_proc_alone_hides_secrets(monkeypatch):
    """With the audit layer off, the namespace's own /proc shows no other process."""
    if "procns" not in _layers():
        pytest.skip(f"no private /proc here (layers: {_layers()})")
    monkeypatch.setenv("MENTOR_TEST_SECRET", "hunter2-secret")
    code = "import os\nprint([p for p in os.listdir('/proc') if p.isdigit()])\n"
    res = run_python(code, limits=SandboxLimits(wall_seconds=6, audit=False))
    assert res.ok and res.stdout.strip() == "['1']"


def test_hostile_programs_without_namespaces(tmp_path, monkeypatch):
    """Where namespaces are unavailable, the remaining layers (env, rlimits, audit, uid/nocaps) still contain them."""
    limits = SandboxLimits(wall_seconds=6, cpu_seconds=3, memory_bytes=512 << 20, namespaces=False)
    monkeypatch.setenv("MENTOR_TEST_SECRET", "hunter2-secret")
    canary = tmp_path / "canary.txt"
    canary.write_text("alive")
    before = _own_processes()
    programs = {
        "fork": "import os\nwhile True:\n    os.fork()\n",
        "net": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\nprint('CONNECTED')\n",
        "file": f"import os\nos.remove({str(canary)!r})\nprint('DID')\n",
        "env": "import os\nprint([open(f'/proc/{p}/environ','rb').read() for p in os.listdir('/proc') if p.isdigit() and p != str(os.getpid())])\n",
        "memory": "a = []\nwhile True:\n    a.append(bytearray(10**7))\n",
    }
    for name, code in programs.items():
        res = run_python(code, limits=limits)
        assert not {"netns", "pidns", "fsro"} & set(res.layers)
        assert not res.ok, name
        assert "CONNECTED" not in res.stdout and "DID" not in res.stdout and "hunter2" not in res.stdout + res.stderr, name
    time.sleep(0.5)
    assert canary.read_text() == "alive"
    assert _own_processes() <= before + 2
