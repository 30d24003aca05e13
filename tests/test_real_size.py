"""Real sizes on tiny models (issue 13): HF in float64 module by module, probes
on disk compared layer by layer, ``--layers`` / ``--probes``, the memory plan
and its refusal, chunked metrics. The sizes themselves are measured by
scripts/bench_real_size.py, not by a timed test."""

from __future__ import annotations

import copy
import gc
import json
import weakref

import numpy as np
import pytest

from harness.pipeline import oracle as oracle_stage
from harness.pytest_fixtures import run
from harness.testing import HF_AND_LLAMACPP


def _case_run(family="llama", **kw):
    from harness.case import Case, CaseRun

    return CaseRun(Case(family=family, **kw), None)


# ----------------------------------------------------------------- float64, one module at a time
@pytest.mark.parametrize("family", ["llama", "gemma3", "bloom", "glm_moe_dsa", "deepseek_v2"])
def test_promoted_float64_is_the_float64_model_bit_for_bit(family):
    """HF computing in float64 on a float32 (or bfloat16) model, module by module
    (references/hf/float64.py ``promoted``), gives exactly what the whole model moved to
    float64 gives -- free-running and teacher-forced -- and leaves the weights as
    they were, dtype and bits."""
    import torch

    from harness.references.hf import capture as hf

    r = _case_run(family)
    fam, cfg, lcs, toks = r.family, r.config, r.layer_cfgs, r.tokens
    for held in (r.base_model, copy.deepcopy(r.base_model).to(torch.bfloat16)):
        before = {k: v.clone() for k, v in held.state_dict().items()}
        whole = copy.deepcopy(held).to(torch.float64)
        a = hf.capture(fam, whole, cfg, lcs, toks)
        b = hf.capture(fam, held, cfg, lcs, toks, float64=True)
        assert set(a) == set(b)
        for k in a:
            assert a[k].dtype == b[k].dtype == np.float64 and np.array_equal(a[k], b[k]), k
        forced = {k: v for k, v in hf.capture(fam, held, cfg, lcs, toks).items() if k.endswith(".layer_in")}
        fa = hf.capture(fam, whole, cfg, lcs, toks, force_inputs=forced)
        fb = hf.capture(fam, held, cfg, lcs, toks, force_inputs=forced, float64=True, model_probes=False)
        assert fb and all(np.array_equal(fa[k], fb[k]) for k in fb)
        after = held.state_dict()
        assert all(after[k].dtype == before[k].dtype and torch.equal(after[k], before[k]) for k in before)


# gemma3 at hidden 48: its embedding scale sqrt(48) is not a power of two, so a scaled
# table gathered in float32 and widened after would differ in the last bits (at 64 it is 8)
@pytest.mark.parametrize("family,overrides", [("llama", (("tie_word_embeddings", True),)),
                                              ("gemma3", (("hidden_size", 48),))])
def test_promoted_float64_cached_calls_keep_copies_bit_for_bit(family, overrides, monkeypatch):
    """HF's cached path in float64 (the hf_cached oracle: one forward per call,
    teacher-forced) on a float32 model is the float64 model's bit for bit, whether
    the widened weights are kept between calls (``float64_keep``, which a quantized
    --gguf run allows) or widened again each call; a plain lookup table (a tied
    llama vocabulary) is gathered, not widened, and gemma3's scaled one is widened;
    the weights come back as they were, the same Parameter objects."""
    import torch

    from harness.references.hf import capture as hf
    from harness.references.hf import float64 as f64

    hits = []
    real_get = f64._Kept.get
    def get(self, t):
        hit = real_get(self, t)
        hits.append(hit is not None)
        return hit

    monkeypatch.setattr(f64._Kept, "get", get)
    # call after call, as a family that does not declare layer_major runs it (the layer-by-layer
    # order widens each layer once and keeps nothing: tests/test_layer_major.py)
    from harness.references.hf import layer_major

    monkeypatch.setattr(layer_major, "applies", lambda *a: False)
    r = _case_run(family, overrides=overrides)
    fam, cfg, lcs, toks, held = r.family, r.config, r.layer_cfgs, r.tokens, r.base_model
    calls = [3] + [1] * (toks.shape[1] - 3)
    params = {k: (p, p.detach().clone()) for k, p in held.named_parameters()}
    whole = copy.deepcopy(held).to(torch.float64)
    forced = {k: v for k, v in hf.capture(fam, held, cfg, lcs, toks, calls=calls).items() if k.endswith(".layer_in")}
    want = hf.capture(fam, whole, cfg, lcs, toks, force_inputs=forced, calls=calls, model_probes=False)
    want_free = hf.capture(fam, whole, cfg, lcs, toks, calls=calls)  # the embeddings and logits too
    for keep in (0, 1 << 40):
        hits.clear()
        got = hf.capture(fam, held, cfg, lcs, toks, force_inputs=forced, float64=True, model_probes=False,
                         calls=calls, float64_keep=keep)
        free = hf.capture(fam, held, cfg, lcs, toks, float64=True, calls=calls, float64_keep=keep)
        for a, b in ((got, want), (free, want_free)):
            assert a and set(a) == set(b) and "embeddings" in want_free
            bad = [k for k in b if not (a[k].dtype == np.float64 and np.array_equal(a[k], b[k]))]
            assert not bad, (keep, bad[:4])
        assert any(hits) == (keep > 0)  # the copies were served from the second call on
        for k, (p, before) in params.items():
            now = dict(held.named_parameters())[k]
            assert now is p and now.dtype == before.dtype and torch.equal(now, before), k


