"""The program that runs INSIDE each sandbox (standard library only).

`mentor.training.sandbox.launch` starts ``python -I -S -B -c SOURCE CONFIG`` where
SOURCE is `mentor.training.plaincodec` followed by this file (or, when the
sandbox runs the caller's own interpreter, the same code compiled once by the
caller and passed marshalled: `launch.harness_args`), so nothing here may
import mentor. CONFIG (JSON, argv[1]) names the role and the rlimits; it
holds nothing secret. Roles:

``program``  run a stdin/stdout program (``/sandbox/main.py``, or ``main.py`` in
             the work dir) as ``__main__``; its output is compared by the caller.
``worker``   load the candidate's code as module ``solution``, then answer
             the tester's ``{"call": {"a": args, "k": kwargs}}`` messages
             (relayed unparsed by the caller) with ``{"ok": result}`` (plain
             data only) or ``{"raised": name, "msg": text}``. The candidate's
             own prints go to /dev/null.
``tester``   run the trusted setup (the task's prompt) and tests with
             ``candidate`` bound to a proxy whose calls are forwarded to the
             worker through the caller, and report ``{"done": "pass",
             "nonce": N}`` only once ``check(candidate)`` has returned with
             no failure recorded. The tests are compiled so that a failing
             ``assert`` (or a failing statement of ``check``) is *recorded*
             and the run goes on, and short-circuiting expressions evaluate
             every operand (`recording_tests`): every test call is made
             whatever the candidate answered, so the calls the worker sees
             never tell it whether an earlier answer passed (no answer oracle).
             It decodes the worker's replies (relayed unparsed by the caller)
             strictly, and fails the check itself on one that is not plain data.
``probe``    report what this process can see and do (used once per process
             to check that the layers hold).

Every role first sets the rlimits and sends a ``hello`` with its uid, effective
capabilities and no_new_privs flag, before any untrusted code runs; the caller
refuses to go on if the uid is 0. Messages are one JSON object per line on the
original stdin/stdout (the worker and tester move them to private fds and put
/dev/null on 0/1, so a stray ``print`` cannot break the framing; after the
hello fd 2 is /dev/null too, so a stderr flood costs the caller nothing).

In the legacy backend (no bubblewrap) `legacy_setup` (`harness_legacy`'s
source, pasted before this file) first builds what layers the kernel allows
here: namespaces via unshare(2), a read-only filesystem, the uid drop, and an
audit hook that is a tripwire only (see the sandbox module).

Over 500 lines: this is the one program every sandbox runs, pasted as source
after plaincodec's (nothing in it can be imported from a module of its own).
"""

import builtins
import json
import os
import resource
import sys

try:  # inside the sandbox this file runs after plaincodec's source, which defines these
    from_plain, to_plain, PlainError  # noqa: B018
except NameError:  # imported as a module (tests, tools)
    # never inside a sandbox, where nothing may import mentor
    from mentor.training.plaincodec import PlainError, from_plain, to_plain

MAX_LINE = 8 << 20


