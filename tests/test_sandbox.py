"""Hostile programs are contained by the code sandbox, and the test machine is unharmed.

Which layers apply depends on the machine (bubblewrap or the legacy fallback,
root or not); each run reports them in `SandboxResult.layers`, and the tests
run on the machine's backend and on the legacy backend explicitly.
(`test_reward_integrity` drives the same attacks through the reward entry points.)
Over 500 lines: one test per attack class of docs/sandbox.md's threat model, kept beside each other.
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
from mentor.training.sandbox import cgroups as sandbox_cgroups, launch as sandbox_launch, seccomp as sandbox_seccomp, slots as sandbox_slots
from mentor.training.code_verify import parse_code_label, run_humaneval
from mentor.training.sandbox import run_python
from mentor.training.sandbox.layers import REQUIRED_LAYERS, SandboxLimits, SandboxUnavailable
from mentor.training.sandbox.process import SandboxProcess

FAST = SandboxLimits(wall_seconds=6, cpu_seconds=3, memory_bytes=512 << 20)




def _slot_processes() -> list[str]:
    out = subprocess.run(["ps", "-e", "-o", "uid=,pid="], capture_output=True, text=True).stdout.split("\n")
    slots = range(sandbox_slots.UID_BASE, sandbox_slots.UID_BASE + sandbox_slots.SLOTS)
    return [line for line in out if line.split() and int(line.split()[0]) in slots]


def _host_cannot(layer: str) -> bool:
    """Whether this host cannot have `layer` at all, by the backend's own account (only memcg can be so)."""
    return layer == "memcg" and "memcg" in sandbox.backend().why_missing


def test_plain_program_runs_with_layers(backend_kind):
    res = run_python("import sys\nprint(sum(range(10)))\nprint(input())", stdin="hello\n", limits=FAST)
    assert res.ok and res.stdout.split() == ["45", "hello"], res.stderr
    assert {"process", "env", "rlimits", "timeout", "uid", "nproc", "seccomp"} <= set(res.layers)
    if backend_kind == "bwrap":
        assert [x for x in REQUIRED_LAYERS if x not in res.layers and not _host_cannot(x)] == []
    print("sandbox layers here:", backend_kind, res.layers)


def test_machine_backend_has_every_layer_where_bubblewrap_works():
    """On a machine with bubblewrap (CI installs it), nothing required is missing, but a memory cgroup
    where the host has none that can be delegated (the backend then says why)."""
    if sandbox.backend().name != "bwrap":
        pytest.skip(f"no working bubblewrap here (backend {sandbox.backend().name}); the verifier warns about it")
    missing = [layer for layer in REQUIRED_LAYERS if layer not in sandbox.layers_here()]
    assert [x for x in missing if not _host_cannot(x)] == [], sandbox.backend().why_missing
    print("memory cgroup:", sandbox.backend().memcg.base if sandbox.backend().memcg else sandbox.backend().why_missing["memcg"])


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
    impl = sandbox_launch.Legacy()
    seen = sandbox.probe_backend(impl)
    monkeypatch.setattr(sandbox, "_BACKEND", sandbox.Backend(impl, sandbox.verified_layers(*seen), seen[1]))
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
    if _host_cannot("memcg"):
        pytest.skip(f"no memory cgroup here: {sandbox.backend().why_missing['memcg']}")
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
    assert os.geteuid() != 0 or be.facts.get("uid") >= sandbox_slots.UID_BASE


# --------------------------------------------------------------------------- mentor setup-sandbox


def test_setup_sandbox_reports_layers(monkeypatch):
    from click.testing import CliRunner

    from mentor.workflows.cli import cli

    res = CliRunner().invoke(cli, ["setup-sandbox", "--no-install"])
    assert res.exit_code == 0, res.output
    assert f"sandbox backend: {sandbox.backend().name}" in res.output and "rlimits" in res.output
    if sandbox.backend().name == "bwrap":  # issue 48: the RAM copy of what the sandbox reads, and where
        assert "ramview" in res.output and "a copy in RAM, /" in res.output, res.output
    # Where a layer is missing, --strict is an error naming it.
    impl = sandbox_launch.Legacy()
    seen = sandbox.probe_backend(impl)
    monkeypatch.setattr(sandbox, "_BACKEND", sandbox.Backend(impl, sandbox.verified_layers(*seen), seen[1]))
    res = CliRunner().invoke(cli, ["setup-sandbox", "--no-install", "--strict"])
    assert res.exit_code == 1 and "fsview" in res.output and "missing layer ramview" in res.output