def test_promoted_float64_holds_one_float64_layer_at_a_time():
    """The point of ``promoted``: during a float64 forward at most one decoder layer
    (and never the rest of the model's big modules) is in float64 at once."""
    import torch

    from harness.references.hf import capture as hf

    r = _case_run("llama", overrides=(("num_hidden_layers", 4),))
    model, layers = r.base_model, r.family.decoder_layers(r.base_model)
    seen = []

    def count(mod, args, kwargs):
        seen.append(sum(any(p.dtype == torch.float64 for p in lay.parameters()) for lay in layers))

    hs = [lay.register_forward_pre_hook(count, with_kwargs=True) for lay in layers]
    try:
        hf.capture(r.family, model, r.config, r.layer_cfgs, r.tokens, float64=True)
    finally:
        for h in hs:
            h.remove()
    assert seen == [1, 1, 1, 1]  # this layer, widened just before; the previous one narrowed back
    assert all(p.dtype == torch.float32 for p in model.parameters())


# ----------------------------------------------------------------- probes on disk
def test_store_keeps_values_exactly_and_narrows_only_where_exact(tmp_path):
    from harness.store import ProbeStore, StoreWriter

    f32 = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32).astype(np.float64)
    f64 = f32 + 1e-12
    w = StoreWriter(tmp_path / "s", keep=lambda k: k != "dropped")
    w.put("L0.q", f32)
    w.put("L0.k", f64)
    w.put("dropped", f64)
    assert np.array_equal(w["L0.q"], f32)  # readable before the commit (derived probes)
    st = w.commit({"m": 1})
    assert isinstance(st, ProbeStore) and sorted(st) == ["L0.k", "L0.q"] and st.meta == {"m": 1}
    assert st["L0.q"].dtype == np.float32 and np.array_equal(st["L0.q"], f32)
    assert st["L0.k"].dtype == np.float64 and np.array_equal(st["L0.k"], f64)
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_store_narrowing_is_checked_block_by_block(monkeypatch):
    """compact checks a float64 probe against its float32 narrowing a block at a time
    (a whole float64 copy of the logits was a capture's largest temporary); a value that
    is not a float32 in the LAST block still keeps the probe float64."""
    from harness import store

    monkeypatch.setattr(store, "_BLOCK", 7)
    a = np.random.default_rng(1).standard_normal((4, 9)).astype(np.float32).astype(np.float64)
    assert store.compact(a).dtype == np.float32 and np.array_equal(store.compact(a), a)
    b = a.copy()
    b[-1, -1] += 1e-12
    assert store.compact(b).dtype == np.float64
    assert store.compact(b[:, ::2]).dtype == np.float64  # a strided view: checked all the same
    assert store.compact(a[:, ::2]).dtype == np.float32


