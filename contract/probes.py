"""The probe vocabulary (DESIGN.md "Probe vocabulary"), in ONE place.

Every probe a reference, impl or an outside engine reports, with its canonical
layout and the names of its axes, in dataflow order inside a layer. A capture
holds ``"L{layer}.{probe}"`` -> array for the layer probes and the bare name for
the model probes; the leading axis is always the sequence (``S``).

Symbols of the shapes: ``S`` sequences, ``T`` tokens, ``H`` query heads, ``Hkv``
KV heads, ``D`` head_dim, ``Dv`` v_head_dim; MLA: ``nope`` / ``rope`` the
non-rotated and rotated query-key widths, ``r`` kv_lora_rank, ``qr``
q_lora_rank; recurrent (``contract.recurrent``): ``C`` the channels entering
the causal conv, ``K`` its kernel, ``Hk`` / ``Dk`` the q/k heads and width,
``Hv`` / ``Dv`` the value (and state) heads and width, ``W`` the output row.

The STATE probes (``state_conv``, ``state_rec``) are not rows of tokens: they
are the recurrent layer's state after each CALL of the case's schedule (axis
``calls``), compared at call boundaries -- prefill in one call, one row per
call, mixed chunks must leave the same state behind, and a sequence's state is
its own. A reference that runs no calls of the schedule (HF's full forward)
does not expose them. Which probes a layer must emit is its description's business
(``contract.layers``: ``expected_probes()``), derived from its kind and shape,
never from what a candidate chose to record.

A new probe is one ``Probe(...)`` line here, in dataflow order, plus the code
that emits it on each side.
"""

from __future__ import annotations

from dataclasses import dataclass

from .recurrent import RECURRENT_KINDS

ROW = ("seq", "tok", "ch")
HEADS = ("seq", "tok", "head", "ch")
RECURRENT = RECURRENT_KINDS
_REC_ONLY = tuple(k for k in RECURRENT if k != "short_conv")  # the kinds with a recurrence
_CONV = tuple(k for k in RECURRENT if k != "lightning")  # the kinds with a causal conv


@dataclass(frozen=True)
class Probe:
    """One probe: its name, canonical shape, the names of its axes (the report
    names the worst element by them) and what it is."""

    name: str
    shape: str
    axes: tuple[str, ...]
    doc: str
    scope: str = "layer"  # "layer": one per decoder layer; "model": one per model
    kinds: tuple[str, ...] = ("attention", "mla")  # the layer kinds that emit it (model probes: none)


