"""Helpers for the harness's own tests -- and for a plug-in family's or
engine's: run one case in-process, read its statuses, assert the shape of a
known disagreement. The fixtures (``policy``, ``need_llamacpp``, the session
capture cache) are the repository's root ``conftest.py``; a family folder's
test imports these (``from harness.testing import run, statuses``)."""

from __future__ import annotations

# The references the harness's tests of HF against llama.cpp name: HF (fresh and through
# its own cache) and llama.cpp. ``--ref all`` grows as a reference joins it (mlx-lm did);
# these tests assert the rows of these three, and a witness that joins is judged by its
# own tests and matrix group (tests/test_mlx.py), so joining changes none of them. A
# reference among them that cannot run the case sits out in a row, as under ``all``.
HF_AND_LLAMACPP = "hf,hf_cached,llamacpp"


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
            tokens=16, chunks=None):
    """``Policy.finding`` on the HF config the family builds with ``overrides`` (findings
    match the reference's own config, never impl's feature tags), in a case of
    ``tokens`` tokens (the default case's 16: some bounds scale with it), fed ``chunks``
    rows per call (one tuple per sequence; default one call of all ``tokens``)."""
    from harness.families import get

    config = get(family).make_config(dict(overrides or {}))
    return pol.finding(family, candidate, reference, probe, layer_kind, config, layer=layer, nmse=nmse,
                       tokens=tokens, n_layers=getattr(config, "num_hidden_layers", None),
                       chunks=chunks if chunks is not None else ((tokens,),))


def assert_dsa_indexer_active(policy, family, topk=8):
    """A DSA family (glm-dsa.cpp, deepseek32.cpp; HF's ``*Indexer``) at
    ``index_topk`` below the 16-token default: from position ``topk`` on each query
    keeps ``topk`` keys in both references, which agree; impl has no indexer, so its
    ``mla_dsa`` layers are not implemented (no impl row passes or fails there)."""
    import numpy as np

    over = (("index_topk", topk),)
    rows = run(policy, family=family, ref=HF_AND_LLAMACPP, overrides=over)
    assert not bad_rows(rows)
    assert {r["layer_kind"] for r in rows if r["status"] == "not-implemented"} == {"mla_dsa"}
    assert {(0, "attn_probs"), (2, "attn_probs"), (-1, "logits")} <= {
        (r["layer"], r["probe"]) for r in rows if r["candidate"] == "llamacpp" and r["status"] == "pass"}
    # the indexer really dropped keys in HF's probabilities (what both references computed)
    cr = case_run(policy, family, overrides=over)
    kept = (cr.capture("hf").probes["L1.attn_probs"][0] > 0).sum(-1)  # [H, T]
    assert (kept[:, :topk] == np.arange(1, topk + 1)).all() and (kept[:, topk:] == topk).all()
    # ... and llama.cpp's probabilities drop the same keys (the choice is not causal-all)
    assert ((cr.capture("llamacpp").probes["L1.attn_probs"][0] > 0).sum(-1) == kept).all()


def assert_dsa_indexer_inert(policy, family):
    """At the default config (index_topk >= the case's tokens) every query keeps every
    causal key: the indexer changes nothing."""
    import numpy as np

    probs = case_run(policy, family).capture("hf").probes["L1.attn_probs"][0]
    assert ((probs > 0).sum(-1) == np.arange(1, probs.shape[-1] + 1)).all()
