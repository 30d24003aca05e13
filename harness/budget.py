"""What a case needs before it runs: positions the model has, memory the
machine has. Checked before any work, so an impossible case is one line and
exit status 2 instead of a crash (or a swap storm) halfway through.

``estimate`` is the one memory estimate of a case (issue 13 extends it); it is
a LOWER bound, made of parts that are certainly held at once:

- attention probabilities: every captured reference keeps ``attn_probs`` of
  every layer as float64 (``[seqs, heads, tokens, tokens]``), and impl's
  teacher-forced run keeps its own for the reference it is compared with --
  so ``(references + 1) x layers x seqs x heads x tokens^2 x 8`` bytes;
- weights: the float32 model every reference and impl take their weights from
  (embeddings, the attention projections each layer config implies and the
  dense FFN; MoE experts beyond one are left out, so it stays a lower bound).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import UsageError

# the config keys families name their position limit by, in the order they are read
POSITION_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions", "model_max_length", "seq_length")
GiB = 1024**3


def max_positions(config) -> tuple[str, int] | None:
    """``(key, limit)`` of the model's position limit, or None where the config has
    none (ALiBi bloom: its biases are defined for any length)."""
    for k in POSITION_KEYS:
        v = getattr(config, k, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k, v
    return None


@dataclass(frozen=True)
class Estimate:
    probs_bytes: int
    weights_bytes: int
    copies: int
    layers: int
    heads: int
    tokens: int
    seqs: int

    @property
    def total(self) -> int:
        return self.probs_bytes + self.weights_bytes

    def describe(self) -> str:
        return (f"at least {_gib(self.total)} (attention probabilities {self.copies} copies x {self.layers} layers x "
                f"{self.seqs} seqs x {self.heads} heads x {self.tokens}^2 x 8 B = {_gib(self.probs_bytes)}; "
                f"weights {_gib(self.weights_bytes)})")


def _gib(n: float) -> str:
    return f"{n / GiB:.3g} GiB"


def _attn_params(lc) -> int:
    hidden = int(getattr(lc, "hidden_size", 0) or 0)
    nh = int(getattr(lc, "n_heads", 0) or 0)
    if hasattr(lc, "kv_lora_rank"):  # MLA (impl.mla.MlaConfig)
        qk = lc.qk_nope_head_dim + lc.qk_rope_head_dim
        q = hidden * nh * qk if not lc.q_lora_rank else hidden * lc.q_lora_rank + lc.q_lora_rank * nh * qk
        kv = hidden * (lc.kv_lora_rank + lc.qk_rope_head_dim) + lc.kv_lora_rank * nh * (lc.qk_nope_head_dim + lc.v_head_dim)
        return q + kv + nh * lc.v_head_dim * hidden
    hd = int(getattr(lc, "head_dim", 0) or 0)
    nkv = int(getattr(lc, "n_kv_heads", 0) or 0)
    dv = getattr(lc, "v_head_dim", None) or hd
    return hidden * (nh * hd + nkv * hd + nkv * dv) + nh * dv * hidden


def estimate(config, layer_cfgs, tokens: int, seqs: int, references: int) -> Estimate:
    """The lower bound of what one case holds at once (see the module doc)."""
    heads = max((int(getattr(lc, "n_heads", 0) or 0) for lc in layer_cfgs), default=0)
    layers = sum(1 for lc in layer_cfgs if getattr(lc, "n_heads", 0))
    copies = references + 1
    probs = copies * layers * seqs * heads * tokens * tokens * 8
    hidden = max((int(getattr(lc, "hidden_size", 0) or 0) for lc in layer_cfgs), default=0)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    ffn = int(getattr(config, "intermediate_size", 0) or 0) * hidden * 3
    params = vocab * hidden * (1 if tied else 2) + sum(_attn_params(lc) + ffn for lc in layer_cfgs)
    return Estimate(probs, params * 4, copies, layers, heads, tokens, seqs)


def available_bytes() -> int | None:
    """Memory the kernel says is available now (``MemAvailable``), else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check(run) -> None:
    """Refuse (UsageError) a case its model cannot hold or this machine cannot fit.
    ``run``: a ``CaseRun`` (its config and layer configs are all this reads)."""
    case = run.case
    lim = max_positions(run.config)
    if lim and case.tokens > lim[1]:
        key, n = lim
        raise UsageError(f"--tokens {case.tokens} is past family {run.family.name}'s {key}={n}; use at most {n} "
                         f"tokens, or --set {key}=N")
    est = estimate(run.config, run.layer_cfgs, case.tokens, case.n_seqs, len(case.refs))
    avail = available_bytes()
    if avail is not None and est.total > avail:
        raise UsageError(f"--tokens {case.tokens} with --seqs {case.n_seqs} needs {est.describe()}; this machine has "
                         f"{_gib(avail)} available; use fewer tokens or sequences")
