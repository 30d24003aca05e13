"""impl against llama.cpp, and the two references against each other."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import all_statuses, assert_llamacpp_fails_first_at_q, bad_rows, run, statuses
from harness.testing import HF_AND_LLAMACPP

pytestmark = pytest.mark.usefixtures("need_llamacpp")

FOUNDATION = ["llama", "qwen2", "qwen3"]


@pytest.mark.parametrize("family", FOUNDATION)
@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_three_way(policy, family, kv):
    rows = run(policy, family=family, ref=HF_AND_LLAMACPP, kv=kv, schedule="mixed")
    bad = bad_rows(rows, ok=("pass", "not-exposed"))
    assert not bad, bad
    pairs = {(r["candidate"], r["reference"]) for r in rows if r["status"] == "pass"}
    # --ref all also runs hf_cached (HF's own cached path), adding its pairs: the three pairs this test is about
    # must be among the passing ones (any failing pair, hf_cached's included, is caught by bad_rows above)
    assert {("impl", "hf"), ("impl", "llamacpp"), ("llamacpp", "hf")} <= pairs
    # HF vs llama.cpp NMSE on attn_out is recorded (qwen2/qwen3 name no attn_out: resid_mid stands in)
    r2r = {(r["layer"], r["probe"]): r for r in rows if r["candidate"] == "llamacpp"}
    probe = "attn_out" if (0, "attn_out") in r2r else "resid_mid"
    assert np.isfinite(r2r[(0, probe)]["nmse"]) and r2r[(0, probe)]["nmse"] < 1e-10
    # every probe llama.cpp does not name is a row that says so, never a pass
    for r in rows:
        if r["status"] == "not-exposed":
            assert "does not expose" in r["reason"]


@pytest.mark.parametrize("schedule", ["prefill", "decode"])
def test_multi_sequence_batches_and_token_by_token(policy, schedule):
    rows = run(policy, family="qwen3", ref="llamacpp", kv="paged", seqs=3, schedule=schedule, tokens=11)
    st = statuses(rows)
    assert st and all(s in ("pass", "not-exposed") for s in st.values())
    assert any(p == "attn_probs" and s == "pass" for (_, _, p), s in st.items())


@pytest.mark.parametrize("gguf_type", ["f16", "bf16", "q8_0"])
def test_weight_types(policy, gguf_type):
    rows = run(policy, family="llama", ref="llamacpp", gguf_type=gguf_type)
    # q8_0: every side holds the file's dequantized weights, and impl's projections see
    # their inputs rounded as ggml quantizes activations (harness/references/llamacpp/ggml_matmul.py)
    assert {r["cmp_dtype"] for r in rows if "cmp_dtype" in r} == {"float16" if gguf_type == "f16" else
                                                                    "bfloat16" if gguf_type == "bf16" else "ggml_q8_0"}
    assert all(s == "pass" for s in statuses(rows).values())
    worst = max(r["nmse"] for r in rows if r["probe"] == "attn_out")
    if gguf_type == "q8_0":  # what is left is float32 summation order (tests/test_gguf_files.py: without
        assert worst < 1e-9  # the rounding the same comparison misses by orders of magnitude)
    else:  # the rounding of the weights is real: the error is far above float32 rounding
        assert worst > 1e-9


def test_broken_qk_permutation_fails_at_q(policy, monkeypatch):
    from harness.families import get

    llama = get("llama")
    monkeypatch.setattr(llama, "_permute_qk", False)
    rows = run(policy, family="llama", ref=HF_AND_LLAMACPP)
    st = all_statuses(rows)
    assert_llamacpp_fails_first_at_q(st)
    assert st[("impl", "llamacpp", 0, "v")] == "pass"
    assert st[("llamacpp", "hf", 0, "q")] == "fail"


@pytest.mark.parametrize("kind", ["segv", "abort"])
def test_a_crash_inside_llamacpp_is_an_error_row(policy, monkeypatch, kind):
    from harness.references.llamacpp import capture as llamacpp

    monkeypatch.setattr(llamacpp, "WORKER_MODULE", "tests.helpers.crashing_worker")
    monkeypatch.setenv("CRASH_KIND", kind)
    monkeypatch.setenv("PYTHONPATH", str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    rows = run(policy, family="qwen3", ref=HF_AND_LLAMACPP, seed=11)
    errors = [r for r in rows if r["status"] == "error"]
    assert len(errors) == 1 and errors[0]["reference"] == "llamacpp"
    assert "signal" in errors[0]["reason"] and "GGML_ASSERT" in errors[0]["reason"]
    # the run went on: impl vs HF was still compared
    assert any(r["reference"] == "hf" and r["status"] == "pass" for r in rows)


LLAMA3 = (("rope_parameters", {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),)


@pytest.mark.parametrize("family", ["llama", "granite"])
def test_llama3_rope_scaling_reaches_llamacpp_as_rope_freqs(policy, monkeypatch, family, tmp_path):
    """granite: GraniteModel is a LlamaModel, so the converter writes rope_freqs and
    granite.cpp reads it; the export left it out, and every granite case with llama3
    RoPE failed impl vs llama.cpp at q_rope."""
    rows = run(policy, family=family, ref=HF_AND_LLAMACPP, overrides=LLAMA3)
    assert all(r["status"] in ("pass", "not-exposed") for r in rows)
    assert "rope_scaling" in rows[0]["features"]
    # without the converter's rope_freqs tensor llama.cpp rotates unscaled: caught at q_rope
    from harness.families import _convert

    monkeypatch.setattr(_convert, "llama3_rope_factors", lambda config: None)
    # a cache of its own: the broken export must not be served from (or left in) the session's
    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path))
    rows = run(policy, family=family, ref="llamacpp", overrides=LLAMA3, seed=5)
    st = {(r["layer"], r["probe"]): r["status"] for r in rows}
    assert st[(0, "q")] == "pass" and st[(0, "q_rope")] == "fail"


@pytest.mark.parametrize("family,written", [("llama", True), ("granite", True), ("smollm3", True), ("afmoe", True),
                                            ("llama4", True), ("olmo", False), ("qwen2", False), ("olmo2", False)])
def test_the_export_writes_rope_freqs_where_the_converter_does(family, written):
    """convert_hf_to_gguf writes llama3 scaling as rope_freqs in LlamaModel and its
    subclasses only (conversion/llama.py generate_extra_tensors; granite, smollm3,
    afmoe and llama4 derive from it, olmo / qwen2 / olmo2 are plain TextModels) --
    whether or not the arch's graph then reads it: the file is the one users get."""
    from harness.families import get

    fam = get(family)
    config = fam.make_config(dict(LLAMA3))
    model = fam.build_model(config, 0, "float32")
    names = {n for n, _ in fam.gguf_tensors(model, config)}
    assert ("rope_freqs.weight" in names) == written


