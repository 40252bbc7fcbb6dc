"""Harness source: the tester role, and the tests compiled so that no test stops at a wrong answer.

Pasted after `harness_channel`'s source into the program every sandbox runs (`launch.harness_source`),
standard library only: nothing here may import mentor. ``role_tester`` runs the trusted setup and tests
with ``candidate`` bound to a proxy whose calls go to the worker through the caller; `recording_tests`
compiles the tests so that a failing ``assert`` (or statement of ``check``) is recorded and the run goes
on, and short-circuiting expressions evaluate every operand: the calls the worker sees never tell it
whether an earlier answer passed.
"""

import builtins
import os

try:  # inside the sandbox the sources pasted before this one define these
    from_plain, to_plain, PlainError, first_message, describe  # noqa: B018
except NameError:  # imported as a module (tests, tools): never inside a sandbox, where nothing may import mentor
    from mentor.training.plaincodec import PlainError, from_plain, to_plain
    from mentor.training.sandbox.harness_channel import describe, first_message


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

FULL_HELPERS = {"And": "_mentor_and", "Or": "_mentor_or", "all": "_mentor_all", "any": "_mentor_any",
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
    return _located(_ast.Call(_ast.Name(FULL_HELPERS[name], _ast.Load()), args, []), like)


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


def evaluate_fully(_ast, root):
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
    tree = evaluate_fully(_ast, tree)
    return compile(tree, filename, "exec")


def role_tester(cfg, layers):
    chan, init = first_message(layers)
    if init is None:
        return
    nonce = init.pop("nonce")
    calls = [0]
    failures = []

    def record(line, exc):
        if not failures:
            failures.append("%s (tests.py line %d)" % (describe(exc) if exc is not None else "AssertionError", line))
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
         **{name: globals()[name] for name in FULL_HELPERS.values()}}
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
        chan.send({"done": "fail", "why": describe(exc) + where, "calls": calls[0]})
        return
    if failures:
        chan.send({"done": "fail", "why": "%s; %d failure(s) in all" % (failures[0], len(failures)), "calls": calls[0]})
        return
    chan.send({"done": "pass", "nonce": nonce, "calls": calls[0]})