def test_setup_sandbox_install_plan(monkeypatch):
    from mentor.workflows.cli import setup as cmd_setup

    monkeypatch.setattr(cmd_setup.shutil, "which", lambda name: "/usr/bin/bwrap" if name == "bwrap" else None)
    assert cmd_setup.install_commands() == []  # already there
    monkeypatch.setattr(cmd_setup.shutil, "which", lambda name: None)
    assert cmd_setup.install_commands() is None  # no apt-get: the manual step is printed instead
    monkeypatch.setattr(cmd_setup.shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    monkeypatch.setattr(cmd_setup.os, "geteuid", lambda: 0)
    plan = cmd_setup.install_commands()
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


# --------------------------------------------------------------------------- issue 34: state, channels, memory

# The head of the probes below: a syscall by number (NR, %-formatted in) and the errno it ends with.
ERRNO_OF = r'''libc = ctypes.CDLL(None, use_errno=True)
NR = %r
def errno_of(f):
    try:
        r = f()
    except OSError as e:
        return e.errno
    return ctypes.get_errno() if isinstance(r, int) and r < 0 else 0
'''

FILTERED = r'''
import ctypes, fcntl, os, threading
''' + ERRNO_OF + r'''shared = open(os.__file__, "rb")  # a file every sandbox shares
got = {
    "add_key": errno_of(lambda: libc.syscall(NR["add_key"], b"user", b"k", b"x", 1, -4)),
    "keyctl": errno_of(lambda: libc.syscall(NR["keyctl"], 0, -4, 0)),
    "flock": errno_of(lambda: fcntl.flock(shared, fcntl.LOCK_SH | fcntl.LOCK_NB)),
    "lockf": errno_of(lambda: fcntl.lockf(shared, fcntl.LOCK_SH | fcntl.LOCK_NB)),
    "ofd_lock": errno_of(lambda: fcntl.fcntl(shared, 36, bytes(32))),
    "inotify": errno_of(lambda: libc.inotify_init1(0)),
    "memfd": errno_of(lambda: os.memfd_create("x")),
    "shmget": errno_of(lambda: libc.shmget(0, 4096, 0o1600)),
    "msgget": errno_of(lambda: libc.msgget(0, 0o1600)),
    "userns": errno_of(lambda: libc.unshare(0x10000000)),
}
pid = os.fork()
if pid == 0:
    os._exit(7)
got["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
t = threading.Thread(target=lambda: got.update(thread=1))
t.start()
t.join()
got["getfl"] = fcntl.fcntl(shared, fcntl.F_GETFL) >= 0
print(sorted(got.items()))
'''


def test_syscall_filter_denies_state_channels_and_hidden_memory(backend_kind):
    """Keyrings, file locks, inotify, memfd, SysV IPC and new user namespaces fail with EPERM; fork,
    threads and ordinary fcntl still work."""
    # audit=False: the legacy tripwire would refuse ctypes first; the kernel's filter is what is tested.
    res = run_python(FILTERED % (sandbox_seccomp.syscall_numbers(),), limits=SandboxLimits(wall_seconds=10, processes=4, audit=False))
    assert res.ok, res.stderr
    got = dict(eval(res.stdout))
    assert "seccomp" in res.layers
    assert {k: v for k, v in got.items() if k not in ("fork", "thread", "getfl")} == dict.fromkeys(
        ["add_key", "keyctl", "flock", "lockf", "ofd_lock", "inotify", "memfd", "shmget", "msgget", "userns"], 1)
    assert (got["fork"], got["thread"], got["getfl"]) == (7, 1, True)


def test_cross_uid_proc_views_are_empty(backend_kind):
    """/proc/key-users (every uid's key quota), /proc/keys and /proc/locks are gone (a /proc of the
    sandbox's own processes only) or read as empty files (where /proc cannot be mounted so)."""
    code = ("import os\nfor p in ('/proc/key-users', '/proc/keys', '/proc/locks'):\n"
            "    print(p, repr(open(p).read()) if os.path.exists(p) else 'absent')\n")
    res = run_python(code, limits=SandboxLimits(wall_seconds=6, audit=False))
    assert res.ok, res.stderr
    assert all(line.split(" ", 1)[1] in ("''", "absent") for line in res.stdout.splitlines()[:3]), res.stdout
    assert "procns" in res.layers


def _flood(n: int) -> str:
    return f"n = 0\ntry:\n    while n < {n}:\n        open(f'f{{n}}', 'w').close()\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)\n"


def test_without_a_memory_cgroup_tmp_is_capped_in_inodes(monkeypatch):
    """bwrap as root, no memory cgroup: /tmp is mounted with nr_inodes, so empty files stop at the limit."""
    monkeypatch.setattr(sandbox, "_BACKEND", None)
    monkeypatch.setenv("MENTOR_SANDBOX_CGROUP", "off")
    if sandbox.backend().name != "bwrap" or os.geteuid() != 0:
        pytest.skip("the inode cap needs bwrap as root (mount(8) inside the sandbox)")
    res = run_python(_flood(100000), limits=SandboxLimits(wall_seconds=20, tmp_inodes=500))
    n, errno_ = map(int, res.stdout.split())
    assert n < 500 and errno_ == 28, res.stdout  # ENOSPC
    assert "tmpcap" in res.layers and "memcg" not in res.layers


def test_in_a_memory_cgroup_inodes_are_charged_to_the_sandbox():
    """With a memory cgroup, an inode flood counts against the sandbox's memory: 300,000 empty files
    (about 300 MB of kernel memory) do not fit in a 96 MiB cgroup."""
    if "memcg" not in sandbox.layers_here():
        pytest.skip(f"no memory cgroup here: {sandbox.backend().why_missing.get('memcg')}")
    res = run_python(_flood(300000) + "else:\n    print('held')\n", limits=SandboxLimits(wall_seconds=30, cgroup_bytes=96 << 20))
    assert "held" not in res.stdout, (res.stdout, res.stderr[-300:])
    n = int(res.stdout.split()[0]) if res.stdout.strip() else 0
    assert n < 150000, res.stdout


def test_memory_cgroup_bounds_the_sandbox_as_a_whole():
    """Three processes of 200 MiB each, each under its own 512 MiB address-space limit, exceed the
    sandbox's cgroup of 320 MiB: the sandbox is killed. With a larger cgroup the same program runs."""
    if "memcg" not in sandbox.layers_here():
        pytest.skip(f"no memory cgroup here: {sandbox.backend().why_missing.get('memcg')}")
    code = (
        "import os, time\nkids = []\n"
        "for _ in range(3):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        a = bytearray(200 << 20)\n"
        "        for i in range(0, len(a), 4096):\n"
        "            a[i] = 1\n"
        "        time.sleep(1)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "print('held' if all(os.waitpid(p, 0)[1] == 0 for p in kids) else 'killed')\n"
    )
    small = SandboxLimits(wall_seconds=20, memory_bytes=512 << 20, cgroup_bytes=320 << 20)
    res = run_python(code, limits=small)
    assert "held" not in res.stdout, res.stdout
    assert "memcg" in res.layers
    res = run_python(code, limits=SandboxLimits(wall_seconds=20, memory_bytes=512 << 20, cgroup_bytes=900 << 20))
    assert res.stdout.strip() == "held", (res.stdout, res.stderr[-300:])


def test_memfd_and_tmpfs_past_the_limit_fail(backend_kind):
    """memfd pages and a tmpfs of its own user namespace were outside every limit; both fail now."""
    # 20 memfds of 15 MiB (each under the file-size limit): 300 MiB beside a 256 MiB address space.
    memfd = "import os\nfds = [os.memfd_create('x') for _ in range(20)]\nfor fd in fds:\n    os.write(fd, b'x' * (15 << 20))\nprint('held')\n"
    tmpfs = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nuid, gid = os.getuid(), os.getgid()\n"
        "assert libc.unshare(0x10000000 | 0x00020000) == 0, 'unshare: errno %d' % ctypes.get_errno()\n"
        "open('/proc/self/setgroups', 'w').write('deny')\n"
        "open('/proc/self/uid_map', 'w').write(f'0 {uid} 1')\n"
        "open('/proc/self/gid_map', 'w').write(f'0 {gid} 1')\n"
        "assert libc.mount(b'none', b'/tmp', b'tmpfs', 0, b'size=1g') == 0\n"
        "for n in range(4):\n    open(f'/tmp/big{n}', 'wb').write(b'x' * (12 << 20))\nprint('held')\n"
    )
    limits = SandboxLimits(wall_seconds=10, memory_bytes=256 << 20, tmp_bytes=8 << 20, audit=False)
    for code, why in ((memfd, "Operation not permitted"), (tmpfs, "errno 1")):
        res = run_python(code, limits=limits)
        assert not res.ok and "held" not in res.stdout and why in res.stderr, res.stderr[-300:]