def test_the_worker_serves_captures_and_a_failure_starts_a_fresh_one(tmp_path):
    """harness/references/llamacpp/capture.py _WorkerServer: a second capture runs in the
    same worker process (no second interpreter and libllama start) and gives the same
    tensors; a capture that fails is an error naming the worker's status and message,
    its process is gone, and the next capture starts a new one."""
    import numpy as np

    from harness.families import get
    from harness.pipeline.gguf import export as gguf_export
    from harness.references.llamacpp import capture as llamacpp

    fam = get("llama")
    config = fam.make_config({})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, None)
    calls = [[(1, 0, 0), (5, 1, 0)], [(7, 2, 0)]]
    llamacpp._SERVER.close()
    first, index = llamacpp.run_worker(path, calls, 1, {"l_out"})
    pid = llamacpp._SERVER.proc.pid
    again, _ = llamacpp.run_worker(path, calls, 1, {"l_out"})
    assert llamacpp._SERVER.proc.pid == pid
    assert index and all(np.array_equal(first[r["key"]], again[r["key"]]) for r in index)
    (tmp_path / "not.gguf").write_bytes(b"not a gguf")
    with pytest.raises(RuntimeError, match=r"exit status 3: .*could not load"):
        llamacpp.run_worker(tmp_path / "not.gguf", calls, 1, {"l_out"})
    assert llamacpp._SERVER.proc is None
    third, _ = llamacpp.run_worker(path, calls, 1, {"l_out"})
    assert llamacpp._SERVER.proc.pid != pid
    assert all(np.array_equal(first[r["key"]], third[r["key"]]) for r in index)
