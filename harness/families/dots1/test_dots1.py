"""dots1: three-way on dots.llm1's attention (per-head QK norm, MHA) with a dense
first layer and sigmoid-routed experts; the window HF applies and llama.cpp's
graph lacks, on both sides (no layer slides: agree; a layer slides past its
window: a finding, impl held to HF); the converter's gating key."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.mutants import applied, registry
from harness.testing import HF_AND_LLAMACPP, all_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")

WINDOW_5 = (("max_window_layers", 1), ("sliding_window", 5))


def test_three_way_passes(run, policy):
    # paged here; decode and batched run in the default matrix (families = "*")
    st = all_statuses(run(policy, family="dots1", ref=HF_AND_LLAMACPP, kv="paged"))
    assert st and all(s == "pass" for s in st.values()), [k for k, s in st.items() if s != "pass"][:4]


def test_the_window_is_hf_s_max_window_layers():
    fam = get("dots1")
    assert [lc.window for lc in fam.layer_configs(fam.make_config({}))] == [None, None]
    sizes = [lc.window and lc.window.size for lc in fam.layer_configs(fam.make_config(dict(WINDOW_5)))]
    assert sizes == [None, 5]  # Dots1Config.__post_init__: layers i >= max_window_layers slide


def test_a_window_the_sequence_reaches_is_a_finding_against_llamacpp(run, policy):
    st = all_statuses(run(policy, family="dots1", ref=HF_AND_LLAMACPP, kv="decode", overrides=WINDOW_5))
    assert all(s == "pass" for (c, r, *_), s in st.items() if (c, r) == ("impl", "hf"))  # impl is HF's
    assert st[("llamacpp", "hf", 0, "layer_out")] == "pass"  # layer 0 is full attention
    assert st[("llamacpp", "hf", 1, "q_rope")] == "pass"
    assert st[("llamacpp", "hf", 1, "attn_probs")] == "finding"
    assert st[("impl", "llamacpp", 1, "attn_probs")] == "finding"


def test_the_window_finding_needs_its_setting(finding):
    from harness.policy import load_policy

    pol = load_policy()
    fam = get("dots1")
    assert finding(pol, "dots1", "llamacpp", "hf", "attn_probs", dict(WINDOW_5), nmse=0.3, layer=1)
    assert not finding(pol, "dots1", "llamacpp", "hf", "attn_probs", {}, nmse=0.3, layer=1)
    # a window on no layer (max_window_layers = the depth) excuses nothing
    assert not finding(pol, "dots1", "llamacpp", "hf", "attn_probs",
                       {"max_window_layers": fam.tiny["num_hidden_layers"]}, nmse=0.3, layer=1)


def _refused(cli_main, capsys, *args):
    rc = cli_main(["run", "--family", "dots1", "--ref", "llamacpp", *args])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_without_the_sigmoid_scoring_key_llamacpp_is_refused(cli_main, run, policy, capsys):
    # the converter writes expert_gating_func only from config.json's scoring_func; without
    # it dots1.cpp keeps gating NONE and build_moe_ffn aborts -- refused in one line, HF runs
    assert "scoring_func None" in _refused(cli_main, capsys, "--set", "scoring_func=null")
    st = all_statuses(run(policy, family="dots1", ref="hf", overrides=(("scoring_func", None),)))
    assert st and all(s == "pass" for s in st.values())


def test_gqa_is_refused_against_llamacpp(cli_main, capsys):
    assert "MHA only" in _refused(cli_main, capsys, "--set", "num_key_value_heads=2")


def test_a_dropped_expert_bias_fails_between_the_references(run, policy, monkeypatch):
    fam = get("dots1")
    cls = type(fam)

    def zeroed(name, data, config, variant=None):
        for n, d in cls.gguf_convert(fam, name, data, config, variant):
            yield n, (d * 0 if "e_score_correction" in n else d)

    monkeypatch.setattr(fam, "gguf_convert", zeroed)
    st = all_statuses(run(policy, family="dots1", ref=HF_AND_LLAMACPP, kv="decode"))
    assert st[("llamacpp", "hf", 0, "layer_out")] == "pass" and st[("llamacpp", "hf", 1, "layer_out")] == "fail"


def test_a_broken_qk_norm_fails(run, policy):
    with applied(registry()["k-norm-takes-q-weight"]):
        st = all_statuses(run(policy, family="dots1", ref="llamacpp", kv="decode"))
    assert st[("impl", "llamacpp", 0, "q_rope")] == "pass" and st[("impl", "llamacpp", 0, "k_rope")] == "fail"


def test_a_window_off_by_one_fails_against_hf(run, policy):
    with applied(registry()["window-off-by-one"]):
        st = all_statuses(run(policy, family="dots1", ref="hf", kv="decode", overrides=WINDOW_5))
    assert st[("impl", "hf", 0, "attn_probs")] == "pass" and st[("impl", "hf", 1, "attn_probs")] == "fail"
