"""Ragged batches (issue 28): the sequences of a batched or paged case differ in
length, first-call size and arrival -- continuous batching -- and every side
runs the same plan (harness/schedule.py: impl through ``LayerCall.steps``,
llama.cpp through its decode calls, HF through each sequence's full forward).
A sequence's result never depends on who shares its batch, and a bug that
mixes the sequences' positions up, invisible in lockstep, fails."""

from __future__ import annotations

import numpy as np
import pytest

from contract.candidate import LayerCall
from harness.candidates.api import padded
from harness.mutants import applied, registry
from harness.schedule import batch_plan, mask
from harness.pytest_fixtures import run
from harness.testing import HF_AND_LLAMACPP
from impl import Backend, Layer, LayerConfig, NormSpec, RopeSpec, WindowSpec, make_rope
from impl import kv as kvmod
from impl.runner import run_layer

POSITION_MUTANT = registry()["ragged-position-from-first-sequence"]


# ----------------------------------------------------------------- the plan
@pytest.mark.parametrize("tokens", [5, 16, 33])
@pytest.mark.parametrize("seqs", [2, 3, 4])
@pytest.mark.parametrize("schedule", ["mixed", "decode", "prefill", "3,1,4,1,7"])
def test_a_ragged_plan_differs_per_sequence_and_is_drawn_from_the_seed(tokens, seqs, schedule):
    if "," in schedule and tokens != 16:
        pytest.skip("the chunk list sums to 16")
    p = batch_plan(schedule, tokens, seqs, "paged", ragged=True, seed=0)
    assert p == batch_plan(schedule, tokens, seqs, "paged", ragged=True, seed=0)
    assert p.lengths[0] == tokens and all(-(-tokens // 2) <= n < tokens for n in p.lengths[1:])
    if tokens - 1 - -(-tokens // 2) + 1 >= seqs - 1:
        assert len(set(p.lengths)) == seqs  # distinct lengths where there are enough
    assert p.arrivals == tuple(range(seqs))  # sequence i joins at call i
    assert [sum(c) for c in p.chunks] == list(p.lengths)
    if schedule != "prefill":
        assert len({c[0] for c in p.chunks}) == seqs or tokens <= 5  # first-call sizes differ
    finish = [p.finished_at(s) for s in range(seqs)]
    assert len(set(finish)) > 1  # some sequences finish before others
    if seqs >= 3:
        assert finish[1] < p.arrivals[2]  # one leaves before a later one joins
    # each call carries each sequence at most once, and each sequence's rows in order
    seen = {s: [] for s in range(seqs)}
    for call in p.calls():
        assert len({s for s, _, _ in call}) == len(call) and [s for s, _, _ in call] == sorted(s for s, _, _ in call)
        for s, start, n in call:
            seen[s] += list(range(start, start + n))
    assert all(seen[s] == list(range(p.lengths[s])) for s in range(seqs))


def test_the_seed_draws_other_plans_and_lockstep_is_unchanged():
    plans = {batch_plan("mixed", 16, 3, "batched", True, seed) for seed in range(6)}
    assert len(plans) > 1
    lock = batch_plan("mixed", 16, 2, "batched")
    assert not lock.ragged and lock.calls() == [[(0, 0, 8), (1, 0, 8)]] + [[(0, p, 1), (1, p, 1)]
                                                                            for p in range(8, 16)]


def test_a_layercall_without_steps_is_the_lockstep_plan():
    """A LayerCall made the old way (chunks only) reads as before: every sequence
    runs ``chunks`` from the first call -- plug-in candidates keep working."""
    kw = dict(layer=0, config=None, weights={}, inputs=[np.zeros((4, 2))] * 2, chunks=(2, 1, 1), page_size=4,
              seed=0, evict=False, backend="numpy", device="cpu", dtype="float32", family="llama")
    call = LayerCall(kv="paged", **kw)
    assert call.calls() == (((0, 2), (1, 2)), ((0, 1), (1, 1)), ((0, 1), (1, 1)))
    assert call.seq_chunks(1) == (2, 1, 1) and call.arrival(1) == 0
    assert LayerCall(kv="decode", **kw).calls() == (((0, 2),), ((0, 1),), ((0, 1),), ((1, 2),), ((1, 1),),
                                                   ((1, 1),))


def test_llamacpp_issues_a_ragged_call_as_the_ubatches_it_would_split_it_into():
    """src/llama-batch.cpp split_equal(sequential): a run of consecutive sequence ids
    from the lowest, as many rows of each as the shortest has."""
    from harness.references.llamacpp.capture import plan_calls, ubatches

    assert ubatches([(0, 8, 1), (1, 0, 11)]) == [[(0, 8, 1), (1, 0, 1)], [(1, 1, 10)]]
    assert ubatches([(0, 9, 1), (2, 0, 9)]) == [[(0, 9, 1)], [(2, 0, 9)]]
    assert ubatches([(0, 3, 2), (1, 3, 2), (2, 0, 2)]) == [[(0, 3, 2), (1, 3, 2), (2, 0, 2)]]
    tokens = np.arange(48).reshape(3, 16)
    p = batch_plan("mixed", 16, 3, "batched", True, 0)
    calls = plan_calls(tokens, "batched", "mixed", p)
    for c in calls:  # every issued call is one ubatch: consecutive ids, equal rows per sequence
        seqs = sorted({s for _, _, s in c})
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert len({sum(1 for _, _, s in c if s == q) for q in seqs}) == 1
    got = {(s, pos) for c in calls for _, pos, s in c}
    assert got == {(s, pos) for s in range(3) for pos in range(p.lengths[s])}
    # lockstep: the calls it always made
    assert plan_calls(tokens, "batched", "mixed", batch_plan("mixed", 16, 3, "batched")) == \
        plan_calls(tokens, "batched", "mixed")


def test_mask_and_padding_keep_each_sequence_to_its_length():
    a = np.ones((2, 3, 4, 4))  # attn_probs [S, H, T, T]
    m = mask("attn_probs", a, (4, 2))
    assert m[0].sum() == 48 and m[1, :, :2, :2].sum() == 12 and m[1].sum() == 12 and a.sum() == 96
    rows = padded("attn_heads", [np.ones((4, 2, 3)), np.ones((2, 2, 3))], 4)
    assert rows.shape == (2, 4, 2, 3) and rows[1, 2:].sum() == 0
    probs = padded("attn_probs", [np.ones((3, 4, 4)), np.ones((3, 2, 2))], 4)
    assert probs.shape == (2, 3, 4, 4) and probs[1].sum() == 12


# ----------------------------------------------------------------- impl's runner
def _layer(cfg, backend):
    rng = np.random.default_rng(5)
    h, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    w = {"attn_norm": 1 + 0.1 * rng.normal(size=48), "wq": rng.normal(size=(h * d, 48)) / 7,
         "wk": rng.normal(size=(hkv * d, 48)) / 7, "wv": rng.normal(size=(hkv * d, 48)) / 7,
         "wo": rng.normal(size=(48, h * d)) / 7}
    if cfg.window is not None and cfg.window.kind == "sliding":
        w["sinks"] = rng.normal(size=h)
    return Layer.load(cfg, w, backend)


BASE = dict(hidden_size=48, n_heads=4, n_kv_heads=2, head_dim=12, input_norm=NormSpec("rms", 1e-6))
CONFIGS = {
    "plain": LayerConfig(**BASE, rope=make_rope("default", 10000.0, 12)),
    "sinks-window": LayerConfig(**BASE, rope=make_rope("default", 10000.0, 12), window=WindowSpec("sliding", 4)),
    "chunked": LayerConfig(**BASE, rope=make_rope("default", 10000.0, 12, "interleaved"), window=WindowSpec("chunked", 5)),
}
assert all(isinstance(c.rope, RopeSpec) for c in CONFIGS.values())


def _alone_vs_batch(cfg, backend, kv, seqs=3, seed=0):
    layer = _layer(cfg, backend)
    p = batch_plan("mixed", 14, seqs, kv, True, seed)
    rng = np.random.default_rng(seed + 11)
    xs = [rng.normal(size=(n, 48)) for n in p.lengths]
    outs, traces, steps = run_layer(layer, xs, kv, [list(c) for c in p.chunks], page_size=3, arrivals=p.arrivals)
    alone = [run_layer(layer, [x], "decode", [list(c)]) for x, c in zip(xs, p.chunks)]
    return outs, traces, alone, steps


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("kv", ["batched", "paged"])
@pytest.mark.parametrize("backend", [("numpy", "float64"), ("numpy", "float32"), ("torch", "bfloat16")])
def test_a_sequence_does_not_depend_on_who_shares_its_batch(name, kv, backend):
    """Spec forward_multi_seq_kv: each sequence of a ragged batch computes exactly
    what it computes alone with its own chunks -- bit for bit, windows included."""
    outs, traces, alone, _ = _alone_vs_batch(CONFIGS[name], Backend(backend[0], "cpu", backend[1]), kv)
    for s, (o, t) in enumerate(zip(outs, traces)):
        a_out, a_tr, _ = alone[s]
        assert np.array_equal(o, a_out[0]), f"sequence {s}: max |batch - alone| {np.abs(o - a_out[0]).max():.3g}"
        pa, pb = t.assemble(), a_tr[0].assemble()
        assert all(np.array_equal(pa[k], pb[k]) for k in pb), s


@pytest.mark.parametrize("kv", ["batched", "paged"])
def test_the_position_mutant_breaks_that_and_only_when_ragged(kv):
    """The same check can fail: with every sequence taking the first one's query
    position, a ragged batch differs from each sequence alone (and a lockstep one
    cannot tell)."""
    be = Backend("numpy", "cpu", "float64")
    with applied(POSITION_MUTANT):
        outs, _, alone, _ = _alone_vs_batch(CONFIGS["plain"], be, kv)
        worst = max(float(np.abs(o - a[0][0]).max()) for o, a in zip(outs, alone))
        layer = _layer(CONFIGS["plain"], be)
        xs = [np.random.default_rng(3).normal(size=(10, 48)) for _ in range(3)]
        lock, _, _ = run_layer(layer, xs, kv, [[5, 1, 1, 1, 1, 1]] * 3)
        lock_alone = run_layer(layer, xs[:1], "decode", [[5, 1, 1, 1, 1, 1]])[0][0]
    assert worst > 1e-3
    assert all(np.array_equal(o, lock_alone) for o in lock)


def test_a_paged_sequence_that_leaves_gives_its_pages_to_the_next_arrival(monkeypatch):
    released = []
    real = kvmod.PagePool.release

    def record(self, seq):
        released.append(list(seq.block_table))
        real(self, seq)

    monkeypatch.setattr(kvmod.PagePool, "release", record)
    _, _, _, steps = _alone_vs_batch(CONFIGS["plain"], Backend("numpy", "cpu", "float64"), "paged")
    assert released and set(released[0]) & set(steps[2].seq.block_table)  # sequence 1's pages, reused by 2


# ----------------------------------------------------------------- whole cases
def test_ragged_needs_a_batch(capsys):
    from harness.cli import main

    for argv in (["--kv", "decode"], ["--kv", "paged", "--seqs", "1"]):
        assert main(["run", "--family", "llama", "--ragged", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--ragged needs several sequences" in err and "batched" in err


@pytest.mark.parametrize("family", ["llama", "gemma2", "deepseek_v2"])
def test_ragged_cases_pass_three_way_and_the_position_mutant_fails_them(policy, need_llamacpp, family):
    """`conformance run --kv batched --seqs 3 --ragged`: clean, every comparison passes
    against every reference; with the position mutant, impl fails against each --
    and the lockstep case it cannot tell from the clean one still passes."""
    kw = dict(family=family, ref=HF_AND_LLAMACPP, kv="batched", seqs=3)
    rows = run(policy, ragged=True, **kw)
    assert rows[0]["ragged"] and "ragged" in rows[0]["case_id"]
    bad = [(r["candidate"], r["reference"], r["layer"], r["probe"], r["status"]) for r in rows
           if r["status"] not in ("pass", "not-exposed", "finding")]
    assert not bad, bad[:5]
    with applied(POSITION_MUTANT):
        broken = run(policy, ragged=True, **kw)
        lock = run(policy, **kw)
    failed = {r["reference"] for r in broken if r["candidate"] == "impl" and r["status"] in ("fail", "error")}
    # every reference --ref all runs (hf, hf_cached, llamacpp) judges impl, and each sees it
    judged = {r["reference"] for r in rows if r["candidate"] == "impl"}
    assert {"hf", "llamacpp"} <= judged and failed == judged
    assert not [r for r in lock if r["status"] in ("fail", "error", "unguarded")]


def test_a_candidate_that_reads_only_chunks_is_skipped_on_a_ragged_case(policy):
    import harness.candidates as api
    from harness.candidates.impl_body import ImplCandidate

    class OnePlan(ImplCandidate):
        ragged = False

    c = OnePlan()
    c.name = "one-plan"
    api._get.cache_clear()
    real = api._get
    try:
        api._get = lambda name: c if name == "one-plan" else real(name)
        rows = run(policy, family="llama", ref="hf", kv="paged", seqs=3, ragged=True, candidate="one-plan")
        lock = run(policy, family="llama", ref="hf", kv="paged", seqs=3, candidate="one-plan")
    finally:
        api._get = real
    assert [r["status"] for r in rows] == ["skipped"] and "LayerCall.steps" in rows[0]["reason"]
    assert all(r["status"] == "pass" for r in lock if r["candidate"] == "one-plan")
