"""``python -m harness ...`` is ``conformance ...`` (an environment without the
console script on its PATH: ``conformance upstream``'s release environments)."""

from .cli import entry

entry()
