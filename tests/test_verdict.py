"""The verdict rules (README "Verdict rules", harness/verdict.py): every guard
fires where it should -- an unguarded finding, a layer nobody checked, a case
with no impl layer, a finding past its measured size, a probe impl stopped
emitting, a bug at bfloat16, a non-finite oracle -- and float64 means float64."""

from __future__ import annotations


import numpy as np
import pytest

from conftest import all_statuses, run
from harness.compare import judge_against_oracle, metrics
from harness.errors import UsageError
from harness.mutants import applied, registry
from harness.policy import DEFAULT_POLICY, load_policy
from harness.verdict import FAILING, expected_probes, guard
from harness.testing import HF_AND_LLAMACPP


def _case_status(rows):
    from harness.views import case_status

    return case_status(r["status"] for r in rows)


def test_a_finding_with_no_other_reference_is_unguarded(policy, need_llamacpp):
    """gemma3's query_pre_attn_scalar finding excuses impl vs llama.cpp; with HF in the
    case it is a finding (HF passes impl there), against llama.cpp alone it guards nothing."""
    over = (("query_pre_attn_scalar", 256),)
    both = all_statuses(run(policy, family="gemma3", ref=HF_AND_LLAMACPP, overrides=over))
    assert both[("impl", "llamacpp", 0, "attn_probs")] == "finding"
    assert both[("impl", "hf", 0, "attn_probs")] == "pass"
    alone = run(policy, family="gemma3", ref="llamacpp", overrides=over)
    st = all_statuses(alone)
    assert st[("impl", "llamacpp", 0, "attn_probs")] == "unguarded"
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass"  # before the scale they agree: nothing to excuse
    assert st[("impl", "-", 0, "attn_out")] == "unguarded"  # and the layer itself is unchecked
    assert _case_status(alone) == "unguarded"


def test_a_case_with_no_impl_layer_is_unguarded(policy, need_llamacpp):
    """glm-dsa with index_topk below the length: impl has no indexer, every layer is
    not-implemented, and passing HF-vs-llama.cpp rows must not make the case pass."""
    rows = run(policy, family="glm_moe_dsa", ref=HF_AND_LLAMACPP, kv="paged", overrides=(("index_topk", 8),))
    assert any(r["candidate"] == "llamacpp" and r["status"] == "pass" for r in rows)
    assert not any(r["candidate"] == "impl" and r["status"] == "pass" for r in rows)
    assert [r for r in rows if r["status"] == "unguarded" and r["probe"] == "*"]
    assert _case_status(rows) == "unguarded"


def test_a_finding_past_its_measured_size_fails(policy, need_llamacpp, tmp_path, monkeypatch):
    """The same disagreement, but the finding's max_nmse below what it measures: not excused.
    The finding is gemma3's own (harness/families/gemma3/findings.toml): its seen_by --
    impl against llama.cpp -- is tightened in a copy of the family's file."""
    import harness.policy as pol

    real = pol.family_finding_files()
    g3 = next(f for f in real if f.parent.name == "gemma3")
    text = g3.read_text()
    head, _, seen = text.partition("[finding.seen_by]\n")
    block, sep, rest = seen.partition("\n\n")
    assert "max_nmse = 1 " in block
    block = block.replace("max_nmse = 1 ", "max_nmse = 1e-3 ", 1)
    # and without its per-token bound (2 x tokens: what any softmax change can reach)
    block = "\n".join(line for line in block.split("\n") if not line.startswith("max_nmse_per_token"))
    (tmp_path / "gemma3").mkdir()
    tight = tmp_path / "gemma3" / "findings.toml"
    tight.write_text(head + "[finding.seen_by]\n" + block + sep + rest)
    monkeypatch.setattr(pol, "family_finding_files", lambda: [tight if f == g3 else f for f in real])
    st = all_statuses(run(load_policy(), family="gemma3", ref=HF_AND_LLAMACPP, overrides=(("query_pre_attn_scalar", 256),)))
    assert st[("impl", "llamacpp", 0, "attn_probs")] == "fail"  # nmse ~0.14 > 1e-3
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass"