def test_without_a_memory_cgroup_it_warns_once_and_strict_refuses(monkeypatch, caplog):
    """MENTOR_SANDBOX_CGROUP=off stands for a host without delegation: the layer is named as missing,
    with the reason, once; strict mode refuses to run."""
    monkeypatch.setattr(sandbox, "_BACKEND", None)
    monkeypatch.setattr(sandbox, "_WARNED", set())
    monkeypatch.setenv("MENTOR_SANDBOX_CGROUP", "off")
    monkeypatch.delenv("MENTOR_SANDBOX_STRICT", raising=False)
    with caplog.at_level(logging.WARNING, logger="mentor.training.sandbox"):
        for _ in range(2):
            assert run_python("print('hi')", limits=FAST).ok
    text = [r.getMessage() for r in caplog.records if "'memcg' is not in force" in r.getMessage()]
    assert len(text) == 1 and "MENTOR_SANDBOX_CGROUP=off" in text[0], text
    assert "memcg" not in sandbox.layers_here() and "memcg" in sandbox.backend().why_missing
    monkeypatch.setenv("MENTOR_SANDBOX_STRICT", "1")
    with pytest.raises(SandboxUnavailable, match="memcg"):
        run_python("print('hi')", limits=FAST)


def test_memory_cgroup_discovery_names_what_it_found():
    """Where a cgroup is found, it is a v1 or v2 memory cgroup directory this process can write."""
    memcg, why = sandbox_cgroups.MemCgroups.discover()
    if memcg is None:
        assert why, "a missing memory cgroup always comes with its reason"
        pytest.skip(why)
    assert memcg.version in ("v1", "v2") and os.path.isdir(memcg.base)
    procs = memcg.enter("run-test-discovery", 256 << 20)
    limit_file = "memory.limit_in_bytes" if memcg.version == "v1" else "memory.max"
    assert open(os.path.join(os.path.dirname(procs), limit_file)).read().strip() == str(256 << 20)
    memcg.leave("run-test-discovery")
    assert not os.path.exists(os.path.dirname(procs))


