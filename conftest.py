"""Shared test fixtures (tests/ and every family folder's test, harness/families/<name>/).

The helpers a test imports are ``harness.testing`` (pure, over rows); what runs a case
(``run``, ``case_run``, ``finding``, ``cli_main``, ``gguf_export``, ``gguf_import``) is
harness/pytest_fixtures.py's, registered here: a family folder's test takes them as
fixtures (the folder sits below the pipeline), tests/ may import them.

References are captured once per test session and reused: every test shares
one session cache directory (CONFORMANCE_CACHE), so the first test that needs
a family's HF or llama.cpp capture pays for it and the rest read it back.
Set CONFORMANCE_CACHE yourself to reuse captures across sessions.

llama.cpp: tests that need it FAIL when llama-cpp-python is missing -- a CI run
whose llama.cpp comparisons were all skipped would prove nothing -- unless the
user opts out explicitly with CONFORMANCE_ALLOW_NO_LLAMACPP=1.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["harness.pytest_fixtures"]


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory, worker_id):
    if "CONFORMANCE_CACHE" not in os.environ:
        # under pytest-xdist every worker has its own basetemp below one shared
        # root: put the cache there so the workers of one session share captures
        base = tmp_path_factory.getbasetemp()
        root = base.parent if worker_id != "master" else base
        d = root / "conformance-cache"
        d.mkdir(exist_ok=True)
        os.environ["CONFORMANCE_CACHE"] = str(d)
    yield


@pytest.fixture(scope="session")
def worker_id(request):
    """'master' without pytest-xdist (xdist overrides this fixture with gwN)."""
    return getattr(request.config, "workerinput", {}).get("workerid", "master")
