"""The tests' helpers are ``harness.testing`` and harness/pytest_fixtures.py (re-exported
here, so a test may ``from conftest import run``); the fixtures are the repository's root
conftest.py."""

from harness.pytest_fixtures import case_run, finding, run  # noqa: F401
from harness.testing import *  # noqa: F401,F403
from harness.testing import (all_statuses, assert_llamacpp_fails_first_at_q,  # noqa: F401
                             assert_llamacpp_rotation_step_finding, bad_rows, llamacpp_statuses, statuses)