# --------------------------------------------------------------------------- no answer oracle


def test_wrong_answers_still_get_every_call():
    """The tests record a failed assert and go on: the candidate sees all calls whatever it answers."""
    tests = "def check(candidate):\n" + "".join(f"    assert candidate({i}) == {i}\n" for i in range(5))
    out = run_humaneval("def f(x):\n    return -1\n", _label(tests), SandboxLimits(wall_seconds=10))
    assert out.score == 0.0 and "after 5 calls" in out.detail and "5 failure(s)" in out.detail, out.detail
    out = run_humaneval("def f(x):\n    return x\n", _label(tests), SandboxLimits(wall_seconds=10))
    assert out.score == 1.0, out.detail


@pytest.mark.parametrize(("code", "score"), [("def f(x):\n    return abs(x)\n", 1.0), ("def f(x):\n    return x\n", 0.0)])
def test_tests_that_catch_their_own_failures_keep_their_meaning(code, score):
    """An assert inside a try of the tests still raises into that try (here the tests expect it to fail)."""
    tests = (
        "def check(candidate):\n"
        "    try:\n"
        "        assert candidate(-1) == -1\n"
        "        negative_kept = True\n"
        "    except AssertionError:\n"
        "        negative_kept = False\n"
        "    assert negative_kept is False\n"
        "    for i in range(3):\n"
        "        assert candidate(i) == i\n"
    )
    out = run_humaneval(code, _label(tests), SandboxLimits(wall_seconds=10))
    assert out.score == score, out.detail


