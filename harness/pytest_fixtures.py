"""What runs a case, for the tests: ``run`` / ``case_run`` / ``finding`` and the DSA
indexer checks, as functions (tests/ imports them) and as pytest fixtures of the same
names, with ``cli_main`` (``harness.cli.main``), ``gguf_export`` and ``gguf_import``
(harness/pipeline/gguf/: export, reader).

Why fixtures: a family folder (harness/families/<name>/) sits below the pipeline
(import-linter's layers contract pipeline > families > gguf, and no cycle between the
harness's packages), and its own test lives in the folder -- so the test asks pytest for
what runs its cases instead of importing it, and the folder holds no arrow back up. The
pure row helpers (``all_statuses``, ``bad_rows``, ``HF_AND_LLAMACPP``, ...) import nothing
above the families and stay ``harness.testing``'s. The repository's root conftest.py
registers this module (``pytest_plugins``); a plug-in family's package does the same in
its own conftest.py (docs/how-to/add-a-family.md)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from . import cli, references
from .case import Case, CaseRun, run_case
from .families import get
from .pipeline.gguf import export as _gguf_export
from .pipeline.gguf import reader as _gguf_reader
from .policy import load_policy
from .references.llamacpp.capture import available as llamacpp_available
from .testing import HF_AND_LLAMACPP, bad_rows


def run(policy, **kw):
    """Run one case in-process; return its rows."""
    kw.setdefault("overrides", ())
    kw["overrides"] = tuple(tuple(x) for x in kw["overrides"])
    rows, _ = run_case(Case(**kw), policy)
    return rows


def case_run(policy, family, **kw):
    """One case of ``family`` as a ``harness.case.CaseRun`` (its model, layer
    configs and captures, built on demand)."""
    return CaseRun(Case(family=family, **kw), policy)


def finding(pol, family, candidate, reference, probe, overrides=None, layer=0, nmse=1e-6, layer_kind="attention",
            tokens=16, chunks=None):
    """``Policy.finding`` on the HF config the family builds with ``overrides`` (findings
    match the reference's own config, never impl's feature tags), in a case of
    ``tokens`` tokens (the default case's 16: some bounds scale with it), fed ``chunks``
    rows per call (one tuple per sequence; default one call of all ``tokens``)."""
    fam = get(family)
    config = fam.make_config(dict(overrides or {}))
    return pol.finding(family, candidate, reference, probe, layer_kind, config, layer=layer, nmse=nmse,
                       tokens=tokens, n_layers=getattr(config, "num_hidden_layers", None),
                       chunks=chunks if chunks is not None else ((tokens,),),
                       family_values=fam.finding_values(config))


def assert_dsa_indexer_active(policy, family, topk=8):
    """A DSA family (glm-dsa.cpp, deepseek32.cpp; HF's ``*Indexer``) at
    ``index_topk`` below the 16-token default: from position ``topk`` on each query
    keeps ``topk`` keys in both references, which agree; impl has no indexer, so its
    ``mla_dsa`` layers are not implemented (no impl row passes or fails there)."""
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
    probs = case_run(policy, family).capture("hf").probes["L1.attn_probs"][0]
    assert ((probs > 0).sum(-1) == np.arange(1, probs.shape[-1] + 1)).all()


# -- the fixtures: the policy, the references a test needs (they FAIL where missing: a CI run
# whose llama.cpp comparisons were all skipped would prove nothing), and each of the above or
# a module above the families

@pytest.fixture(scope="session")
def policy():
    """The tolerance policy (fixtures/tolerance.toml with every family's findings), once a session."""
    return load_policy()


@pytest.fixture
def need_llamacpp():
    if not llamacpp_available():
        if os.environ.get("CONFORMANCE_ALLOW_NO_LLAMACPP") == "1":
            pytest.skip("llama-cpp-python missing and CONFORMANCE_ALLOW_NO_LLAMACPP=1")
        pytest.fail("llama-cpp-python is not installed; install with pip install -e '.[llamacpp]' "
                    "or opt out explicitly with CONFORMANCE_ALLOW_NO_LLAMACPP=1")


@pytest.fixture
def need_mlx():
    """The third reference (mlx-lm, the extra ``mlx``): installed by scripts/setup.sh, so a
    test that needs it FAILS where it is missing, as llama.cpp's do -- unless the user opts
    out with CONFORMANCE_ALLOW_NO_MLX=1 (a platform MLX has no wheel for)."""
    if not references.get("mlx").available():
        if os.environ.get("CONFORMANCE_ALLOW_NO_MLX") == "1":
            pytest.skip("mlx-lm missing and CONFORMANCE_ALLOW_NO_MLX=1")
        pytest.fail("mlx-lm is not installed; install with pip install -e '.[mlx]' "
                    "or opt out explicitly with CONFORMANCE_ALLOW_NO_MLX=1")


def _handing(value, name: str, doc: str):
    """A fixture named ``name`` that hands the test ``value`` (a function or a module)."""
    def fixture():
        return value

    fixture.__doc__ = doc
    return pytest.fixture(name=name)(fixture)


_run_fixture = _handing(run, "run", run.__doc__)
_case_run_fixture = _handing(case_run, "case_run", case_run.__doc__)
_finding_fixture = _handing(finding, "finding", finding.__doc__)
_dsa_active_fixture = _handing(assert_dsa_indexer_active, "assert_dsa_indexer_active", assert_dsa_indexer_active.__doc__)
_dsa_inert_fixture = _handing(assert_dsa_indexer_inert, "assert_dsa_indexer_inert", assert_dsa_indexer_inert.__doc__)
_cli_fixture = _handing(cli.main, "cli_main", "``harness.cli.main``: the command line in-process "
                        "(``cli_main([\"run\", ...])`` -> exit status).")
_export_fixture = _handing(_gguf_export, "gguf_export",
                           "harness/pipeline/gguf/export.py: a family's model written as the converter writes it.")
_import_fixture = _handing(_gguf_reader, "gguf_import",
                           "harness/pipeline/gguf/reader.py: a GGUF read back into a family's HF model (``--gguf``).")
