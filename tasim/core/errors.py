"""Errors every command reports the same way, defined outside the CLI so that the modules
behind it can raise them without importing it."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class LiveError(RuntimeError):
    """A live run cannot start or continue; the message says what to change or where to look."""
