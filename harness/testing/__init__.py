"""Helpers for the harness's own tests -- and for a plug-in family's or
engine's: read a case's statuses, assert the shape of a known disagreement. Pure
functions over rows: nothing here imports above the families, so a family
folder's test imports them (``from harness.testing import all_statuses``). What
RUNS a case (``run``, ``case_run``, ``finding``) is harness/pytest_fixtures.py's,
which a family's test takes as fixtures; the other fixtures (``policy``,
``need_llamacpp``, the session capture cache) are the repository's root
``conftest.py``."""

from __future__ import annotations

# The references the harness's tests of HF against llama.cpp name: HF (fresh and through
# its own cache) and llama.cpp. ``--ref all`` grows as a reference joins it (mlx-lm did);
# these tests assert the rows of these three, and a witness that joins is judged by its
# own tests and matrix group (tests/test_mlx.py), so joining changes none of them. A
# reference among them that cannot run the case sits out in a row, as under ``all``.
HF_AND_LLAMACPP = "hf,hf_cached,llamacpp"


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
