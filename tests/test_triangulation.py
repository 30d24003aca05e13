"""Whom the third reference follows where HF and llama.cpp disagree (issue 38;
harness/commands/triangulate.py): the verdict rule, a stored verdict measured
again, and a page with the column for every finding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands import triangulate
from harness.commands.divergences import DEFAULT_RUN, divergences

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("vs_ref,vs_cand,want", [
    ("pass", "fail", "HF"), ("fail", "pass", "llama.cpp"), ("fail", "finding", "neither"),
    ("pass", "pass", "both"), ("unguarded", "fail", "neither"),
])
def test_the_verdict_is_the_side_it_passes_against(vs_ref, vs_cand, want):
    assert triangulate.classify(vs_ref, vs_cand, "hf", "llamacpp") == want
    assert triangulate.classify("pass", "fail", "hf_cached", "llamacpp") == "HF (cached)"


def test_the_table_covers_every_finding_the_baseline_reached():
    """A finding added, or a baseline that reaches one more, without the table measured
    again fails here: the page would say "not reached" of a reached finding."""
    import pandas as pd

    from harness.policy import load_policy

    table = json.loads(triangulate.table_path("mlx").read_text())
    df = pd.read_parquet(DEFAULT_RUN / "rows.parquet")
    reasons = " ".join(df.loc[df["status"] == "finding", "reason"].astype(str))
    reached = {f["_n"] for f in load_policy().findings
               if f["candidate"] == "llamacpp" and f["reference"] in ("hf", "hf_cached")
               and f"finding {f['_n']}:" in reasons}
    assert reached and set(table["findings"]) == reached, sorted(reached ^ set(table["findings"]))
    verdicts = {e["verdict"] for e in table["findings"].values()}
    assert verdicts <= {"HF", "HF (cached)", "llama.cpp", "neither", "both", "not covered"}
    assert all(e.get("why") for e in table["findings"].values() if e["verdict"] == "not covered")
    assert all(e.get("at") for e in table["findings"].values() if e["verdict"] != "not covered")


def test_a_stored_verdict_is_measured_again(need_mlx, need_llamacpp):
    """afmoe's two findings re-run now: the same verdicts, at the same probes, as the table."""
    table = json.loads(triangulate.table_path("mlx").read_text())
    now = triangulate.measure(DEFAULT_RUN, "mlx", ["afmoe"])["findings"]
    assert now, "afmoe's findings are reached in the baseline"
    for label, e in now.items():
        stored = table["findings"][label]
        assert (e["verdict"], e.get("at")) == (stored["verdict"], stored.get("at")), (label, e, stored)


def test_the_page_has_the_witness_column_for_every_finding():
    page = divergences(DEFAULT_RUN)
    header = next(ln for ln in page.splitlines() if ln.startswith("| finding |"))
    assert " mlx computes |" in header  # the engines' columns after it (tests/test_triangulation_engines.py)
    rows = [ln for ln in page.splitlines() if ln.startswith("| `")]
    assert rows and all(ln.count("|") == header.count("|") for ln in rows)
    assert "measured on transformers" in page and "**mlx computes**" in page
    # mlx-lm's own divergences are findings with its source lines
    assert "**mlx-lm side**: `mlx_lm/models/glm.py" in page


def test_a_witness_that_is_not_one_is_refused_in_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "harness.cli", "divergences", "--triangulate", "llamacpp"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "not a witness; valid: mlx" in lines[0], p.stderr


