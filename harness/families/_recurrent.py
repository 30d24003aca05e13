"""Where a recurrent layer's probes live in each reference, for the families that
have recurrent layers (gated delta-net, Kimi delta attention, short conv): one
mixin, ``RecurrentProbes``, the families parameterise with data.

HF. A recurrent module runs its conv and its scan as FUNCTIONS of its modeling
module (``causal_conv1d_fn`` / ``causal_conv1d_update``, ``torch_chunk_gated_delta_rule``
/ ``torch_recurrent_gated_delta_rule``, ``chunk_kimi_delta_attention`` /
``recurrent_kimi_delta_attention``, ``l2norm``), never as modules: a forward hook
on ``conv1d`` never fires. ``recurrent_taps`` wraps those functions in the modeling
module's globals for the duration of a capture (the module looks them up at call
time) and records, under the layer whose module is running (a pre-hook on it says
which), what HF computes with: the conv's input and output (the call's own rows:
with a cache HF prepends its conv state, ``LinearAttentionLayer.update_conv_state``),
q and k as ``l2norm`` returns them (inside the scan, after HF's ``repeat_interleave``
of the key heads: the canonical probe keeps one per key head), v / beta / g as the
scan receives them, y as it returns. Module hooks give the rest (z as the gated
norm's gate, the branch as ``out_proj``'s input). With a cache, the state after each
call is the cache's (``conv_states[..., 1:]``: HF keeps K columns, the oldest never
read; ``recurrent_states``).

llama.cpp. The graph's ``cb()`` names (``lc_recurrent_points``, read from
src/models/<arch>.cpp) and the state after each call, read by the worker through
``llama_state_seq_get_data`` (llama-memory-recurrent.cpp ``state_write_data``: per
recurrent layer one row of ``r_l``, the conv state, then one of ``s_l``, the
recurrent matrix). ``lc_recurrent_canonical`` puts what the graph hands back in the
canonical layout: ggml's state is ``[Dv][Dk]`` per head (HF's transposed), qwen35's
value heads are tiled (its converter reorders them, ``_LinearAttentionVReorderBase``),
Kimi keeps three convs' states side by side.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

from contract.recurrent import RecurrentConfig
from harness.references.hf.internals import signature as hf_signature
from harness.lazy import lazy

torch = lazy("torch")
F = lazy("torch.nn.functional")

# where each HF scan function's l2norm sees q and k: [B, H, T, D] after a transpose, or [B, T, H, D]
SCAN_LAYOUT = {"torch_chunk_gated_delta_rule": "bhtd", "torch_recurrent_gated_delta_rule": "bhtd",
               "chunk_kimi_delta_attention": "bhtd", "recurrent_kimi_delta_attention": "bthd"}
CONV_FUNCTIONS = ("causal_conv1d_fn", "causal_conv1d_update")
# HF's Mamba scans (modeling_mamba2.py, modeling_mamba.py): their own signatures, not q / k / v
MAMBA_SCANS = ("mamba2_chunk_scan", "mamba2_selective_state_update", "mamba_selective_scan",
               "mamba_selective_state_update")


def _np(t):
    """A float64 NumPy COPY: HF updates its cache's states in place (``copy_``), and a
    float64 tensor's ``.numpy()`` would share that memory -- every call's snapshot the last."""

    return t.detach().to(dtype=torch.float64).cpu().numpy().copy()


class RecurrentProbes:
    """The recurrent half of a family's probe maps (mixed in before ``Family``)."""
    # the recurrent module's path in the decoder layer, and the HF module that is its gated
    # norm (its second argument is z) -- None where the family reads z otherwise
    hf_rec_module = "linear_attn"
    hf_rec_gate_norm: str | None = "norm"
    # llama.cpp: recurrent probe -> LcPoint (src/models/<arch>.cpp cb() names); the state probes
    # come from llama_state_seq_get_data (lc_states)
    lc_recurrent_points: dict = {}

    def is_recurrent(self, config, i: int) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------------ HF
    def recurrent_taps(self, model, config, sink):
        """A context manager recording the functional conv / scan / l2norm calls of the
        recurrent layers into ``sink[layer][probe]`` (canonical arrays)."""
        return _taps(self, model, config, sink)

    @contextlib.contextmanager
    def hf_taps(self, model, config, sink):
        with super().hf_taps(model, config, sink), self.recurrent_taps(model, config, sink):
            yield

    def _rec_desc(self, config, i: int) -> RecurrentConfig:
        return self.layer_config(config, i)

    def hf_cache_states(self, cache, config, i: int, lc) -> dict:
        """Layer ``i``'s state in HF's cache after a call, canonical (``[S, ...]``)."""
        layer = cache.layers[i]
        out = {}
        conv = getattr(layer, "conv_states", [None])[0]
        if conv is not None and lc.conv_kernel:
            out["state_conv"] = _np(conv)[..., 1:]  # [S, C, K]: the oldest column is never read
        rec = getattr(layer, "recurrent_states", [None])[0]
        if rec is not None and lc.has_recurrence:
            out["state_rec"] = _np(rec)  # [S, Hv, Dk, Dv]
        return out

    # ------------------------------------------------------------------ llama.cpp
    def lc_v_head_order(self, config) -> str:
        """How llama.cpp's graph orders the value heads: ``grouped`` (HF's) or ``tiled``."""
        return "grouped"

    def lc_recurrent_canonical(self, probe: str, arr: np.ndarray, lc: RecurrentConfig, config) -> np.ndarray | None:
        """llama.cpp's ``[S, T, ...]`` array of a recurrent probe in the canonical layout."""
        s, t = arr.shape[:2]
        hk, hv, dk, dv = lc.n_k_heads, lc.n_v_heads, lc.k_dim, lc.v_dim
        tiled = self.lc_v_head_order(config) == "tiled" and hv != hk
        untile = (lambda a, ax, w: _untile(a, ax, hk, hv // hk)) if tiled else (lambda a, ax, w: a)
        if probe in ("rec_q", "rec_k"):
            if arr.shape[2] == hv and hv != hk:  # repeated to the value heads before the recurrence
                arr = arr[:, :, ::hv // hk] if self.lc_v_head_order(config) == "grouped" else arr[:, :, :hk]
            return arr
        if probe in ("rec_v", "rec_out"):
            return untile(arr.reshape(s, t, hv, dv), 2, 1)
        if probe == "rec_z":
            return arr if lc.kind == "short_conv" else untile(arr.reshape(s, t, hv, dv), 2, 1)
        if probe in ("rec_beta", "rec_decay"):
            a = arr.reshape(s, t, hv, -1)
            a = untile(a, 2, 1)
            return a[..., 0] if (probe == "rec_beta" or lc.decay == "per_head") else a
        if probe == "attn_branch" and lc.has_recurrence:
            return untile(arr.reshape(s, t, hv, dv), 2, 1).reshape(s, t, hv * dv)
        if probe in ("rec_conv_in", "rec_conv") and lc.has_recurrence and lc.kind == "gated_delta_net":
            qk = 2 * hk * dk
            return np.concatenate([arr[..., :qk], untile(arr[..., qk:].reshape(s, t, hv, dv), 2, 1)
                                  .reshape(s, t, hv * dv)], axis=-1)
        return arr

    def lc_state_canonical(self, r_row: np.ndarray, s_row: np.ndarray, lc: RecurrentConfig, config) -> dict:
        """One sequence's state rows of one layer (llama-memory-recurrent.cpp
        ``state_write_data``: the ``r_l`` row, the ``s_l`` row, float32) in the canonical
        layout: ``state_conv [C, K-1]`` (ggml's conv state is ``[K-1, C]`` with the rows
        fastest: channel-major, as HF's), ``state_rec [Hv, Dk, Dv]`` (ggml: ``[Dv][Dk]`` per
        head, HF's transposed)."""
        out = {}
        hk, hv, dk, dv = lc.n_k_heads, lc.n_v_heads, lc.k_dim, lc.v_dim
        if lc.conv_kernel and r_row.size:
            conv = r_row.reshape(lc.conv_channels, lc.conv_kernel - 1)
            if lc.kind == "gated_delta_net" and self.lc_v_head_order(config) == "tiled" and hv != hk:
                qk = 2 * hk * dk
                conv = np.concatenate([conv[:qk], _untile(conv[qk:].reshape(hv, dv, -1), 0, hk, hv // hk)
                                      .reshape(hv * dv, -1)])
            out["state_conv"] = conv
        if lc.has_recurrence and s_row.size:
            st = s_row.reshape(hv, dv, dk).transpose(0, 2, 1)  # ggml [Dv][Dk] -> HF [Dk][Dv]
            if self.lc_v_head_order(config) == "tiled" and hv != hk:
                st = _untile(st, 0, hk, hv // hk)
            out["state_rec"] = st
        return out


def _untile(a: np.ndarray, axis: int, nk: int, r: int, width: int = 1) -> np.ndarray:
    """Value heads along ``axis`` from tiled order (head ``i * Hk + g``: llama.cpp qwen35,
    whose converter reorders them, conversion/qwen.py ``_LinearAttentionVReorderBase``)
    back to HF's grouped order (``g * r + i``); each head is ``axis``'s length / Hv
    consecutive entries (``width`` is implied)."""
    sh = list(a.shape)
    b = a.reshape(sh[:axis] + [r, nk, sh[axis] // (r * nk)] + sh[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(b, axis, axis + 1)).reshape(sh)


@contextlib.contextmanager
def _taps(fam, model, config, sink):
    layers = fam.decoder_layers(model)
    rec = {}  # the running recurrent layer: index, rows of the call, batch
    handles, patched = [], []
    mods = {}
    for i, layer in enumerate(layers):
        if not fam.is_recurrent(config, i):
            continue
        m = layer
        for part in fam.hf_rec_module.split("."):
            m = getattr(m, part)
        mods[i] = m

        def pre(mod, args, kwargs, i=i):
            x = kwargs.get("hidden_states", args[0] if args else None)
            rec.update(layer=i, n=int(x.shape[1]), b=int(x.shape[0]), l2=0, scan=None)

        def post(mod, args, kwargs, out):
            rec.clear()

        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))
        if fam.hf_rec_gate_norm:
            def gate(mod, args, kwargs):
                z = kwargs.get("gate", args[1] if len(args) > 1 else None)
                if rec and z is not None:
                    lc = fam._rec_desc(config, rec["layer"])
                    put("rec_z", _np(z).reshape(rec["b"], rec["n"], lc.n_v_heads, lc.v_dim))
            handles.append(getattr(m, fam.hf_rec_gate_norm).register_forward_pre_hook(gate, with_kwargs=True))

    def put(probe, arr):
        sink.setdefault(rec["layer"], {})[probe] = arr

    def conv_wrap(orig):
        def wrapper(hidden_states, *args, **kwargs):
            out = orig(hidden_states, *args, **kwargs)
            if rec:
                n = rec["n"]
                put("rec_conv_in", _np(hidden_states)[..., -n:].transpose(0, 2, 1))
                put("rec_conv", _np(out)[..., -n:].transpose(0, 2, 1))
            return out
        return wrapper

    def scan_wrap(orig, name):
        def wrapper(query, key, value, *args, **kwargs):
            if rec:
                rec.update(scan=name, l2=0)
                put("rec_v", _np(value))
                put("rec_beta", _np(kwargs["beta"]))
                put("rec_decay", _np(kwargs["g"]))
            out = orig(query, key, value, *args, **kwargs)
            if rec:
                put("rec_out", _np(out[0]))
                rec["scan"] = None
            return out
        return wrapper

    def l2_wrap(orig):
        def wrapper(x, *args, **kwargs):
            out = orig(x, *args, **kwargs)
            if rec and rec.get("scan") and rec["l2"] < 2:
                lc = fam._rec_desc(config, rec["layer"])
                a = _np(out)
                if SCAN_LAYOUT[rec["scan"]] == "bhtd":
                    a = a.transpose(0, 2, 1, 3)
                if a.shape[2] != lc.n_k_heads:  # HF repeat_interleave'd the key heads first
                    a = a[:, :, :: a.shape[2] // lc.n_k_heads]
                put("rec_q" if rec["l2"] == 0 else "rec_k", a)
                rec["l2"] += 1
            return out
        return wrapper

    def mamba_wrap(orig, name):
        # HF's own signature: transformers >= 5.25 hands the scan over as a kernels
        # Func module whose signature is (*args, **kwargs) (references/hf/internals.py)
        sig = hf_signature(orig)

        def wrapper(*args, **kwargs):
            if not rec:
                return orig(*args, **kwargs)
            a = sig.bind(*args, **kwargs).arguments
            probes, z = _mamba_scan_inputs(name, a)
            for k, v in probes.items():
                put(k, v)
            if z is not None:
                # mamba_selective_scan / _state_update gate inside the scan (`scan_output * F.silu(z)`):
                # called without z, the output is y after the D skip (rec_out), gated here as HF does
                kwargs = {**{k: v for k, v in a.items() if k != "z" and k != "kwargs"}, **a.get("kwargs", {})}
                out = orig(**kwargs, z=None)
            else:
                out = orig(*args, **kwargs)
            y = out[0] if isinstance(out, tuple) else out
            put("rec_out", _mamba_scan_out(name, y))
            if z is not None:

                y = y * F.silu(z)
                out = (y, *out[1:]) if isinstance(out, tuple) else y
            return out
        return wrapper

    modnames = {type(m).__module__ for m in mods.values()}
    for modname in modnames:
        mod = sys.modules[modname]
        for fname in CONV_FUNCTIONS:
            if hasattr(mod, fname):
                patched.append((mod, fname, getattr(mod, fname)))
                setattr(mod, fname, conv_wrap(getattr(mod, fname)))
        for fname in SCAN_LAYOUT:
            if hasattr(mod, fname):
                patched.append((mod, fname, getattr(mod, fname)))
                setattr(mod, fname, scan_wrap(getattr(mod, fname), fname))
        for fname in MAMBA_SCANS:
            if hasattr(mod, fname):
                patched.append((mod, fname, getattr(mod, fname)))
                setattr(mod, fname, mamba_wrap(getattr(mod, fname), fname))
        if hasattr(mod, "l2norm"):
            patched.append((mod, "l2norm", mod.l2norm))
            mod.l2norm = l2_wrap(mod.l2norm)
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for mod, fname, orig in reversed(patched):
            setattr(mod, fname, orig)


def _mamba_scan_inputs(name: str, a: dict):
    """The canonical probes HF's Mamba scan ``name`` receives (bound arguments ``a``),
    and the gate it would apply inside (mamba1's z; None for mamba2, whose gate is the
    gated norm's): v = x, k = B, q = C, ``rec_decay`` = dt as the scan computes it
    before use -- ``softplus(dt + dt_bias)``, clamped to ``dt_limit`` in
    ``mamba2_chunk_scan`` only (``mamba2_selective_state_update`` and the Mamba-1
    scans clamp nothing) -- with the same torch ops, so it is HF's own value."""

    x, dt, b, c = a["hidden_states"], a["dt"], a["B"], a["C"]
    bias = a.get("dt_bias", a.get("delta_bias"))
    if name == "mamba2_chunk_scan":  # x [S, T, H, P], dt [S, T, H], B / C [S, T, G, N]
        d = dt + bias.to(dt.dtype) if bias is not None else dt
        d = F.softplus(d) if a.get("dt_softplus") else d
        lim = a.get("dt_limit", (0.0, float("inf")))
        d = torch.clamp(d, min=lim[0], max=lim[1])
        return {"rec_v": _np(x), "rec_k": _np(b), "rec_q": _np(c), "rec_decay": _np(d)}, None
    if name == "mamba2_selective_state_update":  # x [S, H, P], dt [S, H, P] (expanded), B / C [S, G, N]
        d = dt + bias.to(dt.dtype) if bias is not None else dt
        d = F.softplus(d) if a.get("dt_softplus") else d
        return {"rec_v": _np(x)[:, None], "rec_k": _np(b)[:, None], "rec_q": _np(c)[:, None],
                "rec_decay": _np(d[..., 0])[:, None]}, None
    if name == "mamba_selective_scan":  # x / dt [S, D, T], B / C [S, N, T]
        d = dt + bias.to(dt.dtype)[..., None] if bias is not None else dt
        d = F.softplus(d) if a.get("delta_softplus") else d
        t = lambda v: _np(v).transpose(0, 2, 1)  # noqa: E731
        z = a.get("z")
        return {"rec_v": t(x), "rec_k": t(b), "rec_q": t(c), "rec_decay": t(d),
                **({} if z is None else {"rec_z": t(z)})}, z
    # mamba_selective_state_update: x / dt [S, D], B / C [S, N]
    d = dt + bias.to(dt.dtype) if bias is not None else dt
    d = F.softplus(d) if a.get("dt_softplus") else d
    z = a.get("z")
    return {"rec_v": _np(x)[:, None], "rec_k": _np(b)[:, None], "rec_q": _np(c)[:, None],
            "rec_decay": _np(d)[:, None], **({} if z is None else {"rec_z": _np(z)[:, None]})}, z


def _mamba_scan_out(name: str, y):
    """The scan's y (after the D skip, before any gate) as ``[S, T, ...]``."""
    if name == "mamba2_chunk_scan":  # [S, T, H, P]
        return _np(y)
    if name == "mamba_selective_scan":  # [S, D, T]
        return _np(y).transpose(0, 2, 1)
    return _np(y)[:, None]  # the one-row updates: [S, H, P] / [S, D]