def test_llamacpp_probes_are_assembled_in_ggmls_float32():
    """The llama.cpp capture places ggml's float32 tensors into a float32 probe: a float64
    one doubled the logits (2 x 128 x 262144 at Gemma 3 270M's vocab: 0.5 GB), the
    270M-class batched run's peak. The values placed are the tensor's, exactly."""
    from harness.families._lc_capture import LcPoint
    from harness.references.llamacpp.capture import assemble

    calls = [[(0, 0, 0), (0, 0, 1)], [(0, 1, 0), (0, 1, 1)]]  # (token, position, sequence)
    rng = np.random.default_rng(0)
    arrays = {f"c{i}": rng.standard_normal((1, 1, 2, 5)).astype(np.float32) for i in range(2)}
    index = [{"name": "result_output", "call": i, "occ": 0, "key": f"c{i}", "op": "MUL_MAT"} for i in range(2)]
    out = assemble(arrays, index, calls, 2, 2, "result_output", LcPoint("result_output", "last", "rows"))
    assert out.dtype == np.float32 and out.shape == (2, 2, 5)
    assert np.array_equal(out[1, 0], arrays["c0"][0, 0, 1]) and np.array_equal(out[0, 1], arrays["c1"][0, 0, 0])


def test_a_capture_over_the_cache_limit_is_used_then_removed(tmp_path, monkeypatch):
    from harness import cache

    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path))
    monkeypatch.setenv("CONFORMANCE_CACHE_MAX_GB", str(1000 / 2**30))  # 1000 bytes
    small = cache.store("hf", "small", {"a": np.zeros(10)})
    big = cache.store("hf", "big", {"a": np.zeros(1000)})
    assert cache.load("hf", "small") is not None and cache.load("hf", "big") is None
    where = big.path
    assert where.is_dir() and np.array_equal(big["a"], np.zeros(1000))
    del big
    gc.collect()
    assert not where.exists() and small.path.is_dir()


def test_metrics_in_blocks_equal_metrics_whole(monkeypatch):
    from harness import compare

    rng = np.random.default_rng(1)
    ref = rng.standard_normal((2, 3, 50, 7))
    cand = ref + 1e-6 * rng.standard_normal(ref.shape)
    whole = compare.metrics(cand, ref, "attn_probs")
    monkeypatch.setattr(compare, "CHUNK", 13)
    blocks = compare.metrics(cand, ref, "attn_probs")
    assert blocks["worst"] == whole["worst"] and blocks["max_abs"] == whole["max_abs"]
    for k in ("nmse", "mean_abs", "rmse", "cosine", "max_rel"):
        assert blocks[k] == pytest.approx(whole[k], rel=1e-12), k
    bad = cand.copy()
    bad[1, 2, 40, 3] = np.nan
    m = compare.metrics(bad, ref, "attn_probs")
    assert not m["finite"] and m["worst"] == "seq=1,head=2,tok=40,key=3"
    assert compare.absmax(ref) == np.abs(ref).max()


def test_impl_is_compared_one_layer_at_a_time(policy, monkeypatch):
    """A layer's candidate probes are dropped once compared: when layer i runs, no
    array impl made for an earlier layer is alive (a run holds one layer beyond the
    weights; LayerCandidate.capture_layer)."""
    from harness.candidates import LayerCandidate

    alive: list = []
    orig = LayerCandidate.capture_layer
    leaks = []

    def tracked(self, run_, rc, i):
        gc.collect()
        leaks.append(sum(ref() is not None for ref in alive))
        out = orig(self, run_, rc, i)
        alive.extend(weakref.ref(v) for v in out.probes.values() if isinstance(v, np.ndarray))
        return out

    monkeypatch.setattr(LayerCandidate, "capture_layer", tracked)
    rows = run(policy, family="llama", ref="hf", overrides=(("num_hidden_layers", 3),))
    assert rows and all(r["status"] == "pass" for r in rows)
    assert len(leaks) == 3 and leaks == [0, 0, 0], leaks


# ----------------------------------------------------------------- --layers / --probes
@pytest.mark.usefixtures("need_llamacpp")
def test_layers_and_probes_restrict_every_side(policy):
    from harness.case import Case, CaseRun

    case = Case(family="llama", ref=HF_AND_LLAMACPP, layers="-1", probes="q_rope", overrides=(("num_hidden_layers", 3),))
    r = CaseRun(case, policy)
    rows = r.rows()
    assert rows and all(x["status"] == "pass" for x in rows), [x for x in rows if x["status"] != "pass"]
    impl = [x for x in rows if x["candidate"] == "impl"]
    assert {x["layer"] for x in impl} == {2}
    assert {x["probe"] for x in impl} == {"q_rope", "attn_out", "resid_mid"}
    hf, lc = r.capture("hf"), r.capture("llamacpp")
    for cap in (hf, lc, oracle_stage.forced(r, hf)):
        assert set(cap.probes) <= {"L2.layer_in", "L2.q_rope", "L2.attn_out", "L2.resid_mid"}, sorted(cap.probes)
        assert "L2.q_rope" in cap.probes
    # the oracle stopped after layer 2 and never computed logits
    assert "logits" not in oracle_stage.forced(r, hf).probes
    # and the selection is said where the rows are
    assert "layers=-1" in rows[0]["case_id"] and "probes=q_rope" in rows[0]["case_id"]


