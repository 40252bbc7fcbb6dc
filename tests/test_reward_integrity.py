"""Reward integrity: exploits a policy finds score 0, through every public reward entry point.

Each exploit runs through the three paths a trainer uses: OpenRLHF's
`reward_func` (the reward file loaded by path, as OpenRLHF loads it), verl's
`compute_score` (loaded by path too) and `verify` (what `mentor rollout` and
`rescue` call). Every test also checks that nothing happened outside: a canary
file and a victim file of the caller intact, no connection to a listener of
the caller, no process left behind.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pytest

from mentor.data import bundled
from mentor.pipeline.schemas import code_label, prompt_label
from mentor.training import sandbox
from mentor.training.launcher import REWARD_FILE
from mentor.training.verify import verify

TIMEOUT = 3.0
SLOT_UIDS = range(sandbox.UID_BASE, sandbox.UID_BASE + sandbox.SLOTS)  # MENTOR_CODE_TIMEOUT for these tests: the wall-clock budget of one test file


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def entry_points():
    """The three reward paths, loaded the way the trainers load them."""
    openrlhf = _load(REWARD_FILE, "mentor_openrlhf_reward_by_path")
    verl = _load(REWARD_FILE.with_name("verl_reward.py"), "mentor_verl_reward_by_path")
    return openrlhf.reward_func, verl.compute_score


@pytest.fixture(scope="module")
def tasks() -> dict[str, dict]:
    df = pl.read_parquet(bundled("humaneval_problems.parquet"))
    return {r["problem_id"]: r for r in df.iter_rows(named=True)}


@pytest.fixture(scope="module")
def raw_humaneval(shared_data) -> dict[str, dict]:
    with gzip.open(shared_data / "humaneval" / "HumanEval.jsonl.gz", "rt") as fh:
        return {t["task_id"]: t for t in map(json.loads, fh)}


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("MENTOR_CODE_TIMEOUT", str(TIMEOUT))
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path / "rollouts"))
    monkeypatch.setenv("MENTOR_TEST_SECRET", "hunter2-secret-value")


@pytest.fixture(params=["default", "legacy"])
def backend_kind(request, monkeypatch):
    """The machine's backend (bubblewrap where it works), and the legacy fallback explicitly."""
    if request.param == "legacy":
        impl = sandbox._Legacy()
        seen = sandbox._probe(impl)
        assert seen is not None, "the legacy backend does not start here"
        monkeypatch.setattr(sandbox, "_BACKEND", sandbox.Backend(impl, sandbox._verified(*seen), seen[1]))
    return sandbox.backend().name


class Caller:
    """What a sandbox must not touch: files, a TCP listener, an abstract unix socket, processes."""

    def __init__(self, root: Path) -> None:
        # Outside /tmp as well: a sandbox gets a /tmp of its own, which would hide a canary there.
        self.home = Path.home() / ".cache" / f"mentor-test-canary-{os.getpid()}-{time.monotonic_ns()}"
        self.home.mkdir(parents=True)
        self.canary = self.home / "canary.txt"
        self.canary.write_text("alive")
        self.victim = root / "keep" / "data.txt"
        self.victim.parent.mkdir()
        self.victim.write_text("precious")
        self.marker = f"mentor-leftover-{os.getpid()}-{time.monotonic_ns()}"
        self.hits = 0
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix_name = "\0" + self.marker
        self.unix.bind(self.unix_name)
        self.unix.listen()
        for s in (self.tcp, self.unix):
            s.settimeout(0.2)
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s: socket.socket) -> None:
        while s.fileno() != -1:
            try:
                conn, _ = s.accept()
                self.hits += 1
                conn.close()
            except OSError:
                continue

    def payload(self) -> str:
        """Module-level code trying every side effect; each attempt's failure is swallowed."""
        return f'''
def _try(f):
    try:
        f()
    except BaseException:
        pass
_try(lambda: open({str(self.canary)!r}, "w").write("pwned"))
_try(lambda: __import__("os").remove({str(self.victim)!r}))
_try(lambda: __import__("shutil").rmtree({str(self.victim.parent)!r}))
_try(lambda: open("/tmp/{self.marker}", "w").write("x"))
_try(lambda: __import__("socket").create_connection(("127.0.0.1", {self.port}), timeout=0.5))
_try(lambda: __import__("socket").socket(1, 1).connect({self.unix_name!r}))
_try(lambda: __import__("subprocess").Popen(["/usr/bin/python3", "-c", "import time; time.sleep(30)", {self.marker!r}],
                                            start_new_session=True))
del _try
'''

    def leftovers(self) -> list[str]:
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if self.marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
                    continue
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("Uid:") and int(line.split()[1]) in SLOT_UIDS:
                        found.append(pid)
            except (OSError, ValueError):
                continue
        return found

    def assert_untouched(self) -> None:
        time.sleep(0.3)
        assert self.canary.read_text() == "alive"
        assert self.victim.read_text() == "precious"
        assert not Path(f"/tmp/{self.marker}").exists()
        assert self.hits == 0, "a sandbox reached a socket of the caller"
        assert self.leftovers() == [], "processes left behind"

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.home, ignore_errors=True)
        self.tcp.close()
        self.unix.close()


