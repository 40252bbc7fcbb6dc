"""Stable identifiers: problem ids from normalised text, content hashes."""

from __future__ import annotations

import hashlib
import re
import unicodedata

_WS = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """NFKC, unify quotes, collapse whitespace, strip: the form problem ids hash."""
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    return _WS.sub(" ", text).strip()


def text_id(text: str, prefix: str = "p") -> str:
    """Stable id of a problem text: ``p-`` + 16 hex of sha256 over the normalised text."""
    digest = hashlib.sha256(normalise_text(text).encode("utf-8")).hexdigest()[:16]
    return f"{prefix}-{digest}"


def content_hash(*parts: str, length: int = 16) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:length]