def test_a_layer_subset_still_needs_a_pass_per_layer(policy, monkeypatch):
    """The guard (harness/verdict.py) holds for the layers selected: one whose attn_out
    did not pass is unchecked, and the case fails."""
    from harness import verdict

    rows = run(policy, family="llama", ref="hf", layers="1")
    assert {r["layer"] for r in rows if r["candidate"] == "impl"} == {1}
    lcs = _case_run("llama").layer_cfgs
    kept = [r for r in rows if not (r["probe"] == "attn_out")]

    def unguarded(i, p, why):
        return {"layer": i, "probe": p, "status": "unguarded", "candidate": "impl", "reference": "-"}

    assert [r["layer"] for r in verdict.guard(kept, lcs, "impl", unguarded, layers=(1,))
            if r["status"] == "unguarded"] == [1]
    # layer 0 was not selected: nothing is asked of it
    assert not [r for r in verdict.guard(rows, lcs, "impl", unguarded, layers=(1,)) if r["status"] == "unguarded"]
    # without the selection, the unselected layer 0 would be unchecked
    assert [r["layer"] for r in verdict.guard(rows, lcs, "impl", unguarded)
            if r["status"] == "unguarded"] == [0]


BAD_SELECTION = [
    (["--layers", "2"], "--layers 2: the model has 2 layers; valid indices are 0..1 or -2..-1"),
    (["--layers", "0,x"], "--layers takes layer indices separated by commas"),
    (["--probes", "q_rop"], "unknown probe 'q_rop' in --probes; did you mean 'q_rope'?"),
]