def test_an_impl_finding_must_be_bounded(tmp_path):
    text = DEFAULT_POLICY.read_text() + '''
[[finding]]
family = "llama"
candidate = "impl"
reference = "llamacpp"
probes = ["q"]
reason = "no measured size"
'''
    p = tmp_path / "unbounded.toml"
    p.write_text(text)
    with pytest.raises(UsageError, match="needs config .*probes and max_nmse"):
        load_policy(p)


def test_a_probe_impl_stops_emitting_is_missing(policy, monkeypatch):
    from impl import trace

    put = trace.Trace.put
    monkeypatch.setattr(trace.Trace, "put", lambda self, name, a: None if name == "attn_heads" else put(self, name, a))
    rows = run(policy, family="llama", ref="hf")
    st = all_statuses(rows)
    assert st[("impl", "hf", 0, "attn_heads")] == "missing" and st[("impl", "hf", 1, "attn_heads")] == "missing"
    assert st[("impl", "hf", 0, "attn_out")] == "pass"
    assert _case_status(rows) == "missing"


def test_expected_probes_follow_the_layer_kind():
    from harness.case import Case, CaseRun

    lcs = CaseRun(Case(family="deepseek_v2", variant="absorbed"), load_policy()).layer_cfgs
    ps = expected_probes(lcs[0])
    assert {"q_latent", "kv_latent", "q_pe", "k_pe", "q_absorbed", "attn_out", "resid_mid"} <= set(ps)
    assert "k_rope" not in ps  # the absorbed form has no per-head key
    lcs = CaseRun(Case(family="cohere2"), load_policy()).layer_cfgs
    assert "resid_mid" not in expected_probes(lcs[0])  # a parallel block has no residual between


@pytest.mark.parametrize("name", ["scale-squared", "gqa-head-map", "rope-layout-swapped"])
def test_a_bug_at_bfloat16_fails_against_the_hf_oracle(policy, name):
    """At bfloat16 impl is judged against HF's own float64 run (not an impl oracle, which
    would share the bug): a gross bug fails there."""
    m = registry()[name]
    kw = dict(m.case, ref="hf", backend="torch", dtype="bfloat16")
    clean = run(policy, **kw)
    assert not [r for r in clean if r["status"] in FAILING]
    with applied(m):
        rows = run(policy, **kw)
    bad = [r for r in rows if r["candidate"] == "impl" and r["status"] in FAILING]
    assert bad and all(r.get("nmse_ref_oracle") is not None for r in bad if r["status"] == "fail")


def test_float64_means_float64(policy):
    """impl at float64 against HF at float64: judged at float64 (HF's float32 side paths
    promoted), so a norm epsilon of 1e-5 for 1e-6 fails -- and it fails at float32
    too, through the oracle."""
    rows = run(policy, family="llama", ref="hf", dtype="float64")
    impl = [r for r in rows if r["candidate"] == "impl" and r.get("nmse") is not None]
    assert impl and {r["cmp_dtype"] for r in impl} == {"float64"}
    assert max(r["nmse"] for r in impl) < 1e-26  # measured ~4e-31
    eps = registry()["norm-eps-tenfold"]
    for dtype in ("float64", "float32"):
        with applied(eps):
            bad = [r for r in run(policy, family="llama", ref="hf", dtype=dtype) if r["status"] == "fail"]
        assert bad and bad[0]["probe"] in ("attn_in", "q", "k", "v"), dtype