def test_stdio_runs_every_case_after_a_wrong_output():
    """A wrong output does not stop the cases (the next case's run would say it was wrong); a crash does."""
    from mentor.training.code_verify import run_stdio

    cases = [{"input": f"{i}\n", "output": f"{i * 2}"} for i in range(4)]
    label = parse_code_label({"tests": json.dumps(cases), "entry_point": None, "kind": "stdio"})
    out = run_stdio("x = int(input())\nprint(x * 2 if x else 99)\n", label, SandboxLimits(wall_seconds=10))
    assert (out.passed, out.total, out.score) == (3, 4, 0.0) and out.detail == "case 0: wrong output"
    out = run_stdio("x = int(input())\nassert x < 2\nprint(x * 2)\n", label, SandboxLimits(wall_seconds=10))
    assert (out.passed, out.score) == (2, 0.0) and out.detail.startswith("case 2: AssertionError")



# --------------------------------------------------------------------------- issue 48: page cache, counters, kernel memory

PAGE_CACHE_CALLS = r"""
import ctypes, fcntl, mmap, os, socket
""" + ERRNO_OF + r"""fd = os.open(os.__file__, os.O_RDONLY)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
r, w = os.pipe()
page = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(bytearray(8192))) // 4096 * 4096)
got = {
    "fadvise": errno_of(lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)),
    "readahead": errno_of(lambda: libc.syscall(NR["readahead"], fd, 0, 4096)),
    "mincore": errno_of(lambda: libc.mincore(page, 4096, ctypes.create_string_buffer(1))),
    "cachestat": errno_of(lambda: libc.syscall(NR["cachestat"], fd, None, None, 0)),
    "rwf_nowait": errno_of(lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)),
    "madv_pageout": errno_of(lambda: m.madvise(21)),
    "madv_cold": errno_of(lambda: m.madvise(20)),
    "madv_willneed": errno_of(lambda: m.madvise(mmap.MADV_WILLNEED)),
    "io_setup": errno_of(lambda: libc.syscall(NR["io_setup"], 8, ctypes.byref(ctypes.c_ulong(0)))),
    "sndbuf": errno_of(lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)),
    "rcvbuf": errno_of(lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)),
    "pipe_size": errno_of(lambda: fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)),
    "pidfd_open": errno_of(lambda: os.pidfd_open(os.getpid())),
    "so_cookie": errno_of(lambda: s.getsockopt(socket.SOL_SOCKET, 57, 8)),
}
ordinary = {
    "preadv2": os.preadv(fd, [bytearray(1)], 0, 0),
    "madv_dontneed": m.madvise(mmap.MADV_DONTNEED),
    "reuseaddr": s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1),
    "so_type": s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE),
    "pipe_size": fcntl.fcntl(w, fcntl.F_GETPIPE_SZ),
}
print(sorted(got.items()))
print(sorted(ordinary.items()))
"""


def test_syscall_filter_denies_the_page_cache_big_buffers_and_host_counters(backend_kind):
    """What reads or steers the page cache of shared files, grows socket or pipe buffers, or reads a
    host-wide counter (pidfds, socket cookies) fails with EPERM; the ordinary forms still work."""
    res = run_python(PAGE_CACHE_CALLS % (sandbox_seccomp.syscall_numbers(),), limits=SandboxLimits(wall_seconds=10, audit=False))
    assert res.ok, res.stderr
    denied, ordinary = (dict(eval(line)) for line in res.stdout.splitlines())
    assert denied == dict.fromkeys(denied, 1) and len(denied) == 14, denied
    assert ordinary == {"preadv2": 1, "madv_dontneed": None, "reuseaddr": None, "so_type": 1, "pipe_size": 65536}, ordinary


