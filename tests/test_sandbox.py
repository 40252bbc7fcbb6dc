"""Hostile programs are contained by the code sandbox, and the test machine is unharmed.

Which layers apply depends on the machine (bubblewrap or the legacy fallback,
root or not); each run reports them in `SandboxResult.layers`, and the tests
run on the machine's backend and on the legacy backend explicitly.
(`test_reward_integrity` drives the same attacks through the reward entry points.)
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from mentor.training import sandbox
from mentor.training.code_verify import parse_code_label, run_humaneval
from mentor.training.sandbox import REQUIRED_LAYERS, SandboxLimits, SandboxProcess, SandboxUnavailable, run_python

FAST = SandboxLimits(wall_seconds=6, cpu_seconds=3, memory_bytes=512 << 20)


@pytest.fixture(params=["default", "legacy"])
def backend_kind(request, monkeypatch):
    if request.param == "legacy":
        impl = sandbox._Legacy()
        seen = sandbox._probe(impl)
        assert seen is not None, "the legacy backend does not start here"
        monkeypatch.setattr(sandbox, "_BACKEND", sandbox.Backend(impl, sandbox._verified(*seen), seen[1]))
    return sandbox.backend().name


def _slot_processes() -> list[str]:
    out = subprocess.run(["ps", "-e", "-o", "uid=,pid="], capture_output=True, text=True).stdout.split("\n")
    slots = range(sandbox.UID_BASE, sandbox.UID_BASE + sandbox.SLOTS)
    return [line for line in out if line.split() and int(line.split()[0]) in slots]


def test_plain_program_runs_with_layers(backend_kind):
    res = run_python("import sys\nprint(sum(range(10)))\nprint(input())", stdin="hello\n", limits=FAST)
    assert res.ok and res.stdout.split() == ["45", "hello"], res.stderr
    assert {"process", "env", "rlimits", "timeout", "uid", "nproc"} <= set(res.layers)
    if backend_kind == "bwrap":
        assert set(REQUIRED_LAYERS) <= set(res.layers)
    print("sandbox layers here:", backend_kind, res.layers)


def test_machine_backend_has_every_layer_where_bubblewrap_works():
    """On a machine with bubblewrap (CI installs it), nothing required is missing."""
    if sandbox.backend().name != "bwrap":
        pytest.skip(f"no working bubblewrap here (backend {sandbox.backend().name}); the verifier warns about it")
    assert [layer for layer in REQUIRED_LAYERS if layer not in sandbox.layers_here()] == []


def test_never_uid_zero_and_root_files_unreadable(backend_kind):
    code = (
        "import os\n"
        "print(os.getresuid(), os.getresgid(), os.getgroups())\n"
        "try:\n"
        "    open('/etc/shadow').read()\n"
        "    print('SHADOW')\n"
        "except OSError as e:\n"
        "    print('no shadow', e.errno)\n"
    )
    res = run_python(code, limits=FAST)
    assert res.ok, res.stderr
    uids = eval(res.stdout.splitlines()[0].split(")")[0] + ")")
    assert 0 not in uids and "SHADOW" not in res.stdout


def test_worker_and_tester_run_under_different_uids():
    deadline = time.monotonic() + 10
    with SandboxProcess("worker", FAST, deadline) as a, SandboxProcess("tester", FAST, deadline) as b:
        assert a.hello(deadline) and b.hello(deadline)
        assert a.identity["uid"] != b.identity["uid"] and 0 not in (a.identity["uid"], b.identity["uid"])
        assert a.identity["caps"] == 0 and b.identity["caps"] == 0


def test_infinite_loop_stopped(backend_kind):
    t = time.monotonic()
    res = run_python("while True:\n    pass\n", limits=FAST)
    assert not res.ok
    assert time.monotonic() - t < FAST.wall_seconds + 5


def test_sleeper_killed_by_wall_clock(backend_kind):
    res = run_python("import time\ntime.sleep(60)\n", limits=SandboxLimits(wall_seconds=2))
    assert res.timed_out and res.returncode is None
    assert res.duration < 6


def test_fork_bomb_contained_by_the_process_limit(backend_kind):
    """RLIMIT_NPROC of the run's own uid bounds it (the legacy tripwire also refuses fork); nothing is left."""
    code = "import os, time\nn = 0\nwhile True:\n    try:\n        os.fork()\n        n += 1\n    except OSError:\n        break\nprint('forks', n)\n"
    res = run_python(code, limits=SandboxLimits(wall_seconds=6, processes=8))
    if "forks" in res.stdout:
        assert all(int(line.split()[1]) < 8 for line in res.stdout.splitlines() if line.startswith("forks"))
    time.sleep(0.3)
    assert _slot_processes() == []


