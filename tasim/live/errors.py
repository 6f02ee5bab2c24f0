"""Live mode's user-facing errors: the CLI prints them as one line and exits 2."""


class LiveError(RuntimeError):
    """A live run cannot start or continue; the message says what to change or where to look."""
