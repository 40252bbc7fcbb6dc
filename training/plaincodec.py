"""Plain data across the sandbox boundary: a strict, tagged, size-limited JSON encoding.

The code verifier passes each test call's arguments to the candidate and its
result back as *plain data* only, so that nothing the candidate defines (an
object whose ``__eq__`` is always true, an ``int`` subclass, a generator) ever
reaches the code that evaluates the assertions. Decoding builds fresh values of
the exact built-in types below, whatever the bytes claim; anything else is an
error (`PlainError`), never a best-effort guess.

Encoding (one JSON value):

=====================  =============================================
``None``, ``bool``     JSON ``null`` / ``true`` / ``false``
``int``                a JSON integer; beyond 2**63 ``["i", hex]``
``float``              a JSON number (``repr``: exact); ``["f", "nan" | "inf" | "-inf"]``
``str``                a JSON string
``list``               ``["l", item, ...]``
``tuple``              ``["t", item, ...]`` (kept apart: ``[1, 2] == (1, 2)`` is False)
``dict``               ``["d", key, value, key, value, ...]`` (keys of any hashable kind)
``set``/``frozenset``  ``["S", item, ...]`` / ``["F", item, ...]``
``bytes``              ``["b", base64]``
``complex``            ``["c", real, imag]``
=====================  =============================================

On the encoding side subclasses of these types are encoded as the base type
(a ``Counter`` as a dict, a namedtuple as a tuple), which is what comparing them
in-process would do too. This module is standard library only: its source also
runs inside the sandbox (see `mentor.training.sandbox.harness`).

Bounded work. An encoding holds at most `MAX_NODES` values, nests at most
`MAX_DEPTH` deep, and a dict, set or frozenset holds at most `MAX_KEYS` items.
Only the sandboxes decode (the trusted side of the code verifier relays the
encodings as bytes, see `code_verify.run_humaneval`). `from_plain` builds the values and,
before building a dict, set or frozenset of more than 64 items, refuses a
*hash-collision flood* (many distinct keys with equal hashes, which makes
each insertion scan all the earlier ones: 50,000 ints that are multiples of
2**61 - 1 cost 35 s): it sorts the keys' hashes (machine ints, in C) and
refuses when more than 64 + n/1024 of them repeat an earlier one.
"""

import base64
import json
import math

MAX_DEPTH = 64
MAX_NODES = 1_000_000
MAX_KEYS = 1 << 18  # items of one dict, set or frozenset


class PlainError(ValueError):
    """A value that is not plain data, or bytes that are not a valid encoding."""


_BIG = 1 << 63


def _spend(depth, budget):
    """One more value at `depth`: refused past the value budget or the nesting limit."""
    budget[0] -= 1
    if budget[0] < 0:
        raise PlainError("too many values")
    if depth > MAX_DEPTH:
        raise PlainError("nested too deeply")


def _enc(v, depth, budget):
    _spend(depth, budget)
    if v is None or v is True or v is False:
        return v
    if isinstance(v, bool):  # a bool subclass cannot exist; kept for clarity
        return bool(v)
    if isinstance(v, int):
        v = int.__index__(v)
        return v if -_BIG < v < _BIG else ["i", format(v, "x")]
    if isinstance(v, float):
        v = float.__float__(v)
        if math.isnan(v):
            return ["f", "nan"]
        if math.isinf(v):
            return ["f", "inf" if v > 0 else "-inf"]
        return v
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, (bytes, bytearray)):
        return ["b", base64.b64encode(bytes(v)).decode("ascii")]
    if isinstance(v, complex):
        return ["c", _enc(v.real, depth + 1, budget), _enc(v.imag, depth + 1, budget)]
    if isinstance(v, list):
        return ["l", *[_enc(x, depth + 1, budget) for x in list.__iter__(v)]]
    if isinstance(v, tuple):
        return ["t", *[_enc(x, depth + 1, budget) for x in tuple.__iter__(v)]]
    if isinstance(v, dict):
        out = ["d"]
        for k, x in dict.items(v):
            out.append(_enc(k, depth + 1, budget))
            out.append(_enc(x, depth + 1, budget))
        return out
    if isinstance(v, frozenset):
        return ["F", *[_enc(x, depth + 1, budget) for x in frozenset.__iter__(v)]]
    if isinstance(v, set):
        return ["S", *[_enc(x, depth + 1, budget) for x in set.__iter__(v)]]
    raise PlainError(f"{type(v).__name__} is not plain data")