@pytest.fixture
def caller(tmp_path):
    c = Caller(tmp_path)
    yield c
    c.close()


def score_all(entry_points, code: str, label: str, problem_id: str = "he/test") -> list[float]:
    """[OpenRLHF reward_func, verl compute_score, verify] for one response, run concurrently."""
    reward_func, compute_score = entry_points
    response = f"Here is my solution.\n```python\n{code}\n```"
    prompt = "<|im_start|>user\nSolve it.<|im_end|>\n<|im_start|>assistant\n"
    plabel = prompt_label("code", label, problem_id, None, 0)
    calls = [
        lambda: float(reward_func([prompt + response + "<|im_end|>"], [prompt], [plabel])["rewards"][0]),
        lambda: float(compute_score("openai/humaneval", response, label, {"problem_id": problem_id})),
        lambda: float(verify("code", response, label)),
    ]
    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(lambda f: f(), calls))


def _bounded(t0: float, slack: float = 6.0) -> None:
    assert time.monotonic() - t0 < TIMEOUT + slack, "a run outlived its wall-clock budget"


# --------------------------------------------------------------------------- HumanEval/0 exploits

WRONG = "def has_close_elements(numbers, threshold):\n    return False\n"
SLOW_WRONG = "import time\ndef has_close_elements(numbers, threshold):\n    time.sleep(5)\n    return False\n"

EXPLOITS = {
    "sys_exit": WRONG + "import sys\nsys.exit(0)\n",
    "raise_systemexit": WRONG + "raise SystemExit\n",
    "os_exit": WRONG + "import os\nos._exit(0)\n",
    "exit_in_call": "import sys\ndef has_close_elements(numbers, threshold):\n    sys.exit(0)\n",
    "os_exit_in_call": "import os\ndef has_close_elements(numbers, threshold):\n    os._exit(0)\n",
    "atexit_exit_0": WRONG + "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "excepthook_exit_0": WRONG + "import sys, os\nsys.excepthook = lambda *a: os._exit(0)\n",
    "signal_timer_exit_0": SLOW_WRONG + "import signal, os\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
    "signal.setitimer(signal.ITIMER_REAL, 0.2)\n",
    "thread_exits_early": SLOW_WRONG + "import threading, os, time\n"
    "threading.Thread(target=lambda: (time.sleep(0.2), os._exit(0)), daemon=True).start()\n",
    "settrace_exit_on_assert": WRONG + "import sys, os\n"
    "def _tr(frame, event, arg):\n"
    "    if event == 'exception' and issubclass(arg[0], AssertionError):\n"
    "        os._exit(0)\n"
    "    return _tr\n"
    "sys.settrace(_tr)\n",
    "settrace_exit_on_check": WRONG + "import sys, os\n"
    "sys.settrace(lambda frame, event, arg: os._exit(0) if event == 'call' and frame.f_code.co_name == 'check' else None)\n",
    "setprofile_exit_on_check": WRONG + "import sys, os\n"
    "sys.setprofile(lambda frame, event, arg: os._exit(0) if event == 'call' and frame.f_code.co_name == 'check' else None)\n",
    "always_equal_object": "class _Eq:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
    "def has_close_elements(numbers, threshold):\n    return _Eq()\n",
    "always_equal_int_subclass": "class _Eq(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
    "def has_close_elements(numbers, threshold):\n    return _Eq(0)\n",
    "always_equal_str_subclass": "class _Eq(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
    "def has_close_elements(numbers, threshold):\n    return _Eq('x')\n",
    # Reads the tests out of its own file, the files beside it, or datasets on disk, and answers from them.
    "reads_the_tests": r'''
import os, re, ast, gzip
def _texts():
    names = [globals().get("__file__")] + [os.path.join(".", f) for f in os.listdir(".")]
    for p in names:
        try:
            yield open(p).read()
        except Exception:
            pass
    seen = 0
    for root in ("/work", "/home", "/root", "/data", "/mnt", "/tmp", "/sandbox"):
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in (".venv", ".git", "site-packages", "node_modules", ".cache")]
            for f in files:
                seen += 1
                if seen > 20000:
                    return
                if f.endswith((".jsonl", ".jsonl.gz", ".json", ".py")):
                    p = os.path.join(dirpath, f)
                    try:
                        data = gzip.open(p, "rt").read() if f.endswith(".gz") else open(p).read()
                    except Exception:
                        continue
                    if "has_close_elements" in data:
                        yield data.replace("\\n", "\n")
TABLE = {}
for _text in _texts():
    for _m in re.finditer(r"assert candidate\((.*?)\) == (True|False)", _text):
        try:
            TABLE[repr(ast.literal_eval("(" + _m.group(1) + ",)"))] = _m.group(2) == "True"
        except Exception:
            pass
def has_close_elements(numbers, threshold):
    return TABLE.get(repr((numbers, threshold)), False)
''',
    # Writes what a pass might look like to every descriptor, then returns wrong answers.
    "forged_pass_messages": WRONG + "import os\n"
    "for _fd in range(0, 64):\n"
    "    for _m in (b'{\"done\": \"pass\", \"nonce\": \"\"}\\n', b'{\"ok\": true}\\n', b'PASSED\\n'):\n"
    "        try:\n"
    "            os.write(_fd, _m)\n"
    "        except OSError:\n"
    "            pass\n"
    "print('{\"done\": \"pass\"}')\n",
}


