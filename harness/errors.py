"""Errors the CLI turns into one line on stderr and exit status 2."""

import difflib


class UsageError(ValueError):
    """Bad input from the user: unknown names, malformed values, impossible shapes.

    The message is one line that names what was wrong and what is valid."""


def suggest(name: str, valid) -> str:
    """', '.join(valid), with the closest match first when there is one."""
    valid = list(valid)
    close = difflib.get_close_matches(str(name), valid, n=1)
    head = f"did you mean {close[0]!r}? " if close else ""
    return f"{head}valid: {', '.join(map(str, valid))}"