def test_memory_bomb_contained(backend_kind):
    res = run_python("a = []\nwhile True:\n    a.append(bytearray(10**7))\n", limits=FAST)
    assert not res.ok
    assert "MemoryError" in res.stderr or res.returncode in (-9, 137) or res.timed_out


def test_network_unreachable(backend_kind):
    code = "import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=2)\nprint('CONNECTED')\n"
    res = run_python(code, limits=FAST)
    assert not res.ok and "CONNECTED" not in res.stdout


def test_files_outside_survive(tmp_path, backend_kind):
    canary = tmp_path / "canary.txt"
    canary.write_text("alive")
    victim_dir = tmp_path / "keep"
    victim_dir.mkdir()
    (victim_dir / "x").write_text("x")
    code = (
        "import os, shutil\n"
        f"for f in (lambda: open({str(canary)!r}, 'w').write('pwned'),\n"
        f"          lambda: os.remove({str(canary)!r}),\n"
        f"          lambda: shutil.rmtree({str(victim_dir)!r}),\n"
        f"          lambda: open({str(tmp_path / 'new.txt')!r}, 'x').write('x')):\n"
        "    try:\n"
        "        f()\n"
        "        print('DID')\n"
        "    except Exception as e:\n"
        "        print('refused', type(e).__name__)\n"
        "open('inside.txt', 'w').write('ok')\n"  # its own work dir is writable
        "print(open('inside.txt').read())\n"
    )
    res = run_python(code, limits=FAST)
    assert "DID" not in res.stdout, res.stdout
    assert res.stdout.strip().endswith("ok"), res.stderr
    assert canary.read_text() == "alive"
    assert (victim_dir / "x").exists() and not (tmp_path / "new.txt").exists()


def test_filesystem_view_holds_no_caller_files(tmp_path):
    """bwrap: the project, the datasets and the rest of /root do not exist inside."""
    if sandbox.backend().name != "bwrap":
        pytest.skip("the legacy backend shows the whole (read-only) filesystem")
    here = Path(__file__).resolve()
    code = (
        "import os\n"
        f"for p in ({str(here)!r}, {str(tmp_path)!r}, '/work', '/home', '/root/.cache', '/etc/passwd'):\n"
        "    print(p, os.path.exists(p))\n"
        "print(sorted(os.listdir('/')))\n"
    )
    res = run_python(code, limits=FAST)
    assert res.ok, res.stderr
    assert " True" not in res.stdout, res.stdout


def test_environment_secrets_not_visible(monkeypatch, backend_kind):
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


def test_output_capped_and_file_size_limited(backend_kind):
    res = run_python("print('x' * 10_000_000)\n", limits=SandboxLimits(max_output=1000, file_bytes=1 << 20))
    assert len(res.stdout) <= 1000 and res.stdout_truncated
    res = run_python("open('big', 'wb').write(b'0' * (4 << 20))\n", limits=SandboxLimits(file_bytes=1 << 20))
    assert not res.ok  # SIGXFSZ or OSError: File too large


def test_writable_tmp_is_size_limited():
    if sandbox.backend().name != "bwrap":
        pytest.skip("legacy: the work dir is on the host's /tmp")
    code = "for i in range(64):\n    open(f'f{i}', 'wb').write(b'0' * (1 << 20))\n"
    res = run_python(code, limits=SandboxLimits(tmp_bytes=8 << 20, file_bytes=2 << 20))
    assert not res.ok and "No space left" in res.stderr


def test_no_process_survives(backend_kind):
    code = "import os\nif os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(60)\nprint('parent done')\n"
    run_python(code, limits=SandboxLimits(wall_seconds=3, processes=4))
    time.sleep(0.3)
    assert _slot_processes() == []