def test_host_wide_counters_in_proc_are_masked(backend_kind):
    """The host's cumulative counters are gone or read as empty; the CPU count still comes out right."""
    code = (
        "import os\n"
        "for p in ('/proc/stat', '/proc/vmstat', '/proc/zoneinfo', '/proc/interrupts', '/proc/softirqs',\n"
        "          '/proc/diskstats', '/proc/schedstat', '/proc/uptime', '/proc/pressure'):\n"
        "    if os.path.isdir(p):\n"
        "        print(p, os.listdir(p))\n"
        "    else:\n"
        "        print(p, repr(open(p).read()) if os.path.exists(p) else 'absent')\n"
        "print('cpus', os.cpu_count())\n"
    )
    res = run_python(code, limits=SandboxLimits(wall_seconds=6, audit=False))
    assert res.ok, res.stderr
    lines = res.stdout.splitlines()
    assert lines[-1] in (f"cpus {len(os.sched_getaffinity(0))}", f"cpus {os.cpu_count()}"), lines
    assert len(lines) == 10 and all(line.split(" ", 1)[1] in ("''", "[]", "absent") for line in lines[:-1]), lines
    assert "procns" in res.layers


READ_EVERYTHING = r"""
import os, time
slow, n, mounts = [], 0, []
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if os.path.isdir(f[4]):
        mounts.append((f[4], line.partition(" - ")[2].split()[0]))
for dp, dn, fn in os.walk("/"):
    if dp.startswith(("/proc", "/dev")):
        dn[:] = []
        continue
    for f in fn:
        try:
            fd = os.open(os.path.join(dp, f), os.O_RDONLY)
        except OSError:
            continue
        for off in range(0, min(os.fstat(fd).st_size, 1 << 20), 64 << 10):
            os.pread(fd, 1, off)
            n += 1
        os.close(fd)
io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
print(n, int(io["read_bytes"]), open("/proc/self/stat").read().rsplit(")", 1)[1].split()[9], sorted(mounts))
"""


def test_what_the_sandbox_reads_is_a_copy_in_ram():
    """bwrap: every directory a sandbox can read is on tmpfs (or is /proc, /dev/pts): reading every file
    causes no disk read (read_bytes 0, no major fault), so no page of a disk's cache is ever read or
    set; the standard library's native modules still load."""
    if "ramview" not in sandbox.layers_here():
        pytest.skip(f"no RAM copy here: {sandbox.backend().why_missing.get('ramview')}")
    res = run_python(READ_EVERYTHING, limits=SandboxLimits(wall_seconds=30, cpu_seconds=30))
    assert res.ok, res.stderr[-500:]
    n, read_bytes, majflt, mounts = res.stdout.split(" ", 3)
    assert int(n) > 1000 and read_bytes == "0" and majflt == "0", res.stdout[:300]
    assert all(fstype in ("tmpfs", "proc", "devpts") for _, fstype in eval(mounts)), mounts
    imports = "import ssl, sqlite3, ctypes, decimal, lzma, bz2, zlib, hashlib, zoneinfo, readline\nprint(zoneinfo.ZoneInfo('UTC'))\n"
    assert run_python(imports, limits=FAST).stdout.strip() == "UTC"


def test_tmp_is_capped_in_inodes_in_every_cgroup_mode(backend_kind):
    """The writable directory holds at most `tmp_inodes` files, with this host's memory cgroup (if any)
    as without one: inodes are kernel memory a cgroup v1 limit lets grow to a gigabyte."""
    if backend_kind == "bwrap" and os.geteuid() != 0:
        pytest.skip("the inode cap needs bwrap as root (mount(8) inside the sandbox)")
    res = run_python(_flood(100000), limits=SandboxLimits(wall_seconds=20, tmp_inodes=500, audit=False))
    n, errno_ = map(int, res.stdout.split())
    assert n < 500 and errno_ == 28, res.stdout  # ENOSPC
    assert "tmpcap" in res.layers


# --------------------------------------------------------------------------- issue 48: no oracle within an expression