def test_a_finding_holds_for_the_witness_in_the_place_of_the_side_it_follows(monkeypatch):
    """qwen2's sliding window (qwen2#1): llama.cpp applies none, and the triangulation
    measured mlx-lm computing llama.cpp's model there -- so impl vs mlx is excused by the
    finding's impl-vs-llama.cpp statement and mlx vs HF by its llama.cpp-vs-HF one, each
    saying so; mlx vs llama.cpp (which agree) is excused nothing. falcon_mamba#1, where mlx
    follows HF: mlx vs llama.cpp takes the finding, mlx vs HF nothing. A table measured on
    another mlx-lm release says nothing."""
    from harness import policy as pol_mod
    from harness.policy import load_policy

    pol = load_policy()
    cfg = {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1,
           "layer_types": ["full_attention", "sliding_attention"]}
    kw = dict(config=cfg, layer=1, nmse=0.3, tokens=16)
    why = pol.finding("qwen2", "impl", "mlx", "attn_heads", "attention", **kw)
    assert why and why.startswith("finding qwen2#1") and "held for mlx" in why, why
    assert pol.finding("qwen2", "mlx", "hf", "attn_heads", "attention", **kw)
    assert pol.finding("qwen2", "mlx", "hf_cached", "attn_heads", "attention", **kw)
    assert not pol.finding("qwen2", "mlx", "llamacpp", "attn_heads", "attention", **kw)

    kw = dict(config={"mixer_rms_eps": 1e-6, "layer_norm_epsilon": 1e-5}, layer=0, nmse=1e-9, tokens=16, n_layers=2)
    assert pol.finding("falcon_mamba", "mlx", "llamacpp", "resid_mid", "mamba", **kw)
    assert not pol.finding("falcon_mamba", "mlx", "hf", "resid_mid", "mamba", **kw)

    monkeypatch.setattr(pol_mod, "followed", lambda: {})
    assert not pol.finding("qwen2", "impl", "mlx", "attn_heads", "attention", config=cfg, layer=1, nmse=0.3,
                           tokens=16)


def test_a_finding_in_front_holds_for_the_witness_where_the_pair_sits_just_under_the_bound(policy):
    """Past the first probe a finding excuses, the pair's distance is that finding diluted
    by the residual, and may sit either side of the float32 bound: the CI fuzz's gpt_oss
    YaRN case (gpt_oss#2, beta_fast 8) had llama.cpp vs HF at L1 resid_mid 0.96 of the bound
    (a pass) and mlx vs llama.cpp at 1.007 -- mlx computing HF's model there (it passes
    against HF). The witness's row takes the finding excused in front of it, asked with its
    own numbers; with no finding in front (the pair excused only further on), it stays a
    failure."""
    from harness.pipeline.judge import Judge
    from harness.pytest_fixtures import case_run

    over = (("head_dim", 32), ("num_attention_heads", 1), ("num_key_value_heads", 1),
            ("rope_parameters.beta_fast", 8.0), ("rope_parameters.factor", 2.0), ("sliding_window", 1))
    j = Judge(case_run(policy, "gpt_oss", ref="all", kv="decode", schedule="prefill", tokens=2,
                       overrides=over).judge_request())
    found = "nmse 8e-10 > 1e-10 -- known disagreement: finding gpt_oss#2: YaRN beta_fast"

    def rows(excused_at):
        out = []
        for probe, pair, lc in (("attn_out", 8e-10, 8.2e-10), ("resid_mid", 9.6e-11, 1.007e-10)):
            st = "finding" if probe == excused_at else "pass"
            out += [j.row("llamacpp", "hf", 1, probe, st, found if st == "finding" else "", nmse=pair),
                    j.row("mlx", "hf", 1, probe, "pass", "", nmse=1e-13),
                    j.row("mlx", "llamacpp", 1, probe, "fail", f"nmse {lc:.3g} > 1e-10", nmse=lc)]
        return {(r["candidate"], r["reference"], r["probe"]): r for r in j.witnesses(out)}

    got = rows("attn_out")
    for probe in ("attn_out", "resid_mid"):
        r = got[("mlx", "llamacpp", probe)]
        assert r["status"] == "finding" and "gpt_oss#2" in r["reason"] and "held for mlx" in r["reason"], r
    assert got[("llamacpp", "hf", "resid_mid")]["status"] == "pass"
    got = rows("resid_mid")  # excused only at resid_mid: attn_out, in front of it, has nothing to hold
    assert got[("mlx", "llamacpp", "attn_out")]["status"] == "fail"
    assert got[("mlx", "llamacpp", "resid_mid")]["status"] == "finding"