def test_hostile_programs_without_namespaces(tmp_path, monkeypatch):
    """Legacy without namespaces (a container without privileges): uid, rlimits and the tripwire still contain them."""
    impl = sandbox._Legacy()
    seen = sandbox._probe(impl)
    monkeypatch.setattr(sandbox, "_BACKEND", sandbox.Backend(impl, sandbox._verified(*seen), seen[1]))
    limits = SandboxLimits(wall_seconds=6, cpu_seconds=3, memory_bytes=512 << 20, namespaces=False)
    monkeypatch.setenv("MENTOR_TEST_SECRET", "hunter2-secret")
    canary = tmp_path / "canary.txt"
    canary.write_text("alive")
    programs = {
        "fork": "import os\nwhile True:\n    os.fork()\n",
        "net": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\nprint('CONNECTED')\n",
        "file": f"import os\nos.remove({str(canary)!r})\nprint('DID')\n",
        "env": "import os\nprint([open(f'/proc/{p}/environ','rb').read() for p in os.listdir('/proc') if p.isdigit() and p != str(os.getpid())])\n",
        "memory": "a = []\nwhile True:\n    a.append(bytearray(10**7))\n",
        "root": "import os\nprint('ROOT' if 0 in os.getresuid() else 'user')\nopen('/etc/shadow').read()\nprint('SHADOW')\n",
    }
    for name, code in programs.items():
        res = run_python(code, limits=limits)
        assert not {"netns", "pidns", "fsro"} & set(res.layers)
        assert not res.ok, name
        out = res.stdout + res.stderr
        assert not {"CONNECTED", "DID", "hunter2", "ROOT", "SHADOW"} & set(out.split()), (name, out)
    time.sleep(0.3)
    assert canary.read_text() == "alive"
    assert _slot_processes() == []


# --------------------------------------------------------------------------- fallback, warnings, strict mode


def test_fallback_without_bubblewrap_warns_once_naming_the_layer(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "_BACKEND", None)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.setattr(sandbox, "_WARNED", set())
    monkeypatch.delenv("MENTOR_SANDBOX_STRICT", raising=False)
    with caplog.at_level(logging.WARNING, logger="mentor.training.sandbox"):
        for _ in range(3):
            res = run_python("print('hi')", limits=FAST)
            assert res.ok and res.backend == "legacy"
    text = [r.getMessage() for r in caplog.records]
    assert sum("bubblewrap is not installed" in t for t in text) == 1
    assert sum("'fsview' is not in force" in t for t in text) == 1, text


def test_strict_mode_refuses_a_missing_layer(monkeypatch):
    monkeypatch.setattr(sandbox, "_BACKEND", None)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.setenv("MENTOR_SANDBOX_STRICT", "1")
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        run_python("print('hi')", limits=FAST)
    # Through the verifier: a score of 0 (with the reason), never an exception.
    label = parse_code_label({"tests": "def check(c):\n    assert c() == 1\n", "entry_point": "f", "kind": "humaneval"})
    from mentor.training.code_verify import run_code_tests

    out = run_code_tests("def f():\n    return 1\n", {"tests": label.tests, "entry_point": "f", "kind": "humaneval"})
    assert out.score == 0.0 and "sandbox unavailable" in out.detail


def test_strict_mode_passes_where_every_layer_holds(monkeypatch):
    if sandbox.backend().name != "bwrap":
        pytest.skip("no working bubblewrap here")
    monkeypatch.setenv("MENTOR_SANDBOX_STRICT", "1")
    assert run_python("print('hi')", limits=FAST).ok


# --------------------------------------------------------------------------- the message protocol


def _label(tests: str, entry: str = "f") -> object:
    return parse_code_label({"tests": tests, "entry_point": entry, "kind": "humaneval"})


@pytest.mark.parametrize(
    ("code", "detail"),
    [
        ("def f(x):\n    return 'x' * (8 << 20)\n", "oversized"),
        ("def f(x):\n    a = []\n    a.append(a)\n    return a\n", "not plain data"),
        ("def f(x):\n    return object()\n", "not plain data"),
        ("import os\ndef f(x):\n    os.write(4, b'{\"ok\": [\"zz\", 1]}\\n')\n    os._exit(0)\n", "not plain data"),
        ("import os\ndef f(x):\n    os.write(4, b'not json\\n')\n    os._exit(0)\n", "malformed"),
        ("import os\ndef f(x):\n    os.write(4, b'{\"ok\": 1, \"done\": \"pass\"}\\n')\n    os._exit(0)\n", "malformed reply"),
    ],
)
def test_bad_replies_fail_the_check(code, detail):
    out = run_humaneval(code, _label("def check(candidate):\n    assert candidate(1) == 1\n"), SandboxLimits(wall_seconds=5))
    assert out.score == 0.0 and detail in out.detail, out.detail