SHORT_CIRCUIT_TESTS = {
    "all": "def check(candidate):\n    assert all(candidate(i) == i for i in range(5))\n",
    "any": "def check(candidate):\n    assert not any(candidate(i) != i for i in range(5))\n",
    "and": "def check(candidate):\n    assert " + " and ".join(f"candidate({i}) == {i}" for i in range(5)) + "\n",
    "or": "def check(candidate):\n    assert not (" + " or ".join(f"candidate({i}) != {i}" for i in range(5)) + ")\n",
    "chain": "def check(candidate):\n    assert 0 == candidate(0) == candidate(0) == candidate(0) == candidate(0)\n",
    "conditional": "def check(candidate):\n    ok = candidate(0) == 0\n    assert (candidate(1) == 1) if ok else (candidate(2) == 2 and candidate(3) == 3)\n",
    "helper": "def _same(c, xs):\n    return all(c(x) == x for x in xs)\ndef check(candidate):\n    assert _same(candidate, range(5))\n",
}
CALLS = {"all": 5, "any": 5, "and": 5, "or": 5, "chain": 4, "conditional": 4, "helper": 5}


@pytest.mark.parametrize("style", sorted(SHORT_CIRCUIT_TESTS))
def test_short_circuiting_tests_make_every_call(style):
    """and/or/all/any/chained comparisons/conditional expressions in the tests evaluate every operand: a
    candidate wrong from its first answer gets as many calls as a right one, and the verdicts stay."""
    label = _label(SHORT_CIRCUIT_TESTS[style])
    wrong = run_humaneval("def f(x):\n    return -1\n", label, SandboxLimits(wall_seconds=10))
    assert wrong.score == 0.0 and f"after {CALLS[style]} calls" in wrong.detail, wrong.detail
    assert run_humaneval("def f(x):\n    return x\n", label, SandboxLimits(wall_seconds=10)).score == 1.0


def test_full_evaluation_gives_python_s_results():
    """On 20,000 random expressions of and/or/all/any/chained comparisons/conditionals over values, calls
    and a call that raises, the rewritten tests give exactly what Python gives (value or exception)."""
    import _ast
    import builtins
    import random
    import warnings

    from mentor.training.sandbox import harness_tester as h

    rng = random.Random(48)

    def expr(depth: int) -> str:
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(["0", "1", "2", "''", "'a'", "[]", "None", "f(0)", "f(1)", "f(3)", "g()"])
        kind = rng.randrange(5)
        if kind == 0:
            return "(" + " and ".join(expr(depth - 1) for _ in range(rng.randint(2, 4))) + ")"
        if kind == 1:
            return "(" + " or ".join(expr(depth - 1) for _ in range(rng.randint(2, 4))) + ")"
        if kind == 2:
            return f"({expr(depth - 1)} if {expr(depth - 1)} else {expr(depth - 1)})"
        if kind == 3:
            return f"({expr(depth - 1)} {rng.choice(['<', '==', '!=', 'is'])} {expr(depth - 1)} {rng.choice(['<=', '=='])} {expr(depth - 1)})"
        return rng.choice(["all", "any"]) + "([" + ", ".join(expr(depth - 1) for _ in range(rng.randint(0, 3))) + "])"

    def run(src: str, rewrite: bool):
        def g():
            raise ValueError("g")

        env = {"__builtins__": builtins, "f": lambda x: x, "g": g, **{n: getattr(h, n) for n in h.FULL_HELPERS.values()}}
        tree = compile("r = " + src, "t", "exec", _ast.PyCF_ONLY_AST)
        try:
            exec(compile(h.evaluate_fully(_ast, tree) if rewrite else tree, "t", "exec"), env)
            return repr(env["r"])
        except (TypeError, ValueError) as exc:
            return type(exc).__name__

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        for _ in range(20000):
            src = expr(3)
            assert run(src, True) == run(src, False), src


def test_harness_source_files_share_one_namespace_without_a_clash():
    """The harness is several files pasted into one program (`launch.harness_files`): no top-level name
    is defined by two of them (the later would silently replace the earlier), and the program compiles."""
    import ast
    from collections import defaultdict

    for legacy in (False, True):
        owners = defaultdict(list)
        for path in sandbox_launch.harness_files(legacy):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    owners[node.name].append(path.name)
                elif isinstance(node, ast.Assign):
                    owners.update({t.id: owners[t.id] + [path.name] for t in node.targets if isinstance(t, ast.Name)})
        assert {name: files for name, files in owners.items() if len(files) > 1} == {}
        compile(sandbox_launch.harness_source(legacy), "harness", "exec")
