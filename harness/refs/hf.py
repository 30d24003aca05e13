"""HF transformers as a reference: forward hooks read the canonical probes.

Module probes come from forward (pre-)hooks at the points the family names
(``Family.hf_points``). The four probes that live inside the attention function
-- ``q_rope``, ``k_rope`` (what enters the score product), ``attn_probs`` and
``attn_heads`` (softmax(QK)V per head) -- come from wrapping the family's own
eager attention function for the duration of the forward: the model is built
with ``attn_implementation="eager"`` and its attention module looks the
function up in its modeling module's globals at call time
(``ALL_ATTENTION_FUNCTIONS.get_interface(..., eager_attention_forward)``), so
the wrapper sees exactly the tensors HF computes with, sinks and softcap and
masks included. A model whose attention math is inline (bloom, mpt: no eager
function) records those probes through its family's ``hf_taps`` instead.

A capture is a dict ``"L{layer}.{probe}" -> float64 array [seqs, ...]`` plus
model-level ``embeddings``, ``final_norm`` and ``logits``.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np


def _to_np(t):
    import torch

    return t.detach().to(dtype=torch.float64).cpu().numpy()


def _first_tensor(args, kwargs, key="hidden_states"):
    if key in kwargs and kwargs[key] is not None:
        return kwargs[key]
    return args[0] if args else None


def _resolve(root, path: str):
    obj = root
    if not path:
        return obj
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@contextmanager
def _wrapped_eager(family, model, sink: dict, attn_implementation: str = "eager"):
    """Replace the attention function the model's attention modules call -- the
    eager function in every modeling module they come from, or, for another
    ``attn_implementation`` (sdpa, flex_attention), transformers' registered one
    (``AttentionInterface._global_mapping``, which ``ALL_ATTENTION_FUNCTIONS.
    get_interface`` returns at call time) -- and record what it is called with
    and returns. Only the eager function's second result is the probabilities
    (sdpa returns None, flex_attention the log-sum-exp)."""
    patched = []

    def wrap(orig, probs: bool):
        def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            out, weights = orig(module, query, key, value, attention_mask, *args, **kwargs)
            rec = sink.setdefault(int(module.layer_idx), {})
            rec["q_rope"] = _to_np(query)
            rec["k_rope"] = _to_np(key)
            rec["attn_heads"] = _to_np(out)
            if probs and weights is not None:
                rec["attn_probs"] = _to_np(weights)
            return out, weights
        return wrapper

    if attn_implementation == "eager":
        modules = {type(m).__module__ for m in model.modules() if hasattr(m, "layer_idx")}
        for modname in modules:
            mod = sys.modules.get(modname)
            orig = getattr(mod, family.eager_name, None) if mod else None
            if orig is None:
                continue
            setattr(mod, family.eager_name, wrap(orig, True))
            patched.append((mod, family.eager_name, orig))
    else:
        from transformers.modeling_utils import AttentionInterface

        table = AttentionInterface._global_mapping
        orig = table[attn_implementation]
        table[attn_implementation] = wrap(orig, False)
        patched.append((table, attn_implementation, orig))
    try:
        yield
    finally:
        for owner, attr, orig in patched:
            if isinstance(owner, dict):
                owner[attr] = orig
            else:
                setattr(owner, attr, orig)


def capture(family, model, config, layer_cfgs, tokens: np.ndarray, meta: dict | None = None,
            force_inputs: dict | None = None, attn_implementation: str = "eager") -> dict[str, np.ndarray]:
    """Run ``tokens[seqs, T]`` through ``model`` and read every probe. A float64
    model runs with every float32 side path of its modeling code promoted
    (``hf_float64``), so a float64 capture is float64 throughout; ``meta`` (if
    given) receives what could not be promoted.

    ``force_inputs`` (``{"L{i}.layer_in": [seqs, T, hidden]}``): teacher-force HF
    itself -- decoder layer ``i`` computes on that input instead of the previous
    layer's output (a forward pre-hook replaces its ``hidden_states``), while the
    model's own masks, positions and rotary tables are made as always. This is
    the float64 oracle of a low-precision comparison: HF's arithmetic in float64 on
    exactly the layer inputs the low-precision reference saw, so its distance to
    that reference is the reference's own rounding in that layer, not the drift
    of a free-running model (or an MoE routing flip) accumulated before it.

    ``attn_implementation``: the transformers attention path ``model`` was set to
    (``set_attn_implementation``); its function is the one wrapped."""
    import contextlib

    import torch

    from .hf_float64 import float64_paths

    layers = family.decoder_layers(model)
    got: dict[str, np.ndarray] = {}
    handles = []

    def hook_for(key: str, io: str):
        if io == "in":
            def pre(mod, args, kwargs):
                t = _first_tensor(args, kwargs)
                if t is not None:
                    got[key] = _to_np(t)
            return pre, True
        def post(mod, args, kwargs, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if hasattr(t, "detach"):
                got[key] = _to_np(t)
        return post, False

    def forcer(x):
        def pre(mod, args, kwargs):
            t = torch.as_tensor(x, dtype=next(model.parameters()).dtype)
            if args:
                return (t, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": t}
        return pre

    for i, layer in enumerate(layers):
        if force_inputs is not None and f"L{i}.layer_in" in force_inputs:
            # prepended: the layer_in probe hook below then records the forced input
            handles.append(layer.register_forward_pre_hook(forcer(force_inputs[f"L{i}.layer_in"]), with_kwargs=True,
                                                           prepend=True))
        for probe, point in family.hf_points_for(config, i).items():
            mod = _resolve(layer, point.path)
            if mod is None:
                continue
            fn, is_pre = hook_for(f"L{i}.{probe}", point.io)
            if is_pre:
                handles.append(mod.register_forward_pre_hook(fn, with_kwargs=True))
            else:
                handles.append(mod.register_forward_hook(fn, with_kwargs=True))
    for name, (path, io) in family.hf_model_points.items():
        mod = _resolve(model, path)
        if mod is not None:
            fn, is_pre = hook_for(name, io)
            reg = mod.register_forward_pre_hook if is_pre else mod.register_forward_hook
            handles.append(reg(fn, with_kwargs=True))

    eager: dict[int, dict] = {}
    f64 = next(model.parameters()).dtype == torch.float64
    try:
        # the float64 promotion outermost: the eager wrapper then wraps the promoted function
        with (float64_paths(model) if f64 else contextlib.nullcontext()) as fp, torch.no_grad(), \
                _wrapped_eager(family, model, eager, attn_implementation), family.hf_taps(model, config, eager):
            out = model(input_ids=torch.as_tensor(tokens, dtype=torch.long), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    if meta is not None and fp is not None:
        meta["float64_kept_float32"] = sorted(set(fp.kept_float32))
    got["logits"] = _to_np(out.logits)
    for i, rec in eager.items():
        for probe, arr in rec.items():
            got[f"L{i}.{probe}"] = arr

    # canonical layouts
    for key in list(got):
        if not key.startswith("L"):
            continue
        layer_s, probe = key.split(".", 1)
        lc = layer_cfgs[int(layer_s[1:])]
        got[key] = family.hf_canonical(probe, got[key], lc)
    # probes that are views of tensors HF computes with but exposes only inside
    # another (MLA: the rope slices of the query and key the attention function reads)
    got.update(family.hf_derived(got, config, layer_cfgs))
    return got
