"""Shared test fixtures.

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


def run(policy, **kw):
    """Run one case in-process; return its rows."""
    from harness.case import Case, run_case

    kw.setdefault("overrides", ())
    kw["overrides"] = tuple(tuple(x) for x in kw["overrides"])
    rows, _ = run_case(Case(**kw), policy)
    return rows


def case_run(policy, family, **kw):
    """One case of ``family`` as a ``harness.case.CaseRun`` (its model, layer
    configs and captures, built on demand)."""
    from harness.case import Case, CaseRun

    return CaseRun(Case(family=family, **kw), policy)


def statuses(rows, candidate="impl"):
    return {(r["reference"], r["layer"], r["probe"]): r["status"] for r in rows if r["candidate"] == candidate}


def bad_rows(rows, ok=None):
    """(candidate, reference, layer, probe, reason) of every row that fails or
    errors -- or, given ``ok``, of every row whose status is not in it."""
    return [(r["candidate"], r["reference"], r["layer"], r["probe"], r["reason"]) for r in rows
            if (r["status"] not in ok if ok is not None else r["status"] in ("fail", "error"))]


def all_statuses(rows):
    """{(candidate, reference, layer, probe): status} over every row."""
    return {(r["candidate"], r["reference"], r["layer"], r["probe"]): r["status"] for r in rows}


def llamacpp_statuses(rows):
    """A case with an HF-only setting, run against both references: impl passes
    every probe against HF and no row fails or errors (llama.cpp's disagreement is
    a finding); returns impl's statuses against llama.cpp, {(layer, probe): status}."""
    st = statuses(rows)
    hf = {k: v for k, v in st.items() if k[0] == "hf"}
    assert hf and all(v == "pass" for v in hf.values()), hf
    assert not [r for r in rows if r["status"] in ("fail", "error")]
    return {(layer, probe): v for (ref, layer, probe), v in st.items() if ref == "llamacpp"}


def assert_llamacpp_rotation_step_finding(rows, layer=1, before="k", ref_vs_ref=True):
    """An HF setting that changes which layers rotate, where llama.cpp's step is
    fixed at 4 (afmoe, smollm3, llama4): only ``layer`` differs -- its ``before``
    probe still agrees, its q_rope is a finding (and so llama.cpp's against HF's,
    with ``ref_vs_ref``); impl passes against HF everywhere."""
    st = all_statuses(rows)
    assert all(s == "pass" for (c, ref, _, _), s in st.items() if c == "impl" and ref == "hf")
    assert all(s == "pass" for (c, ref, i, _), s in st.items() if c == "impl" and i != layer and i >= 0)
    assert st[("impl", "llamacpp", layer, before)] == "pass"
    assert st[("impl", "llamacpp", layer, "q_rope")] == "finding"
    if ref_vs_ref:
        assert st[("llamacpp", "hf", layer, "q_rope")] == "finding"
    assert not [k for k, s in st.items() if s in ("fail", "error")]


def assert_llamacpp_fails_first_at_q(st):
    """A converter step switched off (a Q/K permutation, a QKV reorder): HF is
    untouched, everything before q agrees with llama.cpp, and q is the first
    divergence. ``st``: ``all_statuses``."""
    assert st[("impl", "hf", 0, "q")] == "pass"
    assert st[("impl", "llamacpp", 0, "attn_in")] == "pass"
    assert st[("impl", "llamacpp", 0, "q")] == "fail"


def finding(pol, family, candidate, reference, probe, overrides=None, layer=0, nmse=1e-6, layer_kind="attention",
            tokens=16):
    """``Policy.finding`` on the HF config the family builds with ``overrides`` (findings
    match the reference's own config, never impl's feature tags), in a case of
    ``tokens`` tokens (the default case's 16: some bounds scale with it)."""
    from harness.families import get

    config = get(family).make_config(dict(overrides or {}))
    return pol.finding(family, candidate, reference, probe, layer_kind, config, layer=layer, nmse=nmse,
                       tokens=tokens, n_layers=getattr(config, "num_hidden_layers", None))