def test_the_oracle_path_fails_a_non_finite_reference_and_reports_its_bound():
    tol = {"ratio": 4.0, "nmse_floor": 1e-5, "nmse": 1e-2, "atol": 1.0}
    good = np.ones((2, 3))
    ref = good.copy()
    ref[0, 1] = np.nan
    status, reason, allowed = judge_against_oracle(metrics(good, good), metrics(ref, good), tol)
    assert status == "fail" and "reference" in reason
    status, _, allowed = judge_against_oracle(metrics(good, good), metrics(good * 1.001, good), tol)
    assert status == "pass" and allowed == 4.0 * max(1e-6, 1e-5)
    # the dtype's own bound caps the ratio: a reference far off does not widen the allowance past it
    status, reason, allowed = judge_against_oracle(metrics(good * 1.5, good), metrics(good * 1.4, good), tol)
    assert status == "fail" and allowed == 1e-2 and "the dtype's bound" in reason


def test_guard_is_per_candidate_and_reference_rows_guard_nothing():
    from impl import LayerConfig

    lc = LayerConfig(hidden_size=8, n_heads=2, n_kv_heads=1, head_dim=4)

    def row(cand, ref, probe, status):
        return {"candidate": cand, "reference": ref, "layer": 0, "probe": probe, "status": status, "reason": "r"}

    rows = [row("llamacpp", "hf", "attn_out", "pass"), row("impl", "hf", "attn_out", "not-exposed")]
    out = guard(rows, [lc], "impl", lambda layer, probe, reason: row("impl", "-", probe, "unguarded"))
    assert out[-1]["status"] == "unguarded"
    out = guard([row("impl", "hf", "attn_out", "pass")], [lc], "impl", lambda *a: pytest.fail("guarded"))
    assert len(out) == 1
    # a reference that sat the case out (Reference.schedule_refusal: a skipped row of its own)
    # decides nothing: the layer still needs a passing attn_out against another reference;
    # a case skipped as a whole (a device absent: reference "-") already says why
    sat_out = [row("impl", "hf_cached", "*", "skipped"), row("impl", "hf", "attn_out", "fail")]
    assert guard(sat_out[:1], [lc], "impl", lambda layer, probe, reason: row("impl", "-", probe, "unguarded"))[-1][
        "status"] == "unguarded"
    assert len(guard(sat_out, [lc], "impl", lambda *a: pytest.fail("a failing row already says it"))) == 2
    assert len(guard([row("impl", "-", "", "skipped")], [lc], "impl", lambda *a: pytest.fail("skipped"))) == 1


def test_a_structural_finding_scales_with_length_and_ne_needs_a_value():
    """A mask one reference lacks (or rotation angles it does not use) grows with the
    sequence: max_nmse_per_token bounds it by the case's tokens (attn_probs' exact
    2-per-token worst case), so the excuse holds at any length and still refuses more."""
    from harness.policy import config_matches

    pol = load_policy()
    f = next(f for f in pol.findings if f["family"] == "qwen2" and f["candidate"] == "impl")
    assert pol.finding_bound(f, 2) == 4 and pol.finding_bound(f, 128) == 256
    kw = dict(config={"use_sliding_window": True}, layer=0)
    # measured (fixtures/tolerance.toml header): 1.05 at 2 tokens, 13.8 at 128
    assert pol.finding("qwen2", "impl", "llamacpp", "attn_heads", "attention", nmse=1.05, tokens=2, **kw)
    assert pol.finding("qwen2", "impl", "llamacpp", "attn_probs", "attention", nmse=13.8, tokens=128, **kw)
    assert not pol.finding("qwen2", "impl", "llamacpp", "attn_probs", "attention", nmse=5.0, tokens=2, **kw)
    # { ne = 32.0 }: present and different; absent (HF's default is 32 too) matches nothing
    cond = {"rope_parameters.beta_fast": {"ne": 32.0}}
    assert config_matches({"rope_parameters": {"beta_fast": 8.0}}, cond)
    assert not config_matches({"rope_parameters": {"beta_fast": 32.0}}, cond)
    assert not config_matches({"rope_parameters": {}}, cond)


