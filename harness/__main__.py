"""``python -m harness ...`` is ``conformance ...`` (an environment without the
console script on its PATH: ``conformance upstream``'s release environments)."""

import sys

from .cli import main

sys.exit(main())
