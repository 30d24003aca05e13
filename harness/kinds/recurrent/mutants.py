"""Mutants of the recurrent body (impl.recurrent, impl.recurrent_kinds, impl.kv's
recurrent slot): each breaks one recurrent decoration the way an engine plausibly
would -- a sign, a squash, a row of the conv state, a norm, the head map, the state
between calls, the state between sequences -- on a case that exercises it, and names
the probe where it first shows against HF (the full forward: teacher-forced rows;
the state probes themselves are compared against the references that run the
case's calls, hf_cached and llama.cpp).

No reference can switch a recurrent decoration off in the seeded model (HF's
modules and llama.cpp's graphs have no setting for any of them), so feature
bisection lists each as unswitchable (``bisect_note``)."""

from ..mutant import Mutant

NOTE = ("no switch turns a recurrent layer's {what} off in the seeded model (neither HF's modules nor "
        "llama.cpp's graph has a setting for it): listed as unswitchable")

QWEN3_NEXT = {"family": "qwen3_next", "schedule": "mixed", "tokens": 16}
MINIMAX = {"family": "minimax"}

MUTANTS = [
    Mutant("recurrent-decay-sign", "log_decay", "impl.recurrent",
           'neg_a = -xp.exp(f(w["A_log"]))\n        if cfg.decay == "per_key":',
           'neg_a = xp.exp(f(w["A_log"]))\n        if cfg.decay == "per_key":',
           QWEN3_NEXT, "rec_decay",
           doc="the log-decay's sign flipped: g = +exp(A_log) * softplus(...), a state that grows by exp(g) > 1 "
               "every row instead of decaying (HF -A_log.exp() * softplus; the converter writes -exp(A_log))",
           bisect_note=NOTE.format(what="log-decay")),
    Mutant("recurrent-beta-not-squashed", "beta_gate", "impl.recurrent",
           'beta = _sigmoid(xp, f(_linear(xp, normed, w["w_beta"], None)))',
           'beta = f(_linear(xp, normed, w["w_beta"], None))',
           {"family": "kimi_linear"}, "rec_beta",
           doc="beta is the raw projection b, not sigmoid(b) (HF b.sigmoid(); llama.cpp beta_sigmoid): the delta "
               "rule's write strength leaves (0, 1)",
           bisect_note=NOTE.format(what="beta")),
    Mutant("recurrent-conv-state-shifted", "causal_conv", "impl.recurrent",
           "slot.conv = full[full.shape[0] - (kk - 1):] if kk > 1 else full[0:0]",
           "slot.conv = full[full.shape[0] - kk:full.shape[0] - 1] if kk > 1 else full[0:0]",
           {"family": "lfm2", "schedule": "mixed"}, "rec_conv",
           doc="the conv state kept between calls is one row off: it drops the call's last row and keeps one "
               "stale row before the window (HF conv_states[..., -K:], llama.cpp conv_state_last: the last K-1 "
               "rows of state ++ rows); the first call is right, every later call's conv reads a wrong window",
           bisect_note=NOTE.format(what="causal conv")),
    Mutant("recurrent-l2-norm-dropped", "qk_l2_norm", "impl.recurrent",
           "q = q / xp.sqrt(xp.sum(q * q, axis=-1, keepdims=True) + cfg.qk_norm_eps)\n"
           "        k = k / xp.sqrt(xp.sum(k * k, axis=-1, keepdims=True) + cfg.qk_norm_eps)",
           "pass",
           QWEN3_NEXT, "rec_q",
           doc="q and k enter the recurrence without their L2 norm (HF l2norm(use_qk_l2norm_in_kernel=True), "
               "llama.cpp build_gdn_l2_norm)",
           bisect_note=NOTE.format(what="q/k L2 norm")),
    Mutant("recurrent-head-map-tiled", "grouped_v_heads", "impl.recurrent_kinds",
           'h // (hv // hk) if cfg.head_map == "grouped" else h % hk',
           'h % hk if cfg.head_map == "grouped" else h // (hv // hk)',
           {"family": "qwen3_5_text"}, "rec_out",
           doc="grouped value heads read their key head tiled (h % Hk, llama.cpp qwen35.cpp's order) instead of "
               "grouped (h // (Hv / Hk), HF repeat_interleave): the map of the wrong reference",
           bisect_note=NOTE.format(what="value-head map")),
    Mutant("recurrent-state-not-carried", "recurrent_state", "impl.recurrent",
           "if slot.rec is None:\n        slot.rec = xp.zeros(",
           "if True:\n        slot.rec = xp.zeros(",
           QWEN3_NEXT, "rec_out",
           doc="every call starts the recurrence from a zero state: prefill in one call is right, every later "
               "call forgets what came before (HF initial_state=recurrent_state; llama.cpp build_rs)",
           bisect_note=NOTE.format(what="state")),
    Mutant("lightning-slopes-reversed", "lightning", "impl.recurrent",
           "g = xp.zeros((n, hv), dtype=acc, **_dev(be)) - slopes",
           "g = xp.zeros((n, hv), dtype=acc, **_dev(be)) - xp.flip(slopes, axis=0)",
           MINIMAX, "rec_decay",
           doc="lightning's per-head slopes applied in reverse head order (head h decays with head H-1-h's "
               "slope; HF get_slope_rate `base ** (arange(H) + 1)`, minimax-01.cpp `start * powf(ratio, h)`)",
           bisect_note=NOTE.format(what="slope decay")),
    Mutant("normed-residual-alpha-dropped", "normed_residual", "impl.recurrent",
           "    if cfg.residual_alpha != 1.0:\n        base = base * cfg.residual_alpha",
           "    if False:\n        base = base * cfg.residual_alpha",
           MINIMAX, "resid_mid",
           doc="the normed input the branch is added to is not scaled by alpha (HF MiniMaxDecoderLayer "
               "`residual * linear_attn_alpha_factor`; minimax-01.cpp `ggml_scale(residual, f_residual_scale)`)",
           bisect_note=NOTE.format(what="residual alpha")),
    Mutant("recurrent-state-on-the-pool", "kv_paged", "impl.kv",
           "case Decode(holder) | Batched(holder) | Paged(holder, _):\n            if holder.recurrent is None:",
           'case Decode(holder) | Batched(holder) | Paged(_, holder):\n'
           '            if getattr(holder, "recurrent", None) is None:',
           {"family": "qwen3_next", "kv": "paged"}, "rec_conv",
           doc="the paged backing keeps the recurrent state on the page pool the sequences share, not on the "
               "sequence (spec KvStep::recurrent_slot: Paged's cache is the sequence's): the second sequence "
               "continues the first one's state"),  # the paged backing's bug: bisection names kv_paged
]