@pytest.mark.parametrize("name", sorted(EXPLOITS))
def test_exploit_scores_zero_everywhere(name, entry_points, tasks, caller):
    if name == "reads_the_tests" and "fsview" not in sandbox.layers_here():
        pytest.skip("no fsview layer here (legacy backend): the code can read world-readable datasets; install bubblewrap")
    label = tasks["humaneval/0"]["label"]
    t0 = time.monotonic()
    scores = score_all(entry_points, caller.payload() + EXPLOITS[name], label)
    _bounded(t0)
    assert scores == [0.0, 0.0, 0.0], (name, scores)
    caller.assert_untouched()


def test_redefined_prompt_helper_does_not_pass(entry_points, tasks, caller):
    """HumanEval/32 checks find_zero's answer with the prompt's `poly`: a candidate's own `poly` is not used."""
    code = "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n"
    assert score_all(entry_points, caller.payload() + code, tasks["humaneval/32"]["label"]) == [0.0, 0.0, 0.0]
    caller.assert_untouched()


def test_genuine_solutions_still_score_one(entry_points, tasks, raw_humaneval, caller):
    """Correct code scores 1 on every path, prints and __main__ blocks included."""
    task = tasks["humaneval/32"]
    code = task["problem"] + raw_humaneval["HumanEval/32"]["canonical_solution"] + "\nprint('debug output')\nif __name__ == '__main__':\n    print(find_zero([1, 2]))\n"
    assert score_all(entry_points, code, task["label"]) == [1.0, 1.0, 1.0]
    caller.assert_untouched()


# --------------------------------------------------------------------------- all 164 canonical solutions


def test_all_humaneval_canonical_solutions_pass_and_wrong_ones_fail(raw_humaneval, tasks):
    """Every canonical solution scores 1 (through verify, 8 threads); the same tasks with a wrong body score 0."""
    assert len(raw_humaneval) == 164

    def one(t: dict) -> tuple[str, float, float]:
        label = tasks[t["task_id"].lower()]["label"]
        good = verify("code", f"```python\n{t['prompt']}{t['canonical_solution']}```", label)
        bad = verify("code", f"```python\n{t['prompt']}    return None\n```", label)
        return t["task_id"], good, bad

    with ThreadPoolExecutor(8) as pool:
        res = list(pool.map(one, raw_humaneval.values()))
    assert [tid for tid, good, _ in res if good != 1.0] == []
    assert [tid for tid, _, bad in res if bad != 0.0] == []