def to_plain(value):
    """The JSON-ready encoding of `value`; PlainError for anything that is not plain data."""
    return _enc(value, 0, [MAX_NODES])


def dumps(value) -> str:
    """`to_plain` as one line of JSON text."""
    return json.dumps(to_plain(value), separators=(",", ":"), allow_nan=False)


def _hashable(v):
    try:
        hash(v)
    except TypeError:
        raise PlainError(f"unhashable {type(v).__name__} used as a key or set item") from None
    return v


def _spread(keys):
    """`keys` (already hashable), unless they are a hash-collision flood (see the module docstring)."""
    n = len(keys)
    if n > MAX_KEYS:
        raise PlainError(f"a dict or set of {n} items (at most {MAX_KEYS})")
    if n > 64:
        hs = sorted(map(hash, keys))
        repeats = sum(1 for i in range(1, n) if hs[i] == hs[i - 1])
        if repeats > 64 + n // 1024:
            raise PlainError(f"{repeats} of {n} keys repeat another key's hash (a hash-collision flood)")
    return keys


def _dec(x, depth, budget):
    _spend(depth, budget)
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return int(x)
    if t is float:
        if math.isnan(x) or math.isinf(x):
            raise PlainError("bare NaN/Infinity")  # only the tagged form is valid
        return float(x)
    if t is not list or not x or type(x[0]) is not str:
        raise PlainError(f"invalid encoded value of JSON type {t.__name__}")
    tag, items = x[0], x[1:]
    if tag == "l":
        return [_dec(i, depth + 1, budget) for i in items]
    if tag == "t":
        return tuple(_dec(i, depth + 1, budget) for i in items)
    if tag == "d":
        if len(items) % 2:
            raise PlainError("dict with an odd number of items")
        keys = _spread([_hashable(_dec(items[i], depth + 1, budget)) for i in range(0, len(items), 2)])
        values = [_dec(items[i], depth + 1, budget) for i in range(1, len(items), 2)]
        return dict(zip(keys, values))
    if tag == "S":
        return set(_spread([_hashable(_dec(i, depth + 1, budget)) for i in items]))
    if tag == "F":
        return frozenset(_spread([_hashable(_dec(i, depth + 1, budget)) for i in items]))
    if len(items) == 1 and type(items[0]) is str:
        s = items[0]
        if tag == "i":
            try:
                v = int(s, 16)
            except ValueError:
                raise PlainError("invalid big integer") from None
            if -_BIG < v < _BIG:
                raise PlainError("non-canonical big integer")
            return v
        if tag == "f" and s in ("nan", "inf", "-inf"):
            return float(s)
        if tag == "b":
            try:
                return base64.b64decode(s.encode("ascii"), validate=True)
            except (ValueError, UnicodeEncodeError):
                raise PlainError("invalid base64") from None
    if tag == "c" and len(items) == 2:
        re_, im = (_dec(i, depth + 1, budget) for i in items)
        if type(re_) is float and type(im) is float:
            return complex(re_, im)
    raise PlainError(f"invalid encoded value with tag {tag[:10]!r}")


def from_plain(obj):
    """Fresh built-in values from an encoding; PlainError on anything malformed."""
    try:
        return _dec(obj, 0, [MAX_NODES])
    except RecursionError:
        raise PlainError("nested too deeply") from None


def loads(text: str | bytes):
    """`from_plain` of one JSON text."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PlainError(f"not JSON: {exc}"[:200]) from None
    return from_plain(obj)