@pytest.mark.parametrize("args,message", BAD_SELECTION, ids=[" ".join(a) for a, _ in BAD_SELECTION])
def test_bad_selection_is_one_line_exit_2_no_report(args, message, tmp_path, capsys):
    from harness.cli import main

    out = tmp_path / "run"
    rc = main(["run", "--family", "llama", *args, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_matrix_spec_takes_layers_and_probes():
    from harness.matrix import parse_spec

    spec = parse_spec('families = ["llama"]\nvariants = "default"\nlayers = ["0", "-1"]\nprobes = ["q_rope,attn_probs"]\n', "t")
    assert sorted(c.layers for c in spec.cases) == ["-1", "0"] and {c.probes for c in spec.cases} == {"q_rope,attn_probs"}
    from harness.errors import UsageError

    with pytest.raises(UsageError, match="unknown probe 'bogus'"):
        parse_spec('families = ["llama"]\nprobes = ["bogus"]\n', "t")


# ----------------------------------------------------------------- the memory plan
def _estimates(**kw):
    from harness import budget

    r = _case_run("llama", **kw)
    c = r.case
    args = dict(tokens=c.tokens, seqs=c.n_seqs, dtype=c.dtype, refs=c.refs, selection=r.selection)
    return {(hd, o): budget.estimate(r.family, r.config, r.layer_cfgs, hf_dtype=hd, oracle=o, **args).peak
            for hd in ("float64", "float32") for o in (True, False)}


def test_estimate_grows_with_tokens_and_shrinks_with_a_selection():
    from harness import budget

    r = _case_run("llama")
    est = lambda **k: budget.estimate(r.family, r.config, r.layer_cfgs, seqs=1, dtype="float32", refs=["hf"],
                                      **k)  # noqa: E731
    small, long = est(tokens=16), est(tokens=2048)
    # attn_probs: heads x tokens x tokens per layer, on each side of a comparison
    assert long.parts["layer probes"] > 4 * 2048 * 2048 * 8 > small.parts["layer probes"]
    from harness.select import Selection

    fewer = est(tokens=2048, selection=Selection.of("0", "q_rope", 2))
    assert fewer.parts["layer probes"] < long.parts["layer probes"] / 10
    assert fewer.disk < long.disk / 2


def test_estimate_counts_the_logits_each_side_holds():
    """The logits (seqs x tokens x vocab) in HF's compute type and in the float64
    oracle's, twice under a final softcap (its temporary), and llama.cpp's assembled
    in float32: at Gemma 3 270M's vocab they were the 270M-class run's peak."""
    from harness import budget

    r = _case_run("gemma2", overrides=(("vocab_size", 4096),))
    n = 2 * 64 * 4096
    est = lambda: budget.estimate(r.family, r.config, r.layer_cfgs, tokens=64, seqs=2,  # noqa: E731
                                  dtype="float32", refs=["hf", "llamacpp"])
    e = est()
    assert r.config.final_logit_softcapping
    assert e.phases["hf float64"] >= e.parts["float64 module"] + 2 * n * 8
    assert e.phases["hf capture"] >= 2 * n * 4
    assert e.phases["llama.cpp capture"] >= n * 4
    r.config.final_logit_softcapping = None
    budget._COUNTS.clear()
    assert e.phases["hf float64"] - est().phases["hf float64"] == n * 8


@pytest.mark.usefixtures("need_llamacpp")
def test_quantized_weights_count_their_dequantized_copy():
    """A quantized --gguf-type holds the float model AND the quantized file's weights
    dequantized into a float32 copy (CaseRun.base_model): the plan counts both."""
    from harness import budget

    r = _case_run("llama", gguf_type="q4_k_m")
    est = lambda t: budget.estimate(r.family, r.config, r.layer_cfgs, tokens=16, seqs=1, dtype="float32",
                                    refs=["hf"], gguf_type=t)  # noqa: E731
    f32, q4 = est("f32"), est("q4_k_m")
    assert "dequantized copy" not in f32.parts
    assert q4.parts["dequantized copy"] == q4.parts["weights"] > 0
    assert q4.peak == f32.peak + q4.parts["dequantized copy"]
    # what it counts is what the case holds: two models, not one
    assert r.base_model is not r.float_model


def test_oracle_skipped_when_it_does_not_fit_and_said_so(policy, monkeypatch, tmp_path):
    e = _estimates()
    assert e[("float32", False)] < e[("float32", True)]
    monkeypatch.setenv("CONFORMANCE_MEMORY_GB", str((e[("float32", False)] + 1) / 2**30))
    from harness.cli import main

    assert main(["run", "--family", "llama", "--out", str(tmp_path / "r")]) == 0
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "r" / "rows.parquet")
    impl = rows[rows.candidate == "impl"]
    assert (impl.status == "pass").all() and ("nmse_cand_oracle" not in impl or impl.nmse_cand_oracle.isna().all())
    assert impl.reason.str.contains("the float64 oracle was skipped").all()
    plan = json.loads((tmp_path / "r" / "meta.json").read_text())["plan"]
    assert plan["oracle"] is False and "oracle was skipped" in plan["notes"][0]


def test_float64_case_falls_back_to_hf_in_float32_and_says_so(policy, monkeypatch):
    e = _estimates(dtype="float64")
    assert e[("float32", False)] < e[("float64", False)]
    monkeypatch.setenv("CONFORMANCE_MEMORY_GB", str((e[("float32", False)] + 1) / 2**30))
    rows = run(policy, family="llama", ref="hf", dtype="float64")
    impl = [r for r in rows if r["candidate"] == "impl"]
    assert impl and all(r["status"] == "pass" and r["cmp_dtype"] == "float32" for r in impl)
    assert all("HF ran in float32, not float64" in r["reason"] for r in impl)


def test_a_case_that_cannot_fit_is_refused_before_any_work(monkeypatch, tmp_path, capsys):
    from harness import case as case_mod
    from harness.cli import main

    monkeypatch.setenv("CONFORMANCE_MEMORY_GB", "0.001")
    built = []
    monkeypatch.setattr(case_mod.CaseRun, "capture", lambda self, ref: built.append(ref))
    out = tmp_path / "r"
    rc = main(["run", "--family", "llama", "--ref", "all", "--tokens", "64", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "needs about" in err and "is available" in err and "--layers" in err
    assert not out.exists() and not built


# ----------------------------------------------------------------- checkpoints as real ones come
def test_text_key_mapping_finds_the_text_model_under_a_multimodal_prefix():
    """A multimodal checkpoint keeps the text model's tensors under a prefix
    (``language_model.model.`` as save_pretrained writes them, or
    ``model.language_model.`` as the modeling code names them); the mapping is
    read from the names, the vision tower's tensors never match, and a plain
    text checkpoint needs none."""
    from harness.checkpoint import text_key_mapping

    exp = ["model.embed_tokens.weight", "model.layers.0.q.weight", "model.norm.weight", "lm_head.weight"]
    assert text_key_mapping(exp, exp) == {}
    kept = ["language_model." + e for e in exp] + ["vision_tower.encoder.layers.0.q.weight"]
    assert text_key_mapping(exp, kept) == {r"^language_model\.model\.": "model.",
                                           r"^language_model\.lm_head\.": "lm_head."}
    renamed = [e.replace("model.", "model.language_model.", 1) for e in exp] + \
        ["model.vision_tower.encoder.layers.0.q.weight"]
    assert text_key_mapping(exp, renamed) == {r"^model\.language_model\.": "model."}


@pytest.mark.usefixtures("need_llamacpp")
def test_a_run_past_256_tokens_reads_probs_from_calls_with_fewer_cells(policy):
    """llama.cpp's graph sees the KV cells used so far, padded to 256
    (llama_kv_cache::get_n_kv), so at 300 tokens the mixed schedule's first calls
    have 256 cells for a 300-position run; each token's causal keys are all there.
    The capture refused the whole run before ("256 KV cells hold fewer than 300
    positions"), so no case past 256 tokens ever compared attn_probs."""
    from conftest import bad_rows, run

    rows = run(policy, family="llama", ref="llamacpp", tokens=300, schedule="mixed",
               overrides=(("max_position_embeddings", 512),))
    assert not bad_rows(rows)
    assert any(r["probe"] == "attn_probs" and r["status"] == "pass" for r in rows)


def test_the_worker_reports_its_own_peak_not_the_harness_at_spawn():
    """Linux carries a process's pre-exec peak RSS across execve, so getrusage's
    RUSAGE_CHILDREN said a llama.cpp worker started by a 4 GB harness used 4 GB
    (the bench printed the same number for both). The worker reads its own VmHWM."""
    import subprocess
    import sys
    from pathlib import Path

    ballast = np.ones(80_000_000)  # 0.6 GB in this process when the child starts
    code = "from harness.references.llamacpp.worker import _own_peak_rss_gb as f; print(f())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parent.parent)).stdout
    own = float(out)
    assert 0 < own < 0.3, own  # not the 0.6 GB RUSAGE_CHILDREN reports for it on Linux
    del ballast


@pytest.mark.parametrize("head_dim", [32, 64, 80, 128, 256])
def test_the_rope_term_covers_ggmls_angle_recurrence_at_every_head_dim(head_dim):
    """ggml-cpu's rope cache builds pair i's angle as pos * theta_scale^i by i float32
    multiplications (ops.cpp ggml_rope_cache_init), theta_scale = powf(base, -2/d)
    rounded once: an error growing with the pair, of a size set by how powf rounded
    (so by the machine's libm). Simulated here with theta_scale and its two float32
    neighbours (a libm one ulp off), at 2048 positions: the angle's mean square error
    must sit under the
    nmse term's allowance (harness/scaling.py), which it did not at head_dim 128 under
    the term without (1 + pair) -- the false alarm of the 2048-token bench."""
    from types import SimpleNamespace

    from harness import scaling

    base, n, u = 10000.0, 2048, scaling.EPS["float32"]
    inv = base ** (-np.arange(0, head_dim, 2) / head_dim)
    exact = np.arange(n)[:, None] * inv[None, :]
    size = scaling.rope_size(SimpleNamespace(rope=SimpleNamespace(inv_freq=inv)), n)
    from harness.policy import DEFAULT_POLICY, load_policy

    coef = load_policy(DEFAULT_POLICY).dtypes["float32"]["default"]["rope_nmse"]
    allowed = coef * u * u * size.mean_sq
    ts0 = np.float32(np.power(np.float32(base), np.float32(-2.0 / head_dim)))
    old_term = 4.0 * u * u * float(np.mean(exact ** 2))  # the earlier term, at its coefficient
    worst = 0.0
    for ts in (np.nextafter(ts0, np.float32(0)), ts0, np.nextafter(ts0, np.float32(1))):
        th, cols = np.arange(n, dtype=np.float32), []
        for _ in range(head_dim // 2):
            cols.append(th)
            th = (th * ts).astype(np.float32)
        err = np.mean((np.stack(cols, 1).astype(np.float64) - exact) ** 2)
        # a correctly rounded powf keeps 4x; a libm one ulp off still fits
        assert err <= (allowed / 4 if ts == ts0 else allowed), (head_dim, float(ts), err / allowed)
        worst = max(worst, err)
    if head_dim == 128:
        assert worst > old_term  # what the earlier term allowed: a false alarm
