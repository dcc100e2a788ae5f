"""Counted words for messages: the one pluralizer of the client and the collector (``1 event stays``,
``2 events stay``). No imports: the hook's cold path, the command line and the collector all use it."""

from __future__ import annotations

__all__ = ["counted", "plural"]


def plural(count: int, word: str, many: str | None = None) -> str:
    """``word`` for a count of one, else ``many`` (default: ``word + "s"``). For verbs too:
    ``plural(n, "stays", "stay")``, ``plural(n, "is", "are")``."""
    if count == 1:
        return word
    return f"{word}s" if many is None else many


def counted(count: int, noun: str, many: str | None = None) -> str:
    """``1 event``, ``2 events``, ``0 events``."""
    return f"{count} {plural(count, noun, many)}"
