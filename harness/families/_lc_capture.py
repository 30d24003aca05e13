"""Where a family's probes live in llama.cpp's graph: the callback names
(``cb(cur, name, il)`` in src/models/<arch>.cpp) each probe is read from, and
the family's canonical layout of what the graph hands back
(harness/references/llamacpp/capture.py drives these hooks)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract.layers import LayerConfig


@dataclass(frozen=True)
class LcPoint:
    """Where a probe is read in llama.cpp's graph: a callback name (``cb(cur,
    name, il)``), which occurrence of it (``pick``: ``last``, ``first``,
    ``pre_rope`` -- the last one before the ROPE node --, ``rope`` -- the ROPE
    node itself --, or ``op:NAME``), and its layout: ``rows`` ([tokens,
    channels]), ``heads`` ([tokens, heads, dim]) or ``probs`` ([streams, heads,
    tokens, kv cells])."""

    name: str
    pick: str = "last"
    layout: str = "rows"



class LcCapture:
    """The llama.cpp-capture half of ``Family`` (mixed in)."""

    # llama.cpp's probe points, per layer; a probe not named here is "not exposed".
    lc_points: dict[str, LcPoint] = {
        "attn_in": LcPoint("attn_norm"),
        "q": LcPoint("Qcur", "pre_rope", "heads"),
        "k": LcPoint("Kcur", "pre_rope", "heads"),
        "v": LcPoint("Vcur", "last", "heads"),
        "q_rope": LcPoint("Qcur", "rope", "heads"),
        "k_rope": LcPoint("Kcur", "rope", "heads"),
        "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
        "attn_heads": LcPoint("kqv_out"),
        "attn_branch": LcPoint("kqv_out"),
        "attn_out": LcPoint("attn_out"),
        "resid_mid": LcPoint("ffn_inp"),
        "layer_out": LcPoint("l_out"),
    }
    # model-level: the first layer's input, the final norm, the logits
    lc_model_points: dict[str, LcPoint] = {
        "embeddings": LcPoint("embd"),
        "final_norm": LcPoint("result_norm"),
        "logits": LcPoint("result_output"),
    }

    # probe -> why llama.cpp's graph exposes no tensor for it (the report's not-exposed
    # reason; default: none given)
    lc_not_exposed: dict[str, str] = {}

    def lc_refusal(self, config) -> str | None:
        """Why llama.cpp cannot hold ``config`` at all (hookspec.py), or None (default)."""
        return None

    def lc_points_for(self, config, i: int) -> dict[str, LcPoint]:
        return self.lc_points

    def lc_layer_input(self, config, i: int) -> tuple[str, LcPoint]:
        """Where layer ``i``'s input lives in llama.cpp: the embeddings for layer 0,
        the previous layer's ``l_out`` after that."""
        if i == 0:
            return "embeddings", self.lc_model_points["embeddings"]
        return f"L{i - 1}.layer_out", LcPoint("l_out")

    def lc_input_sum(self, config, i: int) -> tuple[LcPoint, ...] | None:
        """Where the graph names no tensor for layer ``i``'s input (``lc_layer_input``
        None) but names the float32 tensors it adds to make it, those (full names:
        ``LcPoint("stack_norm-4")``): the capture sums them in float32 as ``ggml_add``
        does (elementwise, exact), and the meta says the input was derived. None
        (default): no such sum."""
        return None

    def lc_canonical(self, probe: str, arr: np.ndarray, lc, config) -> np.ndarray:
        """llama.cpp's array ([seqs, tokens, ...] after token placement) in the
        canonical layout: reshape head-major rows, undo converter permutations."""
        return self.hf_canonical_heads(probe, arr, lc)

    def hf_canonical_heads(self, probe: str, arr: np.ndarray, lc) -> np.ndarray:
        if not isinstance(lc, LayerConfig) or lc.shape != "gqa":
            return arr
        if probe in ("q", "k") and arr.ndim == 3:
            # a projection read before its reshape (LcPoint layout "rows"): [seqs, tokens, heads * D]
            return arr.reshape(*arr.shape[:2], lc.n_heads if probe == "q" else lc.n_kv_heads, lc.head_dim)
        if probe == "attn_heads" and arr.ndim == 3:
            return arr.reshape(arr.shape[0], arr.shape[1], lc.n_heads, lc.dv)
        return arr


def lc_unrotated(points: dict[str, LcPoint], q: str = "Qcur", k: str = "Kcur") -> dict[str, LcPoint]:
    """``points`` for a layer llama.cpp does not rotate: there is no ROPE node, so
    ``q_rope`` / ``k_rope`` are the last ``q`` / ``k`` tensors, the ones that enter
    the attention."""
    return {**points, "q_rope": LcPoint(q, "last", "heads"), "k_rope": LcPoint(k, "last", "heads")}


def lc_nope_points(**names: LcPoint | None) -> dict[str, LcPoint]:
    """llama.cpp's points of an attention layer with no RoPE node: the default
    points with ``q`` / ``k`` the last Qcur / Kcur (the tensors that enter kq)
    and ``q_rope`` / ``k_rope`` the same ones (``lc_unrotated``); ``names``
    renames a probe's tensor, or drops the probe (``None``: not exposed) --
    the archs differ only in what they call the wo product and the residuals
    (jamba.cpp: ``ffn_inp``; nemotron-h.cpp: ``attn_out`` and its block output)."""
    points = {**LcCapture.lc_points, "q": LcPoint("Qcur", "last", "heads"), "k": LcPoint("Kcur", "last", "heads")}
    for probe, point in names.items():
        if point is None:
            points.pop(probe, None)
        else:
            points[probe] = point
    return lc_unrotated(points)


# llama.cpp's points of a layer with a fused QKV projection and no RoPE (bloom.cpp,
# mpt.cpp: ALiBi): q / k / v are the views build_qkv takes of the fused wqkv, and the
# same tensors enter kq; build_attn's wo product carries no name, so attn_out is not
# exposed
FUSED_QKV_NOPE_LC_POINTS = lc_nope_points(attn_out=None)