def test_a_finding_that_grows_with_the_calls_holds_up_to_the_length_measured():
    """tokens_at_most: minimax's bfloat16 findings (HF's cached bfloat16 decay per row,
    modeling_minimax.py:246 / :254; the routing flips) grow with the calls faster than a
    per-token bound says, so they hold up to the length they were measured at and no
    further -- and only between the references, at bfloat16."""
    pol = load_policy()
    kw = dict(config={"model_type": "minimax"}, layer=3, dtype="bfloat16")
    decay = "llamacpp", "hf_cached", "state_rec", "lightning"
    assert "modeling_minimax.py:246" in pol.finding("minimax", *decay, nmse=1.85e-2, tokens=128, **kw)
    assert not pol.finding("minimax", *decay, nmse=1.85e-2, tokens=129, **kw)  # past the length measured
    assert not pol.finding("minimax", *decay, nmse=0.07, tokens=128, **kw)  # past the size
    assert not pol.finding("minimax", *decay, nmse=1.85e-2, tokens=128, **{**kw, "dtype": "float32"})
    assert not pol.finding("minimax", "impl", "hf_cached", "state_rec", "lightning", nmse=1.85e-2, tokens=128, **kw)
    # HF's full forward keeps its float32-made decay tables: llama.cpp vs hf is no decay finding
    assert not pol.finding("minimax", "llamacpp", "hf", "rec_out", "lightning", nmse=1.85e-2, tokens=128, **kw)
    # the routing flips: from an MoE's output on, up to 64 tokens
    flip = dict(kw, layer=6)
    assert "routing flip" in pol.finding("minimax", "llamacpp", "hf", "rec_out", "lightning", nmse=4.5e-2, tokens=64,
                                         **flip)
    assert not pol.finding("minimax", "llamacpp", "hf", "rec_out", "lightning", nmse=4.5e-2, tokens=65, **flip)
    assert not pol.finding("minimax", "llamacpp", "hf", "rec_out", "lightning", nmse=4.5e-2, tokens=64,
                           **dict(flip, layer=0))  # before the first MoE output: nothing to flip yet
    from harness.policy import _check_finding

    for bad in (0, True, "64", 6.5):
        with pytest.raises(UsageError, match="tokens_at_most must be an integer >= 1"):
            _check_finding("p.toml", "x", {"family": "minimax", "candidate": "hf_cached", "reference": "hf",
                                           "reason": "r", "max_nmse": 1, "tokens_at_most": bad})


def test_the_yarn_band_finding_excuses_llamacpp_not_an_impl_rope_bug(policy, need_llamacpp):
    """gpt_oss with beta_fast=8 (fuzz, 2026-11-30): llama.cpp's openai-moe never reads
    the key, so impl (= HF) vs llama.cpp is a finding from L0 q_rope on, impl vs HF
    passes; with impl's RoPE broken, impl vs HF fails and the finding guards nothing."""
    over = (("head_dim", 32), ("num_attention_heads", 1), ("num_key_value_heads", 1),
            ("rope_parameters.beta_fast", 8.0), ("rope_parameters.factor", 2.0))
    kw = dict(family="gpt_oss", ref=HF_AND_LLAMACPP, backend="numpy", dtype="float32", kv="decode", tokens=9, overrides=over)
    st = all_statuses(run(policy, **kw))
    assert st[("impl", "llamacpp", 0, "q_rope")] == "finding"
    assert st[("llamacpp", "hf", 0, "q_rope")] == "finding"
    assert st[("impl", "hf", 0, "q_rope")] == "pass"
    with applied(registry()["rope-position-off-by-one"]):
        broken = run(policy, **kw)
    assert _case_status(broken) not in ("pass", "finding")