_LAYER = (
    Probe("layer_in", "[S, T, hidden]", ROW, "the decoder layer's input (what a teacher-forced candidate is fed)"),
    Probe("attn_in", "[S, T, hidden]", ROW, "the input norm's output"),
    Probe("q_latent", "[S, T, qr]", ROW, "MLA, low-rank Q: the normed q_a output", kinds=("mla",)),
    Probe("q", "[S, T, H, D]", HEADS, "after projection and bias, before norms and RoPE (MLA: q_b / q output, "
                                      "[S, T, H, nope + rope])"),
    Probe("kv_latent", "[S, T, r]", ROW, "MLA: the normed compressed KV latent (kv_a_layernorm output)",
          kinds=("mla",)),
    Probe("k", "[S, T, Hkv, D]", HEADS, "after projection and bias, before norms and RoPE", kinds=("attention",)),
    Probe("v", "[S, T, Hkv, Dv]", HEADS, "after projection and bias", kinds=("attention",)),
    Probe("q_pe", "[S, T, H, rope]", HEADS, "MLA: the decoupled rope slice of Q after RoPE (interleaved pairs)",
          kinds=("mla",)),
    Probe("k_pe", "[S, T, rope]", ROW, "MLA: the shared rope slice of K after RoPE (interleaved pairs)",
          kinds=("mla",)),
    Probe("q_rope", "[S, T, H, D]", HEADS, "what enters the score product (after RoPE, post-RoPE norm, "
                                           "temperature)"),
    Probe("k_rope", "[S, T, Hkv, D]", HEADS, "the key that enters the score product (MLA naive: per head)"),
    Probe("q_absorbed", "[S, T, H, r + rope]", HEADS, "MLA absorbed form: [q_nope . k_b | q_pe]", kinds=("mla",)),
    Probe("attn_probs", "[S, H, T, T]", ("seq", "head", "tok", "key"),
          "softmax over keys (query rows, key columns; zero where masked)"),
    Probe("attn_heads", "[S, T, H, Dv]", HEADS, "softmax(QK)V per head, before any gate"),
    # recurrent layers (contract.recurrent), in the body's dataflow order
    Probe("rec_conv_in", "[S, T, C]", ROW, "recurrent: what enters the causal conv (short_conv: B * x)",
          kinds=_CONV),
    Probe("rec_conv", "[S, T, C]", ROW, "recurrent: the causal conv's output after its activation", kinds=_CONV),
    Probe("state_conv", "[S, calls, C, K-1]", ("seq", "call", "ch", "col"),
          "recurrent: the conv state after each call (the last K-1 rows that entered the conv, oldest column "
          "first; HF conv_states[..., 1:], llama.cpp's r_l)", kinds=_CONV),
    Probe("rec_z", "[S, T, Hv, Dv]", HEADS, "recurrent: the output gate's input z before its activation "
                                            "(short_conv: C, [S, T, hidden])", kinds=RECURRENT),
    Probe("rec_q", "[S, T, Hk, Dk]", HEADS, "recurrent: q entering the recurrence (after its L2 norm, before the q scale its read applies)",
          kinds=_REC_ONLY),
    Probe("rec_k", "[S, T, Hk, Dk]", HEADS, "recurrent: k entering the recurrence (after its L2 norm)",
          kinds=_REC_ONLY),
    Probe("rec_v", "[S, T, Hv, Dv]", HEADS, "recurrent: v entering the recurrence", kinds=_REC_ONLY),
    Probe("rec_beta", "[S, T, Hv]", ("seq", "tok", "head"), "recurrent: the write strength beta after its sigmoid",
          kinds=("gated_delta_net", "kimi_delta")),
    Probe("rec_decay", "[S, T, Hv]", ("seq", "tok", "head"), "recurrent: the log-decay g (per head; Kimi: per key "
                                                              "channel, [S, T, Hv, Dk])", kinds=_REC_ONLY),
    Probe("rec_out", "[S, T, Hv, Dv]", HEADS, "recurrent: the recurrence's output y, before the output norm / gate",
          kinds=_REC_ONLY),
    Probe("state_rec", "[S, calls, Hv, Dk, Dv]", ("seq", "call", "head", "dk", "dv"),
          "recurrent: the recurrent matrix after each call (HF recurrent_states' layout)", kinds=_REC_ONLY),
    Probe("attn_branch", "[S, T, H * Dv]", ROW, "what enters wo (after gates and sub-norm; recurrent: what enters "
                                                "out_proj, after the output norm / gate, [S, T, W])"),
    Probe("attn_out", "[S, T, hidden]", ROW, "what is added to the residual (after wo, its scale and bias, value "
                                             "scale, post-attention norm; with a parallel SSM branch: the "
                                             "attention's part, ssm_out the other)"),
    Probe("ssm_out", "[S, T, hidden]", ROW, "a parallel SSM branch's output (falcon_h1: the Mamba-2 block on the "
                                            "same normed row, after out_proj and its multiplier; the residual adds "
                                            "it to attn_out)", kinds=("attention",)),
    Probe("resid_mid", "[S, T, hidden]", ROW, "the residual after the attention half (sequential blocks)"),
    Probe("layer_out", "[S, T, hidden]", ROW, "the decoder layer's output (free-running sides)"),
)
_MODEL = (
    Probe("embeddings", "[S, T, hidden]", ROW, "the first layer's input", scope="model", kinds=()),
    Probe("final_norm", "[S, T, hidden]", ROW, "the final norm's output", scope="model", kinds=()),
    Probe("logits", "[S, T, vocab]", ("seq", "tok", "vocab"), "the output head's logits", scope="model", kinds=()),
)

PROBES: dict[str, Probe] = {p.name: p for p in _LAYER + _MODEL}
# the probes compared at call boundaries ([S, calls, ...]), not per token
STATE_PROBES: tuple[str, ...] = tuple(p.name for p in _LAYER if p.shape.startswith("[S, calls"))
LAYER_PROBES: tuple[str, ...] = tuple(p.name for p in _LAYER)
MODEL_PROBES: tuple[str, ...] = tuple(p.name for p in _MODEL)
ALL_PROBES: tuple[str, ...] = LAYER_PROBES + MODEL_PROBES


def axes(name: str, ndim: int) -> tuple[str, ...]:
    """The axis names of probe ``name`` for an array of ``ndim`` dimensions
    (``d0, d1, ...`` where the probe is unknown or its array has another rank)."""
    p = PROBES.get(name)
    if p is not None and len(p.axes) == ndim:
        return p.axes
    if p is None and ndim == len(ROW):
        return ROW
    return tuple(f"d{i}" for i in range(ndim))


def order(name: str) -> int:
    """Where a layer probe sits in the layer's dataflow (unknown names last)."""
    return LAYER_PROBES.index(name) if name in LAYER_PROBES else len(LAYER_PROBES)


def for_kind(kind: str) -> tuple[str, ...]:
    """The layer probes a layer of ``kind`` may emit, in dataflow order."""
    return tuple(p.name for p in _LAYER if kind in p.kinds or p.name in ("layer_in", "attn_in", "attn_branch",
                                                                          "attn_out", "resid_mid", "layer_out"))