def test_candidate_cannot_kill_the_caller(entry_points, tasks, caller):
    """A process of the caller (here a sleeping child of the test) survives a candidate that signals it."""
    import subprocess

    sentinel = subprocess.Popen(["sleep", "60"])
    try:
        code = WRONG + f"import os, signal\nfor _s in (signal.SIGKILL, signal.SIGTERM):\n    try:\n        os.kill({sentinel.pid}, _s)\n    except OSError:\n        pass\n"
        assert score_all(entry_points, caller.payload() + code, tasks["humaneval/0"]["label"]) == [0.0, 0.0, 0.0]
        time.sleep(0.2)
        assert sentinel.poll() is None, "the caller's process was killed"
        caller.assert_untouched()
    finally:
        sentinel.kill()
        sentinel.wait()


def test_forged_stop_iteration_cannot_end_a_test_loop(entry_points, caller):
    """A test that iterates over the candidate's results is not cut short by a StopIteration it raises."""
    tests = "def check(candidate):\n    for got in map(candidate, [1, 2, 3]):\n        assert got == 0\n"
    label = code_label(tests, "f", "humaneval", setup="def f(x):\n    pass\n")
    assert score_all(entry_points, "def f(x):\n    raise StopIteration\n", label) == [0.0, 0.0, 0.0]
    assert score_all(entry_points, "def f(x):\n    return 0\n", label) == [1.0, 1.0, 1.0]
    caller.assert_untouched()


# --------------------------------------------------------------------------- stdin/stdout


def _stdio(*cases: tuple[str, str]) -> str:
    return code_label(json.dumps([{"input": i, "output": o} for i, o in cases]), None, "stdio")


SUM = _stdio(("2 3\n", "5\n"), ("10 -4\n", "6"))


def test_stdio_correct_and_wrong(entry_points, caller):
    good = "a, b = map(int, input().split())\nprint(a + b)\n"
    assert score_all(entry_points, caller.payload() + good, SUM) == [1.0, 1.0, 1.0]
    assert score_all(entry_points, "a, b = map(int, input().split())\nprint(a * b)\n", SUM) == [0.0, 0.0, 0.0]
    caller.assert_untouched()


@pytest.mark.parametrize("tail", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "raise SystemExit\n"])
def test_stdio_exit_zero_without_the_answer(entry_points, caller, tail):
    assert score_all(entry_points, caller.payload() + tail, SUM) == [0.0, 0.0, 0.0]
    caller.assert_untouched()


# --------------------------------------------------------------------------- escapes: each would make the output right


def test_root_only_files_unreadable(entry_points, caller, backend_kind):
    shadow = Path("/etc/shadow")
    if os.geteuid() != 0 or not shadow.exists():
        pytest.skip("needs root and /etc/shadow to know the file's content")
    first = shadow.read_text().splitlines()[0]
    label = _stdio(("", first))
    assert score_all(entry_points, "print(open('/etc/shadow').readline().strip())\n", label) == [0.0, 0.0, 0.0]
    caller.assert_untouched()


def test_code_never_runs_as_root(entry_points, caller, backend_kind):
    label = _stdio(("", "0 0 0"))
    code = "import os\nprint(os.getuid(), os.geteuid(), os.getresuid()[2])\n"
    assert score_all(entry_points, code, label) == [0.0, 0.0, 0.0]


def test_network_unreachable(entry_points, caller, backend_kind):
    label = _stdio(("", "connected"))
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {caller.port}), timeout=1)\nprint('connected')\n"
    assert score_all(entry_points, code, label) == [0.0, 0.0, 0.0]
    code = f"import socket\nsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect({caller.unix_name!r})\nprint('connected')\n"
    assert score_all(entry_points, code, label) == [0.0, 0.0, 0.0]
    caller.assert_untouched()


def test_caller_environment_and_processes_invisible(entry_points, caller, backend_kind):
    label = _stdio(("", "hunter2-secret-value"))
    code = (
        "import os\n"
        "found = [os.environ.get('MENTOR_TEST_SECRET', '')]\n"
        "for p in os.listdir('/proc'):\n"
        "    for f in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            found += [v.split('=', 1)[-1] for v in open(f'/proc/{p}/{f}', 'rb').read().decode('latin1').split('\\0')]\n"
        "        except Exception:\n"
        "            pass\n"
        "print(next((v for v in found if v.startswith('hunter2')), 'nothing'))\n"
    )
    assert score_all(entry_points, code, label) == [0.0, 0.0, 0.0]