def test_a_per_layer_finding_grows_with_depth():
    """ggml's fp16 GELU table adds its rounding in every FFN, and a free-running
    reference carries it on: the bound is per layer the probe is past, so a deep
    real checkpoint is not a false alarm and a shallow gap past it still is."""
    pol = load_policy()
    f = next(f for f in pol.findings if f["family"] == "gemma3" and "max_nmse_per_layer" in f)
    assert pol.finding_bound(f, 16, 1) == pytest.approx(5e-7) and pol.finding_bound(f, 16, 26) == pytest.approx(1.3e-5)
    kw = dict(config={}, nmse=1.2e-7, tokens=16, n_layers=4)
    assert pol.finding("gemma3", "llamacpp", "hf", "logits", "attention", layer=None, **kw)
    assert pol.finding("gemma3", "llamacpp", "hf", "layer_out", "attention", layer=3, **kw)
    assert not pol.finding("gemma3", "llamacpp", "hf", "layer_out", "attention", layer=0,
                           **dict(kw, nmse=1e-6))


@pytest.mark.parametrize("line", ['max_nmse_per_token = "2"', "max_nmse_per_layer = -1.0", "max_nmse = nan"])
def test_a_finding_bound_that_is_not_a_positive_number_is_refused(tmp_path, line):
    text = DEFAULT_POLICY.read_text() + f'''
[[finding]]
family = "llama"
candidate = "llamacpp"
reference = "hf"
{line}
reason = "a bad bound"
'''
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(UsageError, match="must be a positive number"):
        load_policy(p)



@pytest.mark.parametrize("family", ['""', "[]", '["qwen2", 3]', "7"])
def test_a_finding_family_that_is_not_names_is_refused(tmp_path, family):
    p = tmp_path / "bad.toml"
    p.write_text(DEFAULT_POLICY.read_text() + f'''
[[finding]]
family = {family}
candidate = "llamacpp"
reference = "hf"
reason = "a bad family"
''')
    with pytest.raises(UsageError, match="family must be a family name or a list"):
        load_policy(p)


def test_a_finding_for_several_families_excuses_those_only():
    """The llama3-RoPE finding names every family whose converter writes no rope_freqs
    and whose llama.cpp graph reads none; llama and granite (LlamaModel converters,
    graphs that read rope_freqs) must agree with HF, so they are not excused."""
    from tests.conftest import finding

    pol = load_policy(DEFAULT_POLICY)
    l3 = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}
    for fam in ("qwen2", "olmo2", "starcoder2", "qwen3"):
        assert finding(pol, fam, "impl", "llamacpp", "q_rope", l3, nmse=0.9), fam
        assert finding(pol, fam, "llamacpp", "hf", "attn_out", l3, nmse=0.1), fam
        assert not finding(pol, fam, "impl", "llamacpp", "q_rope", None, nmse=0.9), fam  # default RoPE: none
    for fam in ("llama", "granite"):
        assert not finding(pol, fam, "impl", "llamacpp", "q_rope", l3, nmse=0.9), fam


def test_a_layer_config_finding_excuses_only_the_layers_it_names():
    """gemma2's mlx-lm window finding (impl vs mlx, teacher-forced: each layer on its own
    mlx input) holds on the sliding layers alone; before ``layer_config`` it excused the
    global ones too, and hid a dropped softcap there from ``mutate --ref mlx``."""
    pol = load_policy()
    cfg = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
    kw = dict(config=cfg, nmse=0.5, tokens=16)
    assert pol.finding("gemma2", "impl", "mlx", "attn_branch", "attention", layer=0, **kw)
    assert not pol.finding("gemma2", "impl", "mlx", "attn_branch", "attention", layer=1, **kw)
    assert not pol.finding("gemma2", "impl", "mlx", "attn_branch", "attention", layer=None, **kw)
    # the pair's own finding (mlx vs hf, free-running: layer 1 reads layer 0's output) is whole-model
    assert pol.finding("gemma2", "mlx", "hf", "attn_branch", "attention", layer=1, **kw)
