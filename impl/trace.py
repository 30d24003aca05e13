"""Probe recording: what the body computed at each canonical point.

The body calls ``trace.put(name, array)`` at the canonical points of the probe
vocabulary (DESIGN.md) when a trace is passed, and does nothing when it is not.
A trace holds one sequence of one layer; calls append rows, so prefill, decode
and any schedule between assemble to the same ``[tokens, ...]`` arrays.

A recurrent layer also records its STATE after each call (``put_state``, one
snapshot per call); ``assemble`` stacks the snapshots of a name along a leading
``calls`` axis (``state_conv [calls, C, K-1]``, ``state_rec [calls, ...]``;
layouts in ``impl.recurrent.RECURRENT_STATES``), so states are compared at call
boundaries and a schedule's states are compared against the same schedule's.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

# Dataflow order inside a layer (DESIGN.md "Probe vocabulary").
LAYER_PROBES = (
    "layer_in",
    "attn_in",
    "q_latent",  # MLA, low-rank Q: the normed q_a output (impl.mla)
    "q",
    "kv_latent",  # MLA: the normed compressed KV latent (kv_a_layernorm output)
    "k",
    "v",
    "q_pe",  # MLA: the decoupled rope slice of Q after RoPE, [T, H, rope]
    "k_pe",  # MLA: the shared rope slice of K after RoPE, [T, rope]
    "q_rope",
    "k_rope",
    "q_absorbed",  # MLA absorbed form: [q_nope . k_b | q_pe], [T, H, kv_lora_rank + rope]
    "attn_probs",
    "attn_heads",
    # recurrent layers (impl.recurrent.RECURRENT_PROBES / RECURRENT_STATES)
    "rec_conv_in",
    "rec_conv",
    "state_conv",  # the conv state after each call (Trace.put_state)
    "rec_z",
    "rec_q",
    "rec_k",
    "rec_v",
    "rec_beta",
    "rec_decay",
    "rec_out",
    "state_rec",  # the recurrent matrix after each call (Trace.put_state)
    "attn_branch",
    "attn_out",
    "ssm_out",  # a parallel SSM branch's output (falcon_h1: impl.attention.attn_block), summed with attn_out
    "resid_mid",
    "layer_out",
)
MODEL_PROBES = ("embeddings", "final_norm", "logits")


class Trace:
    def __init__(self, backend):
        self.backend = backend
        self.rows: dict[str, list[np.ndarray]] = defaultdict(list)
        self.probs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.states: dict[str, list[np.ndarray]] = defaultdict(list)

    def put(self, name: str, array) -> None:
        self.rows[name].append(self.backend.to_numpy(array))

    def put_state(self, name: str, array) -> None:
        """One snapshot of a state after a call (``state_conv``, ``state_rec``)."""
        self.states[name].append(self.backend.to_numpy(array))

    def put_probs(self, probs, q_pos, k_pos) -> None:
        """``probs[heads, n_query, n_keys]`` with the positions of both axes."""
        self.probs.append((self.backend.to_numpy(probs), np.asarray(q_pos), np.asarray(k_pos)))

    def assemble(self) -> dict[str, np.ndarray]:
        out = {name: np.concatenate(chunks, axis=0) for name, chunks in self.rows.items()}
        out.update({name: np.stack(snaps, axis=0) for name, snaps in self.states.items()})
        if self.probs:
            n_tok = max(int(q.max()) for _, q, _ in self.probs) + 1
            n_heads = self.probs[0][0].shape[0]
            full = np.zeros((n_heads, n_tok, n_tok))
            for p, q, k in self.probs:
                full[:, q[:, None], k[None, :]] = p
            out["attn_probs"] = full
        return out