def test_writes_and_deletes_outside_fail(entry_points, caller, backend_kind):
    label = _stdio(("", "pwned"))
    code = f"open({str(caller.canary)!r}, 'w').write('pwned')\nprint(open({str(caller.canary)!r}).read())\n"
    assert score_all(entry_points, code, label) == [0.0, 0.0, 0.0]
    label = _stdio(("", "deleted"))
    code = f"import shutil\nshutil.rmtree({str(caller.victim.parent)!r})\nprint('deleted')\n"
    assert score_all(entry_points, code, label) == [0.0, 0.0, 0.0]
    caller.assert_untouched()


SWITCH_OFF = (
    # What switched the old audit hook off: its state lived in __main__'s globals.
    "import __main__\n"
    "for _n in ('BLOCKED', 'PATH_WRITES'):\n"
    "    getattr(__main__, _n, set()).clear()\n"
    "vars(__main__).update(inside=lambda p: True, proc_other=lambda p: False, hook=lambda *a: None)\n"
)


def test_sandbox_cannot_be_switched_off_from_inside(entry_points, caller, backend_kind):
    """After the old one-line switch-off, no escape works: it would print "escaped" (the expected output)."""
    label = _stdio(("", "escaped"))
    code = SWITCH_OFF + (
        "import os, socket, subprocess\n"
        "escaped = []\n"
        "for attempt in (\n"
        f"    lambda: socket.create_connection(('127.0.0.1', {caller.port}), timeout=1),\n"
        f"    lambda: open({str(caller.canary)!r}, 'w').write('pwned'),\n"
        f"    lambda: os.remove({str(caller.victim)!r}),\n"
        "    lambda: open('/etc/shadow').read(),\n"
        f"    lambda: subprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(30)', {caller.marker!r}], start_new_session=True),\n"
        "):\n"
        "    try:\n"
        "        attempt()\n"
        "        escaped.append(1)\n"
        "    except Exception:\n"
        "        pass\n"
        "print('escaped' if len(escaped) > 1 else 'held')\n"  # the sleeper alone is allowed; it must not outlive the run
    )
    assert score_all(entry_points, code, label) == [0.0, 0.0, 0.0]
    caller.assert_untouched()


def test_no_process_outlives_its_run(entry_points, caller, backend_kind):
    """A correct program that leaves a detached sleeper behind scores 1, and the sleeper is gone.

    (The legacy backend's audit tripwire refuses fork outright, so there the program fails.)"""
    label = _stdio(("", "ok"))
    code = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(30)', {caller.marker!r}])\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "print('ok')\n"
    )
    want = 0.0 if backend_kind == "legacy" else 1.0
    assert score_all(entry_points, code, label) == [want] * 3
    caller.assert_untouched()


# --------------------------------------------------------------------------- time, output, memory, processes


BOUNDS = {
    "infinite_loop": "while True:\n    pass\n",
    "sleeps_past_deadline": "import time\ntime.sleep(60)\n",
    "one_gb_output": "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))\n",
    "twenty_gb_allocation": "a = bytearray(20 << 30)\n",
    "grows_until_killed": "a = []\nwhile True:\n    a.append(bytearray(1 << 26))\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
}


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_bounded_humaneval(name, entry_points, tasks, caller):
    """At module level or inside the call, each ends by the wall-clock budget with score 0."""
    body = "\n".join("    " + line for line in BOUNDS[name].splitlines())
    for code in (WRONG + BOUNDS[name], f"def has_close_elements(numbers, threshold):\n{body}\n    return False\n"):
        t0 = time.monotonic()
        assert score_all(entry_points, code, tasks["humaneval/0"]["label"]) == [0.0, 0.0, 0.0]
        _bounded(t0)
    caller.assert_untouched()


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_bounded_stdio(name, entry_points, caller, backend_kind):
    label = _stdio(("", "x" * 64))
    t0 = time.monotonic()
    assert score_all(entry_points, BOUNDS[name] + "print('x' * 64)\n", label) == [0.0, 0.0, 0.0]
    _bounded(t0)
    caller.assert_untouched()
