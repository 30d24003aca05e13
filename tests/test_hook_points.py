"""The HF adapter's hook points, and transformers 5.25's kernels wrappers.

transformers 5.25.0 requires the ``kernels`` package, which turns every
function decorated ``use_kernel_forward_from_hub`` into an ``nn.Module``
instance, and moved the Mamba mixers' conv behind ``causal_conv1d_forward``. On
the old adapter, 63 default cases broke (``KeyError: 'hidden_states'``; the
delta-net float64 rows at 1e-15 against 1e-20). These tests hold, on the pinned
release:

- a missing or moved hook point is refused at start-up in one line (exit 2,
  nothing written), naming the release and the supported window;
- a function hidden in a kernels-style ``Func`` module is still wrapped by the
  recurrent taps and promoted by the float64 oracle (the same wrapper as
  kernels' ``_create_func_module``, built here: the pinned release does not
  install kernels).
"""

from __future__ import annotations

import inspect

import pytest

from harness.cli import main
from harness.references.hf import hook_points, internals


@pytest.fixture(autouse=True)
def _fresh_checks(tmp_path, monkeypatch):
    # each test checks again: no process memo, no remembered pass in the cache
    monkeypatch.setattr(hook_points, "_CHECKED", set())
    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path / "cache"))


def _run(capsys, tmp_path, family="mamba", ref="hf"):
    out = tmp_path / "out"
    rc = main(["run", "--family", family, "--ref", ref, "--out", str(out), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err, out


def _kernels_style(func):
    """What kernels' use_kernel_forward_from_hub makes of a function (kernels
    _internals/layer/layer.py ``_create_func_module``): an nn.Module instance whose
    forward(*args, **kwargs) calls it through a closure."""
    import torch

    def _create_func_module(func):
        class Func(torch.nn.Module):
            def forward(self, *args, **kwargs):
                return func(*args, **kwargs)
        Func.__module__ = func.__module__
        return Func

    return _create_func_module(func)()


def test_every_family_passes_on_the_pinned_release():
    from harness.families import get, registry

    for name in registry():
        fam = get(name)
        hook_points.check(fam, fam.make_config())


def test_a_missing_conv_function_is_refused_at_start_up(capsys, tmp_path, monkeypatch):
    import transformers.models.mamba.modeling_mamba as mm

    monkeypatch.delattr(mm, "causal_conv1d_fn")
    rc, err, out = _run(capsys, tmp_path)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("conformance: error: transformers ")
    assert "modeling_mamba has no `causal_conv1d_fn`" in err[0] and "supported 5." in err[0]
    assert not out.exists()


def test_a_mixer_that_no_longer_calls_the_scan_is_refused(capsys, tmp_path, monkeypatch):
    import transformers.models.mamba.modeling_mamba as mm

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):  # calls no scan at all
        return self.out_proj(self.in_proj(hidden_states))

    monkeypatch.setattr(mm.MambaMixer, "forward", forward)
    rc, err, out = _run(capsys, tmp_path)
    assert rc == 2 and len(err) == 1, err
    assert "the MambaMixer no longer calls `causal_conv1d_fn`" in err[0], err[0]
    assert not out.exists()


def test_a_renamed_scan_argument_is_refused(capsys, tmp_path, monkeypatch):
    import transformers.models.mamba.modeling_mamba as mm

    orig = mm.mamba_selective_scan

    def mamba_selective_scan(x, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, **kw):
        return orig(x, dt, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus, **kw)

    monkeypatch.setattr(mm, "mamba_selective_scan", mamba_selective_scan)
    rc, err, _ = _run(capsys, tmp_path)
    assert rc == 2 and "no longer takes `hidden_states`" in err[0], err


def test_an_attention_module_that_calls_no_eager_function_is_refused(capsys, tmp_path, monkeypatch):
    import transformers.models.llama.modeling_llama as ml

    monkeypatch.setattr(ml.LlamaAttention, "forward", lambda self, *a, **k: None)
    rc, err, out = _run(capsys, tmp_path, family="llama")
    assert rc == 2 and "calls `eager_attention_forward`" in err[0], err
    assert not out.exists()


def test_a_moved_probe_point_is_refused(capsys, tmp_path, monkeypatch):
    from harness.families import get
    from harness.families._hf_capture import Point

    fam = get("llama")
    monkeypatch.setattr(type(fam), "hf_points", {**fam.hf_points, "q": Point("self_attn.query_proj", "out")})
    rc, err, _ = _run(capsys, tmp_path, family="llama")
    assert rc == 2 and "LlamaDecoderLayer has no `self_attn.query_proj`" in err[0], err


def test_a_renamed_default_rope_method_is_refused():
    """hf_default_rope_reads reads the source of compute_default_rope_parameters to learn
    whether HF's default RoPE reads partial_rotary_factor; a release that renamed it would
    have every key taken as read -- refused at start-up instead (one line, exit 2)."""
    import types

    import transformers.models.llama.modeling_llama as ml

    hook_points._check_default_rope(ml)  # the pinned release: there
    mod = types.ModuleType("transformers.models.newmodel.modeling_newmodel")
    renamed = type("NewModelRotaryEmbedding", (), {"__module__": mod.__name__,
                                                   "default_rope_parameters": staticmethod(lambda c: None)})
    mod.NewModelRotaryEmbedding = renamed
    with pytest.raises(hook_points.HookPointMissing, match="NewModelRotaryEmbedding .modeling_newmodel. defines no "
                                                          "compute_default_rope_parameters"):
        hook_points._check_default_rope(mod)
    renamed.compute_default_rope_parameters = staticmethod(lambda c: None)
    hook_points._check_default_rope(mod)


def test_a_wrapper_the_float64_oracle_cannot_read_is_refused(capsys, tmp_path, monkeypatch):
    import transformers.models.mamba.modeling_mamba as mm

    class Opaque:  # a callable with no Python function behind it
        __module__ = mm.__name__

        def __call__(self, *a, **k):
            raise AssertionError

    monkeypatch.setattr(mm, "opaque_kernel", Opaque(), raising=False)
    rc, err, _ = _run(capsys, tmp_path)
    assert rc == 2 and "opaque_kernel is a Opaque whose source the float64 oracle cannot read" in err[0], err


def test_plain_sees_through_a_kernels_func_module():
    import transformers.models.mamba.modeling_mamba as mm

    wrapped = _kernels_style(mm.mamba_selective_scan)
    assert str(inspect.signature(wrapped)) == "(*args, **kwargs)"  # what broke the taps on 5.25.0
    fn = internals.plain(wrapped)
    assert fn is inspect.unwrap(mm.mamba_selective_scan) and "hidden_states" in inspect.signature(fn).parameters
    assert internals.reaches(mm.MambaMixer.forward, "mamba_selective_scan")
    assert internals.plain(object()) is None


def test_a_kernels_wrapped_mamba_scan_is_captured(policy, monkeypatch):
    """The 5.25.0 event on the pinned release: the scans and the conv as kernels Func
    modules. The capture reads them by HF's own signature (no KeyError)."""
    import transformers.models.mamba.modeling_mamba as mm

    from harness.pytest_fixtures import run
    from harness.testing import statuses

    for name in ("mamba_selective_scan", "mamba_selective_state_update", "causal_conv1d_fn", "causal_conv1d_update"):
        monkeypatch.setattr(mm, name, _kernels_style(getattr(mm, name)))
    rows = run(policy, family="mamba", ref="hf_cached", kv="decode", backend="numpy", dtype="float32")
    st = statuses(rows)
    assert st[("hf_cached", 0, "rec_q")] == "pass" and st[("hf_cached", 1, "state_rec")] == "pass", st
    assert not [r for r in rows if r["status"] in ("error", "fail")]


def test_a_kernels_wrapped_delta_rule_is_promoted_to_float64(policy, monkeypatch):
    """The other 5.25.0 change: the float64 oracle must reach a function hidden in a
    Func module, or part of HF's "float64" run stays float32 (rec_q at 1e-15 against a
    1e-20 bound, as on 5.25.0 before the fix)."""
    import transformers.models.qwen3_next.modeling_qwen3_next as mq

    from harness.pytest_fixtures import run

    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update"):
        monkeypatch.setattr(mq, name, _kernels_style(getattr(mq, name)))
    rows = run(policy, family="qwen3_next", ref="hf", kv="decode", backend="numpy", dtype="float64")
    bad = [(r["layer"], r["probe"], r["nmse"]) for r in rows if r["status"] not in ("pass", "not-exposed", "finding")]
    assert not bad, bad
    q = [r["nmse"] for r in rows if r["probe"] == "rec_q" and r["candidate"] == "impl"]
    assert q and max(q) < 1e-25, q


def test_without_plain_the_float64_oracle_leaves_the_wrapped_function_in_float32(policy, monkeypatch):
    """The test above can fail: with float64.py blind to the wrapper (as before the fix),
    the same case fails at rec_q."""
    import transformers.models.qwen3_next.modeling_qwen3_next as mq

    from harness.references.hf import float64
    from harness.pytest_fixtures import run

    monkeypatch.setattr(mq, "torch_chunk_gated_delta_rule", _kernels_style(mq.torch_chunk_gated_delta_rule))
    monkeypatch.setattr(mq, "torch_recurrent_gated_delta_rule", _kernels_style(mq.torch_recurrent_gated_delta_rule))
    monkeypatch.setattr(float64, "plain", lambda v: v if inspect.isfunction(v) else None)
    rows = run(policy, family="qwen3_next", ref="hf", kv="decode", backend="numpy", dtype="float64", seed=3)
    fails = {r["probe"] for r in rows if r["status"] == "fail" and r["candidate"] == "impl"}
    assert "rec_q" in fails or "rec_out" in fails, fails


# ---------------------------------------------------------------- llama.cpp's struct mirror
def test_the_ggml_mirror_matches_the_installed_library(need_llamacpp):
    from harness.references.llamacpp import ggml_ctypes

    assert ggml_ctypes.layout_mismatch(ggml_ctypes.ggml_base_path()) is None


def _swapped(first: str, second: str):
    import ctypes

    from harness.references.llamacpp import ggml_ctypes

    # the two names trade places, the types stay where they were: each name is read at
    # the other's offset, as a release that reordered the struct would make the mirror do
    fields = list(ggml_ctypes.GgmlTensor._fields_)
    names = [n for n, _ in fields]
    i, j = names.index(first), names.index(second)
    fields[i], fields[j] = (second, fields[i][1]), (first, fields[j][1])
    return type("Swapped", (ctypes.Structure,), {"_fields_": fields})


@pytest.mark.parametrize("first,second,says", [("view_src", "data", "view_src"), ("ne", "nb", "ne, nb")])
def test_a_moved_ggml_field_is_noticed(need_llamacpp, monkeypatch, first, second, says):
    from harness.references.llamacpp import ggml_ctypes

    monkeypatch.setattr(ggml_ctypes, "GgmlTensor", _swapped(first, second))
    got = ggml_ctypes.layout_mismatch(ggml_ctypes.ggml_base_path())
    assert got is not None and says in got, got


def test_a_release_whose_ggml_layout_moved_is_refused_at_start_up(need_llamacpp, capsys, tmp_path, monkeypatch):
    import ctypes

    from harness.references.llamacpp import ggml_ctypes

    fields = [f for f in ggml_ctypes.GgmlTensor._fields_ if f[0] != "view_offs"]  # a field dropped
    monkeypatch.setattr(ggml_ctypes, "GgmlTensor", type("Short", (ctypes.Structure,), {"_fields_": fields}))
    rc, err, out = _run(capsys, tmp_path, family="llama", ref="llamacpp")
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("conformance: error: llama-cpp-python ") and "struct ggml_tensor is" in err[0], err
    assert not out.exists()
