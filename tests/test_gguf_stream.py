"""A --gguf file read one decoder layer at a time (harness/pipeline/gguf/stream.py: the
8B-class path, whose float32 model would not fit) computes what the in-memory
reading computes: every row of a three-way run, bit for bit, on a tiny
quantized file -- all layers, and ``--layers 0,-1`` (where the teacher-forced
oracle skips the layers between). The streamed run must really have read the
layers from the file one at a time (counted), and held none of them at the end."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run
from harness.testing import HF_AND_LLAMACPP

# a llama whose matrices K-quants can block (rows of 256), with outlier channels
TINY = (("hidden_size", 256), ("intermediate_size", 512), ("num_hidden_layers", 3), ("num_attention_heads", 4),
        ("num_key_value_heads", 2), ("vocab_size", 320))
COLS = ("status", "reason", "nmse", "max_abs", "max_rel", "cosine", "worst", "err_ratio", "tol_nmse", "tol_atol",
        "nmse_cand_oracle", "nmse_ref_oracle", "tol_reason", "cmp_dtype")


@pytest.fixture(scope="module")
def tiny_file():
    from harness.case import Case, CaseRun

    r = CaseRun(Case(family="llama", gguf_type="q4_k_m", weights="realistic", overrides=TINY), None)
    return str(r.gguf_path)


def _rows(policy, path, stream: bool, cache, monkeypatch, **kw):
    from harness.pipeline.gguf import stream as streaming

    reads, held, seen = [], [], []
    real = streaming.Streamed.ensure

    def ensure(self, module):
        before = self.reads
        real(self, module)
        reads.append(self.reads - before)
        held.append(sum(1 for u in self.resident if id(u) in self.layer_ids))
        seen[:] = [self]

    monkeypatch.setenv("CONFORMANCE_CACHE", str(cache))  # each reading its own captures
    monkeypatch.setenv(streaming.ENV, "1" if stream else "0")
    monkeypatch.setattr(streaming.Streamed, "ensure", ensure)
    rows = run(policy, family="", gguf=path, ref=HF_AND_LLAMACPP, tokens=9, **kw)
    assert max(held, default=0) <= 1  # one decoder layer held at a time
    for st in seen:  # and none at the end (a layer the float64 run put back after it was dropped would be)
        assert all(st.params[n].device.type == "meta" for ns in st.names.values() for n in ns)
        assert st.row_reads > 0  # the embedding held only the rows each call looked up
    return {(r["candidate"], r["reference"], r["layer"], r["probe"]): r for r in rows}, sum(reads)


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("layers", [None, "0,-1"])
def test_a_streamed_file_gives_the_in_memory_rows_bit_for_bit(policy, tiny_file, tmp_path, monkeypatch, layers):
    kw = {"layers": layers} if layers else {}
    held, none = _rows(policy, tiny_file, False, tmp_path / "a", monkeypatch, **kw)
    streamed, reads = _rows(policy, tiny_file, True, tmp_path / "b", monkeypatch, **kw)
    assert none == 0 and reads > 0  # the second run read its layers from the file
    assert held.keys() == streamed.keys() and len(held) > 100
    bad = [(k, c, held[k].get(c), streamed[k].get(c)) for k in held for c in COLS
           if not (held[k].get(c) == streamed[k].get(c) or (isinstance(held[k].get(c), float)
                                                           and np.isnan(held[k][c]) and np.isnan(streamed[k][c])))]
    assert not bad, bad[:4]
    assert {r["status"] for r in held.values()} == {"pass"}


@pytest.mark.usefixtures("need_llamacpp")
def test_the_streamed_export_writes_the_seeded_model_tensor_by_tensor(tmp_path):
    """``export_streamed`` (the 8B-class file's recipe: never the model in memory)
    writes the tensors ``export`` writes for the family's seeded model -- every
    name, type and byte (only their order in the file differs) -- and llama.cpp's
    quantizer makes the same file of both."""
    from harness import families
    from harness.pipeline.gguf import export
    from harness.pipeline.gguf.reader import open_reader, read_fields
    from harness.pipeline.gguf.weights import quantize

    fam = families.get("llama")
    cfg = fam.make_config(dict(TINY))
    model = fam.build_model(cfg, 0, "float32", weights="realistic")
    held = tmp_path / "held.gguf"
    export._write(fam, model, cfg, "f16", None, held)
    streamed = export.export_streamed(fam, cfg, 0, "f16", tmp_path / "streamed.gguf", weights="realistic")
    a, b = open_reader(str(held)), open_reader(str(streamed))
    assert read_fields(a) == read_fields(b)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert ta.keys() == tb.keys() and [t.name for t in a.tensors] != [t.name for t in b.tensors]
    assert all(ta[n].tensor_type == tb[n].tensor_type and bytes(ta[n].data) == bytes(tb[n].data) for n in ta)
    assert quantize(held, "q4_k_m").read_bytes() == quantize(streamed, "q4_k_m").read_bytes()