def _distinct(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a JSON object with a repeated key")
    return obj


class _Channel:
    """Newline-delimited JSON objects on two raw fds."""

    def __init__(self, rfd, wfd):
        self.rfd, self.wfd, self.buf = rfd, wfd, bytearray()

    def send(self, obj):
        data = (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()
        while data:
            data = data[os.write(self.wfd, data):]

    def recv(self):
        """The next object; None at the end of the stream or past MAX_LINE; ValueError when the line is
        not one JSON object with distinct keys (calls and replies are relayed unparsed by the caller)."""
        scanned = 0
        while True:
            nl = self.buf.find(b"\n", scanned)
            if nl >= 0:
                break
            scanned = len(self.buf)
            if scanned > MAX_LINE:
                return None
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                return None
            self.buf += chunk
        line = bytes(self.buf[:nl])
        del self.buf[:nl + 1]
        try:
            obj = json.loads(line.decode("utf-8"), object_pairs_hook=_distinct)
        except RecursionError:
            raise ValueError("nested too deeply") from None
        if type(obj) is not dict:
            raise ValueError("not a JSON object")
        return obj


def _first_message(layers):
    """The private channel and the parent's first message on it (None: the parent sent nothing)."""
    chan = _private_channel(layers)
    return chan, chan.recv()


def _private_channel(layers):
    """Move the message pipes off fds 0/1 (which become /dev/null), say hello, then silence fd 2 as well."""
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    chan = _Channel(rfd, wfd)
    chan.send({"hello": identity(), "layers": layers})
    os.dup2(null, 2)  # the caller stops reading stderr after the hello
    os.close(null)
    return chan


def set_rlimits(cfg):
    pairs = [
        (resource.RLIMIT_CPU, cfg["cpu_seconds"]),
        (resource.RLIMIT_AS, cfg["memory_bytes"]),
        (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
        (resource.RLIMIT_NPROC, cfg["processes"]),
        (resource.RLIMIT_NOFILE, cfg["open_files"]),
        (resource.RLIMIT_CORE, 0),
        # Kernel objects outside any fd: queued signals and POSIX timers (96,368 timers here pinned
        # 37 MiB of slab), POSIX message queues.
        (resource.RLIMIT_SIGPENDING, 64),
        (resource.RLIMIT_MSGQUEUE, 0),
    ]
    ok = True
    for res, value in pairs:
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            ok = False
    return ok


def _libc():
    """mount, prctl and capset of the C library through `_ctypes` alone: importing `ctypes` would cost every
    sandbox 3 ms of CPU, `_ctypes` 0.6 ms."""
    import _ctypes  # at use: only drop_privileges needs it

    class Int(_ctypes._SimpleCData):
        _type_ = "i"

    class ULong(_ctypes._SimpleCData):
        _type_ = "L"

    class CharP(_ctypes._SimpleCData):
        _type_ = "z"

    class U32(_ctypes._SimpleCData):
        _type_ = "I"

    class Caps(_ctypes.Array):  # a capability header (2 words) or the data of its two halves (6 words)
        _type_ = U32
        _length_ = 6

    class Lib:
        _handle = _ctypes.dlopen(None, 0)

    class Fn(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    def fn(name, *args):
        f = Fn((name, Lib()))
        f.argtypes = args
        return f

    return (fn("mount", CharP, CharP, CharP, ULong, CharP), fn("prctl", Int, ULong, ULong, ULong, ULong),
            fn("capset", Caps, Caps), Caps, fn("unshare", Int))


def hide_proc(mount, cfg):
    """This /proc shows its own processes only (``subset=pid``, Linux 5.8): no other uid's key quotas or
    locks, and none of the host's cumulative counters that a run could move and a later run read back
    (/proc/stat's fork count...). Older kernels: /dev/null over each of them. True when it held."""
    if mount(b"proc", b"/proc", b"proc", 32 | 2 | 4 | 8, b"subset=pid") == 0:  # MS_REMOUNT|NOSUID|NODEV|NOEXEC
        return True
    files = [mount(b"/dev/null", p.encode(), None, 4096, None) == 0 for p in cfg.get("proc_masks", ()) if os.path.exists(p)]
    dirs = [mount(b"tmpfs", p.encode(), b"tmpfs", 1, b"mode=0555") == 0 for p in cfg.get("proc_dir_masks", ()) if os.path.isdir(p)]
    return all(files) and all(dirs)


def drop_privileges(drop, layers):
    """bwrap as root: mount /tmp (a tmpfs limited in bytes *and* inodes, which bwrap's own --tmpfs cannot
    be), hide /proc's global files (`hide_proc`), then become the run's slot uid with no capability left in
    any set and no_new_privs, and check it (``mount(8)`` and ``setpriv`` did this in three more execs per
    sandbox). Only trusted code has run until here; the run stops if any step fails (code never runs as
    root).

    bwrap as a normal user (``drop["ids"]``: the caller's uid and gid): the same mounts, made as root of
    bwrap's user namespace (``--uid 0``, which owns the sandbox's mounts), then `_own_userns` leaves that
    uid 0 for the caller's own uid in a user namespace of its own (what bwrap itself does, there without
    the mounts), with every capability dropped the same way."""
    mount, prctl, capset, caps, unshare = _libc()
    uid = gid = drop.get("uid")
    if mount(b"tmpfs", b"/tmp", b"tmpfs", 2 | 4, drop["tmp"].encode()) != 0:  # MS_NOSUID | MS_NODEV
        os.write(2, b"mentor sandbox: cannot mount /tmp\n")
        os._exit(125)
    os.chdir("/tmp")
    hide_proc(mount, drop)
    if uid is None:
        uid, gid = _own_userns(unshare, drop["ids"])
    for cap in range(64):
        prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last capability)
    if drop.get("uid") is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from uid 0 to another: the kernel clears the permitted and effective sets
    capset(caps(0x20080522, 0), caps())  # _LINUX_CAPABILITY_VERSION_3, this process: the inheritable set too
    prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    # A uid change without an exec leaves the process non-dumpable, its /proc/self root's (no
    # /proc/self/fd or io for it): dumpable again, as it is after an exec.
    prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
    with open("/proc/self/status") as fh:
        status = dict(line.split(":", 1) for line in fh if ":" in line)
    if (any(int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
            or int(status["NoNewPrivs"]) != 1 or os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3):
        os.write(2, b"mentor sandbox: the privileges did not drop\n")
        os._exit(125)
    return layers + ["tmpcap"]


def _own_userns(unshare, ids):
    """From uid 0 of bwrap's user namespace (the caller's uid outside) to the caller's own uid and gid in a
    new user namespace, mapped to that uid 0 and nothing else; the (uid, gid) it now has."""
    uid, gid = int(ids[0]), int(ids[1])
    if unshare(0x10000000) != 0:  # CLONE_NEWUSER
        os.write(2, b"mentor sandbox: cannot leave the setup's user namespace\n")
        os._exit(125)
    for name, text in (("setgroups", "deny"), ("uid_map", "%d 0 1" % uid), ("gid_map", "%d 0 1" % gid)):
        with open("/proc/self/" + name, "w") as fh:
            fh.write(text)
    return uid, gid


def install_seccomp(hexprog):
    """Load the classic-BPF filter `hexprog` (``struct sock_filter[]``) for this process and its children."""
    import ctypes  # only when the filter is installed here (legacy backend; bwrap as a normal user)

    prog = bytes.fromhex(hexprog)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(38, 1, None, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to load a filter without CAP_SYS_ADMIN
        return False
    return libc.prctl(22, 2, ctypes.cast(ctypes.pointer(fprog), ctypes.c_void_p), 0, 0) == 0  # PR_SET_SECCOMP, FILTER


def identity():
    """Facts the caller checks before any untrusted code runs."""
    caps, nnp = None, None
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
                elif line.startswith("NoNewPrivs:"):
                    nnp = int(line.split()[1])
    except OSError:
        pass
    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
            "caps": caps, "nnp": nnp, "pid": os.getpid(), "prefix": sys.prefix}


# --------------------------------------------------------------------------- roles


def role_program(cfg, layers):
    path = cfg.get("main") or "main.py"
    with open(path, "rb") as fh:
        src = fh.read()
    sys.stderr.write("\x00MENTOR-SANDBOX-LAYERS " + json.dumps({"layers": layers, "id": identity()}) + "\n")
    sys.stderr.flush()
    sys.argv = ["main.py"]
    g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    exec(compile(src, "main.py", "exec"), g)


def role_worker(cfg, layers):
    import types  # at use: each role imports what it alone needs (every sandbox pays for its imports)

    chan, init = _first_message(layers)
    if init is None:
        return
    mod = types.ModuleType("solution")
    mod.__dict__["__builtins__"] = builtins
    sys.modules["solution"] = mod
    try:
        exec(compile(init.get("prelude", "") + init["code"], "solution.py", "exec"), mod.__dict__)
        owner, _, method = init["entry"].partition(".")
        fn = mod.__dict__.get(owner)
        if method:  # LeetCode style: the method of one instance, as LiveCodeBench's grader calls it
            fn = getattr(fn(), method, None) if isinstance(fn, type) else None
        if not callable(fn):
            chan.send({"error": "the code defines no function named %r" % init["entry"]})
            return
    except BaseException as exc:  # the candidate's code failed to load: report it, stop
        chan.send({"error": _describe(exc)})
        return
    chan.send({"ready": True})
    while True:
        msg = chan.recv()  # the tester's call, relayed as it wrote it
        if msg is None:
            return
        args, kwargs = from_plain(msg["call"]["a"]), from_plain(msg["call"]["k"])
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # SystemExit too: it is the call's outcome, not ours
            chan.send({"raised": _name(exc), "msg": _describe(exc)})
            continue
        try:
            chan.send({"ok": to_plain(result)})
        except (PlainError, ValueError, TypeError, RecursionError) as exc:
            chan.send({"bad": str(exc)[:200]})


class CandidateError(Exception):
    """What a test sees when the candidate's function raised (the original type is in the message)."""


# --------------------------------------------------------------------------- tests that record failures

_RECORD = "_mentor_record_failure"
_EXC = "_mentor_Exception"
_LOC = ("lineno", "col_offset", "end_lineno", "end_col_offset")


def _located(node, like):
    """`node` and every node under it without a location get `like`'s (ast.fix_missing_locations, without ast)."""
    todo = [node]
    while todo:
        n = todo.pop()
        if "lineno" in getattr(n, "_attributes", ()):
            for a in _LOC:
                if getattr(n, a, None) is None:
                    setattr(n, a, getattr(like, a, None))
        for f in getattr(n, "_fields", ()):
            v = getattr(n, f, None)
            todo.extend(v if isinstance(v, list) else [v] if hasattr(v, "_fields") else [])
    return node


def _record_call(_ast, line, exc_name):
    args = [_ast.Constant(line), _ast.Name(exc_name, _ast.Load()) if exc_name else _ast.Constant(None)]
    return _ast.Expr(_ast.Call(_ast.Name(_RECORD, _ast.Load()), args, []))


def _guard(_ast, body, like):
    """try: BODY  except Exception as e: record(line, e)"""
    handler = _ast.ExceptHandler(_ast.Name(_EXC, _ast.Load()), "_mentor_e", [_record_call(_ast, like.lineno, "_mentor_e")])
    return _located(_ast.Try(body, [handler], [], []), like)


def _assert(_ast, node):
    """``assert T, M`` as ``if not T: record(line)`` (M is never evaluated: it could call the candidate)."""
    test = _ast.If(_ast.UnaryOp(_ast.Not(), node.test), [_record_call(_ast, node.lineno, None)], [])
    return _guard(_ast, [_located(test, node)], node)


def _body(_ast, stmts, wrap, guarded):
    return [_stmt(_ast, n, wrap, guarded) for n in stmts]


def _stmt(_ast, node, wrap, guarded):
    """One statement, rewritten. `guarded`: an enclosing try/with of the tests may catch what it raises,
    so its asserts keep raising; `wrap`: a statement of check() (or the module): a failure is recorded
    and the next statement runs."""
    kind = type(node).__name__
    if kind == "Assert":
        return node if guarded else _assert(_ast, node)
    if kind in ("FunctionDef", "AsyncFunctionDef"):
        node.body = _body(_ast, node.body, wrap and node.name == "check", False)
        return node
    if kind == "ClassDef":
        node.body = _body(_ast, node.body, False, guarded)
    elif kind in ("Try", "TryStar"):
        node.body = _body(_ast, node.body, False, guarded or bool(node.handlers))
        for h in node.handlers:
            h.body = _body(_ast, h.body, False, guarded)
        node.orelse = _body(_ast, node.orelse, False, guarded)
        node.finalbody = _body(_ast, node.finalbody, False, guarded)
    elif kind in ("With", "AsyncWith"):
        node.body = _body(_ast, node.body, False, True)  # a context manager may suppress what its body raises
    elif kind in ("If", "For", "AsyncFor", "While"):
        node.body = _body(_ast, node.body, wrap, guarded)
        node.orelse = _body(_ast, node.orelse, wrap, guarded)
    elif kind == "Match":
        for case in node.cases:
            case.body = _body(_ast, case.body, wrap, guarded)
    elif kind in ("Pass", "Break", "Continue", "Global", "Nonlocal"):
        return node
    return _guard(_ast, [node], node) if wrap else node


# --------------------------------------------------------------------------- tests that evaluate every operand
#
# Within one expression Python stops early: ``a and b`` skips b when a is false, ``all(...)`` stops at
# the first false item, ``a == b == c`` and ``x if t else y`` evaluate only what decides them. When the
# skipped part calls the candidate, whether that call comes says whether an earlier answer was right.
# So in the tests these evaluate every operand, in source order, before the result is decided; what
# comes after the decision is evaluated for its calls only (its value and its exceptions dropped), and
# the result is exactly Python's. Left alone: operands holding ``:=``, ``yield``, ``await`` or
# ``super`` (a lambda would change their meaning) and class bodies (a lambda there cannot see the
# class's names); statement-level early exits (``break``, ``return`` after a failed comparison) are
# the tests' own and stay.

_FULL = {"And": "_mentor_and", "Or": "_mentor_or", "all": "_mentor_all", "any": "_mentor_any",
         "Compare": "_mentor_chain", "IfExp": "_mentor_ifexp"}
_LAMBDA_UNSAFE = ("NamedExpr", "Yield", "YieldFrom", "Await")


def _quiet(thunk):
    try:
        thunk()
    except Exception:
        pass


def _mentor_and(first, *rest):
    result, decided = first, not first
    for thunk in rest:
        if decided:
            _quiet(thunk)
        else:
            result = thunk()
            decided = not result
    return result


def _mentor_or(first, *rest):
    result, decided = first, bool(first)
    for thunk in rest:
        if decided:
            _quiet(thunk)
        else:
            result = thunk()
            decided = bool(result)
    return result


def _every_item(fn, args, kwargs, want):
    """all() (want=False) or any() (want=True) over every item; another callable named so is just called."""
    if fn is not (builtins.any if want else builtins.all) or len(args) != 1 or kwargs:
        return fn(*args, **kwargs)
    result = not want
    it = iter(args[0])
    while True:
        try:
            item = next(it)
        except StopIteration:
            return result
        except Exception:
            if result is not want:
                raise  # undecided: the original raises here too
            return result  # decided: the original had stopped before this
        if result is not want and bool(item) is want:
            result = want


def _mentor_all(fn, *args, **kwargs):
    return _every_item(fn, args, kwargs, False)


def _mentor_any(fn, *args, **kwargs):
    return _every_item(fn, args, kwargs, True)


def _compare(op, a, b):
    if op == "Eq":
        return a == b
    if op == "NotEq":
        return a != b
    if op == "Lt":
        return a < b
    if op == "LtE":
        return a <= b
    if op == "Gt":
        return a > b
    if op == "GtE":
        return a >= b
    if op == "Is":
        return a is b
    if op == "IsNot":
        return a is not b
    if op == "In":
        return a in b
    return a not in b


def _mentor_chain(left, *pairs):
    result, decided = True, False
    for i in range(0, len(pairs), 2):
        if decided:
            _quiet(pairs[i + 1])
            continue
        right = pairs[i + 1]()
        result = _compare(pairs[i], left, right)
        decided, left = not result, right
    return result


def _mentor_ifexp(test, body, orelse):
    chosen = bool(test)
    out = []
    for thunk in (body, orelse):
        try:
            out.append((thunk(), None))
        except Exception as exc:
            out.append((None, exc))
    value, exc = out[0] if chosen else out[1]
    if exc is not None:
        raise exc
    return value


def _lambda_safe(node):
    todo = [node]
    while todo:
        n = todo.pop()
        kind = type(n).__name__
        if kind in _LAMBDA_UNSAFE or (kind == "Name" and n.id == "super"):
            return False
        for f in getattr(n, "_fields", ()):
            v = getattr(n, f, None)
            todo.extend(v if isinstance(v, list) else [v] if hasattr(v, "_fields") else [])
    return True


def _thunk(_ast, expr):
    args = _ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    return _located(_ast.Lambda(args, expr), expr)


def _helper(_ast, name, args, like):
    return _located(_ast.Call(_ast.Name(_FULL[name], _ast.Load()), args, []), like)


def _full(_ast, node):
    """`node` (already rewritten below) as a call of a helper that evaluates every operand, or itself."""
    kind = type(node).__name__
    if kind == "BoolOp" and _lambda_safe(_ast.Tuple(node.values[1:], _ast.Load())):
        return _helper(_ast, type(node.op).__name__, [node.values[0]] + [_thunk(_ast, v) for v in node.values[1:]], node)
    if kind == "Compare" and len(node.ops) > 1 and _lambda_safe(_ast.Tuple(node.comparators, _ast.Load())):
        args = [node.left]
        for op, right in zip(node.ops, node.comparators):
            args += [_located(_ast.Constant(type(op).__name__), node), _thunk(_ast, right)]
        return _helper(_ast, "Compare", args, node)
    if kind == "IfExp" and _lambda_safe(_ast.Tuple([node.body, node.orelse], _ast.Load())):
        return _helper(_ast, "IfExp", [node.test, _thunk(_ast, node.body), _thunk(_ast, node.orelse)], node)
    if kind == "Call" and type(node.func).__name__ == "Name" and node.func.id in ("all", "any"):
        return _helper(_ast, node.func.id, [node.func] + node.args, node) if not node.keywords else node
    return node


def _evaluate_fully(_ast, root):
    """Every short-circuiting expression under `root` rewritten by `_full`, innermost first (iterative:
    a test may nest deeper than the recursion limit), except directly in a class body."""
    seen, todo = [], [(root, False, None, None, None)]
    while todo:
        node, in_class, parent, field, index = todo.pop()
        kind = type(node).__name__
        inner = (in_class or kind == "ClassDef") and kind not in ("FunctionDef", "AsyncFunctionDef", "Lambda")
        seen.append((node, inner, parent, field, index))
        for f in node._fields:
            v = getattr(node, f, None)
            if isinstance(v, list):
                todo.extend((x, inner, node, f, i) for i, x in enumerate(v) if hasattr(x, "_fields"))
            elif hasattr(v, "_fields"):
                todo.append((v, inner, node, f, None))
    for node, inner, parent, field, index in reversed(seen):  # children before their parents
        new = node if inner or parent is None else _full(_ast, node)
        if new is not node:
            if index is None:
                setattr(parent, field, new)
            else:
                getattr(parent, field)[index] = new
    return root


def recording_tests(src, filename="tests.py"):
    """The tests compiled so that failures are recorded, not raised: every assert outside a try/with of
    the tests' own becomes ``if not T: _mentor_record_failure(line, None)``, and each statement of
    ``check`` (and of the module) that raises is recorded and followed by the next one. A run passes
    exactly when the original would have (nothing raised); it just never stops early, so the candidate
    receives the same calls whether its answers were right or not. Within an expression too: ``and``,
    ``or``, ``all``, ``any``, chained comparisons and conditional expressions evaluate every operand
    (`_full`)."""
    import _ast  # at use: only the tester parses tests

    tree = compile(src, filename, "exec", _ast.PyCF_ONLY_AST)
    tree.body = _body(_ast, tree.body, True, False)
    tree = _evaluate_fully(_ast, tree)
    return compile(tree, filename, "exec")


def role_tester(cfg, layers):
    chan, init = _first_message(layers)
    if init is None:
        return
    nonce = init.pop("nonce")
    calls = [0]
    failures = []

    def record(line, exc):
        if not failures:
            failures.append("%s (tests.py line %d)" % (_describe(exc) if exc is not None else "AssertionError", line))
        else:
            failures.append(None)

    def fatal(why):
        """A reply the tests must never see: the check fails here, whatever the tests would catch."""
        chan.send({"done": "fail", "why": "call %d: %s" % (calls[0], why), "calls": calls[0]})
        os._exit(3)

    def candidate(*args, **kwargs):
        calls[0] += 1
        chan.send({"call": {"a": to_plain(args), "k": to_plain(kwargs)}})
        try:
            reply = chan.recv()  # the worker's reply, relayed unparsed by the caller
        except ValueError:
            fatal("malformed reply from the candidate")
        if reply is None:
            os._exit(3)  # the caller has given up on this run
        keys = sorted(reply)
        if keys == ["ok"]:
            try:
                return from_plain(reply["ok"])
            except PlainError as exc:
                fatal("the candidate's reply is not plain data (%s)" % str(exc)[:100])
        if keys == ["msg", "raised"] and type(reply["msg"]) is str and type(reply["raised"]) is str:
            raise CandidateError(reply["msg"][:300])  # "TypeName: message", as the worker wrote it
        if keys == ["bad"]:
            fatal("the candidate returned a value that is not plain data (%s)" % str(reply["bad"])[:100])
        fatal("malformed reply from the candidate")

    candidate.__name__ = candidate.__qualname__ = init["entry"].rpartition(".")[2]
    g = {"__name__": "__main__", "__builtins__": builtins, _RECORD: record, _EXC: Exception,
         **{name: globals()[name] for name in _FULL.values()}}
    try:
        exec(compile(init.get("prelude", "") + (init.get("setup") or ""), "setup.py", "exec"), g)
        g[init["entry"].rpartition(".")[2]] = candidate  # tests that name the function itself get the candidate too
        exec(recording_tests(init["tests"]), g)
        g["check"](candidate)
    except BaseException as exc:
        import traceback  # only on failure: it is slow to import

        where = ""
        for frame in traceback.extract_tb(exc.__traceback__):
            if frame.filename in ("tests.py", "setup.py"):
                where = " (%s line %d)" % (frame.filename, frame.lineno)
        chan.send({"done": "fail", "why": _describe(exc) + where, "calls": calls[0]})
        return
    if failures:
        chan.send({"done": "fail", "why": "%s; %d failure(s) in all" % (failures[0], len(failures)), "calls": calls[0]})
        return
    chan.send({"done": "pass", "nonce": nonce, "calls": calls[0]})


def role_probe(cfg, layers):
    import socket  # at use: only the probe needs it

    facts = identity()
    facts["root_listing"] = sorted(os.listdir("/"))
    facts["proc_pids"] = sorted(p for p in os.listdir("/proc") if p.isdigit())
    try:
        with open("/etc/shadow", "rb"):
            facts["shadow_readable"] = True
    except OSError:
        facts["shadow_readable"] = False
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:  # the filter allows AF_UNIX sockets only
        facts["route"] = False
    else:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            facts["route"] = True
        except OSError:
            facts["route"] = False
        finally:
            s.close()
    facts.update(_probe_state(cfg))
    sys.stdout.write(json.dumps({"layers": layers, "facts": facts}) + "\n")


def _worked(f):
    try:
        f()
        return True
    except OSError:
        return False


def _probe_state(cfg):
    """What the syscall filter, the /proc masks and the /tmp mount must forbid: True where it worked."""
    import ctypes  # at use: only the probe needs these
    import fcntl  # likewise
    import socket  # likewise

    libc = ctypes.CDLL(None, use_errno=True)
    nr = cfg.get("nr") or {}
    out = {}
    try:
        with open("/proc/key-users") as fh:
            out["key_users"] = bool(fh.read().strip())
    except OSError:
        out["key_users"] = False
    # A key in the process keyring (-2) dies with this process, whatever happens.
    out["keyring"] = "add_key" not in nr or libc.syscall(nr["add_key"], b"user", b"mentor-probe", b"x", 1, -2) >= 0
    try:
        with open(os.__file__, "rb") as fh:  # a file every sandbox shares
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        out["flock"] = True
    except OSError:
        out["flock"] = False
    try:
        os.close(os.memfd_create("mentor-probe"))
        out["memfd"] = True
    except (OSError, AttributeError):
        out["memfd"] = False
    shm = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    out["shm"] = shm >= 0
    if shm >= 0:
        libc.shmctl(shm, 0, None)  # IPC_RMID
    # The page cache of a shared file, socket buffers past the default, host-wide counters.
    with open(os.__file__, "rb") as fh:
        out["fadvise"] = _worked(lambda: os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED))
        out["nowait"] = _worked(lambda: os.preadv(fh.fileno(), [bytearray(16)], 0, os.RWF_NOWAIT))
    out["sockbuf"] = _worked(lambda: socket.socket(socket.AF_UNIX).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20))
    out["pidfd"] = _worked(lambda: os.close(os.pidfd_open(os.getpid())))
    # Host-wide ids (issue 58): sockets of other families (netlink's sock_diag and its port ids, TCP's
    # count), eventfd ids, the unique mount id of statx.
    out["netlink"] = _worked(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4).close())
    out["inet"] = _worked(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
    out["eventfd"] = _worked(lambda: os.close(os.eventfd(0)))
    out["statx"] = "statx" not in nr or libc.syscall(nr["statx"], -100, b"/", 0, 0x4000, ctypes.create_string_buffer(256)) == 0
    try:
        with open("/proc/stat") as fh:
            out["proc_stat"] = bool(fh.read().strip())
    except OSError:
        out["proc_stat"] = False
    out["tmp_opts"], out["disk_mounts"] = [], []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                f, fstype = line.split(), line.partition(" - ")[2].split()[:1]
                if len(f) > 4 and f[4] == os.getcwd():  # its writable dir: /tmp (bwrap), the work dir (legacy)
                    out["tmp_opts"] = [o.split("=")[0] for o in line.rsplit(" ", 1)[-1].strip().split(",")]
                # What it can read must not come from a disk's page cache (files bound over /proc aside).
                if len(f) > 4 and os.path.isdir(f[4]) and fstype and fstype[0] not in ("tmpfs", "proc", "devpts", "mqueue"):
                    out["disk_mounts"].append(f[4])
    except OSError:
        pass
    out["userns"] = libc.unshare(0x10000000) == 0  # last: it changes what this process is
    return out


def _name(exc):
    try:
        return str(type(exc).__name__)[:80]
    except BaseException:
        return "?"


def _describe(exc):
    try:
        return ("%s: %s" % (_name(exc), exc))[:300]
    except BaseException:
        return _name(exc)


ROLES = {"program": role_program, "worker": role_worker, "tester": role_tester, "probe": role_probe}


def main():
    cfg = json.loads(sys.argv[1])
    layers = list(cfg.get("layers", []))
    if cfg.get("legacy"):
        layers = legacy_setup(cfg, layers)  # noqa: F821 - defined in harness_legacy's source
    elif cfg.get("drop"):
        layers = drop_privileges(cfg["drop"], layers)
    if set_rlimits(cfg):
        layers.append("rlimits")
    if os.getuid() == 0 or os.geteuid() == 0:
        sys.stderr.write("mentor sandbox: refusing to run code as uid 0\n")
        os._exit(125)
    # bwrap as root hands the filter over itself (--seccomp); the legacy backend and bwrap as a normal user
    # (whose harness needs a user namespace of its own first) load it here, before any untrusted code.
    if cfg.get("seccomp") and install_seccomp(cfg["seccomp"]):
        layers.append("seccomp")
    if cfg.get("legacy") and cfg.get("audit") and cfg["role"] != "probe":  # the probe observes the kernel's layers
        install_audit_hook(os.path.realpath(os.getcwd()), cfg)  # noqa: F821
        layers.append("audit")
    ROLES[cfg["role"]](cfg, layers)