def test_reply_values_keep_their_types():
    tests = (
        "import math\n"
        "def check(candidate):\n"
        "    r = candidate([1, 2], (3, 4), {'a': {1, 2}}, None, float('nan'), -0.0, 10**30, b'\\x00')\n"
        "    assert r[0] == [1, 2] and type(r[1]) is tuple and r[2] == {'a': {1, 2}} and r[3] is None\n"
        "    assert math.isnan(r[4]) and math.copysign(1, r[5]) == -1 and r[6] == 10**30 and r[7] == b'\\x00'\n"
        "    assert candidate([1, 2], (3, 4), {}, None, 0.0, 0.0, 0, b'')[1] != [3, 4]\n"
    )
    out = run_humaneval("def f(*a):\n    return list(a)\n", _label(tests), SandboxLimits(wall_seconds=5))
    assert out.score == 1.0, out.detail


def test_arguments_are_passed_by_value():
    tests = "def check(candidate):\n    xs = [3, 1, 2]\n    candidate(xs)\n    assert xs == [3, 1, 2]\n"
    out = run_humaneval("def f(xs):\n    xs.clear()\n    return None\n", _label(tests), SandboxLimits(wall_seconds=5))
    assert out.score == 1.0, out.detail


def test_a_check_that_never_calls_the_candidate_does_not_pass():
    out = run_humaneval("def f():\n    return 1\n", _label("def check(candidate):\n    pass\n"), SandboxLimits(wall_seconds=5))
    assert out.score == 0.0 and "never called" in out.detail


def test_probe_facts_are_json():
    be = sandbox.backend()
    json.dumps(be.facts)
    assert be.facts.get("uid") not in (0, None)
    assert os.geteuid() != 0 or be.facts.get("uid") >= sandbox.UID_BASE


# --------------------------------------------------------------------------- mentor setup-sandbox


def test_setup_sandbox_reports_layers(monkeypatch):
    from click.testing import CliRunner

    from mentor.cli import cli

    res = CliRunner().invoke(cli, ["setup-sandbox", "--no-install"])
    assert res.exit_code == 0, res.output
    assert f"sandbox backend: {sandbox.backend().name}" in res.output and "rlimits" in res.output
    # Where a layer is missing, --strict is an error naming it.
    impl = sandbox._Legacy()
    seen = sandbox._probe(impl)
    monkeypatch.setattr(sandbox, "_BACKEND", sandbox.Backend(impl, sandbox._verified(*seen), seen[1]))
    res = CliRunner().invoke(cli, ["setup-sandbox", "--no-install", "--strict"])
    assert res.exit_code == 1 and "fsview" in res.output


def test_setup_sandbox_install_plan(monkeypatch):
    from mentor.cli import sandbox as cmd_sandbox

    monkeypatch.setattr(cmd_sandbox.shutil, "which", lambda name: "/usr/bin/bwrap" if name == "bwrap" else None)
    assert cmd_sandbox.install_commands() == []  # already there
    monkeypatch.setattr(cmd_sandbox.shutil, "which", lambda name: None)
    assert cmd_sandbox.install_commands() is None  # no apt-get: the manual step is printed instead
    monkeypatch.setattr(cmd_sandbox.shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    monkeypatch.setattr(cmd_sandbox.os, "geteuid", lambda: 0)
    plan = cmd_sandbox.install_commands()
    assert plan[0][:3] == ["apt-get", "install", "-y"] and plan[1] == ["apt-get", "update"] and plan[-1] == plan[0]


def test_works_in_a_process_holding_many_descriptors():
    """A trainer process may hold more than FD_SETSIZE (1024) descriptors; the pipes above it still work."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        out = run_humaneval("def f(x):\n    return x\n", _label("def check(candidate):\n    assert candidate(2) == 2\n"), FAST)
        assert out.score == 1.0, out.detail
        assert run_python("print(1)", limits=FAST).ok
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
