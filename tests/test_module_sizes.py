"""Modules stay at most 500 lines unless their opening docstring says why (docs/development.md#module-size).

Every ``.py`` of the five rooms (pipeline/ data/ training/ stages/ workflows/) is counted as ``wc -l`` counts it;
one over `LIMIT` passes only when its module docstring holds a sentence that starts with `MARKER` and says why it
is one module (at least `MIN_WORDS` words after the marker).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOMS = ("pipeline", "data", "training", "stages", "workflows")
LIMIT = 500
MARKER = "Why one module:"
MIN_WORDS = 6


def lines(path: Path) -> int:
    """Newlines in the file, as ``wc -l``."""
    return path.read_bytes().count(b"\n")


def why_long(path: Path) -> str | None:
    """The reason after `MARKER` in the module's docstring (up to the sentence's end), or None."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path))) or ""
    if MARKER not in doc:
        return None
    reason = " ".join(doc.split(MARKER, 1)[1].split())
    reason = reason.split(". ", 1)[0]
    return reason if len(reason.split()) >= MIN_WORDS else None


def long_without_reason(root: Path = REPO) -> list[str]:
    out = []
    for room in ROOMS:
        for f in sorted((root / room).rglob("*.py")):
            n = lines(f)
            if n > LIMIT and why_long(f) is None:
                out.append(f"{f.relative_to(root)}: {n} lines and no '{MARKER} ...' sentence in its opening docstring")
    return out


def test_modules_over_the_limit_say_why_they_are_one():
    bad = long_without_reason()
    assert not bad, (f"modules over {LIMIT} lines: split them along a seam, or say in the opening docstring "
                     f"'{MARKER} <why>' (docs/development.md#module-size):\n" + "\n".join(bad))


def test_the_check_finds_a_long_module_and_takes_a_reason(tmp_path):
    """The check itself: 501 lines without the marker fail it; with a reason (not a bare marker) they pass."""
    body = "x = 1\n" * (LIMIT - 1)
    (tmp_path / "stages").mkdir()
    mod = tmp_path / "stages" / "big.py"
    mod.write_text('"""A stage part."""\n\n' + body)
    assert lines(mod) == LIMIT + 1 and long_without_reason(tmp_path) == [
        f"stages/big.py: {LIMIT + 1} lines and no '{MARKER} ...' sentence in its opening docstring"]
    mod.write_text(f'"""A stage part. {MARKER} too."""\n\n' + body)
    assert len(long_without_reason(tmp_path)) == 1  # a marker without a reason is not one
    mod.write_text(f'"""A stage part.\n\n{MARKER} its three passes share one table of state that no seam splits.\n"""\n' + body)
    assert long_without_reason(tmp_path) == []
    mod.write_text('"""A stage part."""\n\n' + body[: -len("x = 1\n")])
    assert long_without_reason(tmp_path) == []  # exactly the limit: fine
