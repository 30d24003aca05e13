"""Shared test fixtures (tests/ and every family folder's test, harness/families/<name>/).

The helpers a test imports are ``harness.testing``.

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


@pytest.fixture(scope="session")
def policy():
    from harness.policy import load_policy

    return load_policy()


@pytest.fixture
def need_llamacpp():
    from harness.references.llamacpp.capture import available

    if not available():
        if os.environ.get("CONFORMANCE_ALLOW_NO_LLAMACPP") == "1":
            pytest.skip("llama-cpp-python missing and CONFORMANCE_ALLOW_NO_LLAMACPP=1")
        pytest.fail("llama-cpp-python is not installed; install with pip install -e '.[llamacpp]' "
                    "or opt out explicitly with CONFORMANCE_ALLOW_NO_LLAMACPP=1")


@pytest.fixture
def need_mlx():
    """The third reference (mlx-lm, the extra ``mlx``): installed by scripts/setup.sh, so a
    test that needs it FAILS where it is missing, as llama.cpp's do -- unless the user opts
    out with CONFORMANCE_ALLOW_NO_MLX=1 (a platform MLX has no wheel for)."""
    from harness.references import get

    if not get("mlx").available():
        if os.environ.get("CONFORMANCE_ALLOW_NO_MLX") == "1":
            pytest.skip("mlx-lm missing and CONFORMANCE_ALLOW_NO_MLX=1")
        pytest.fail("mlx-lm is not installed; install with pip install -e '.[mlx]' "
                    "or opt out explicitly with CONFORMANCE_ALLOW_NO_MLX=1")
