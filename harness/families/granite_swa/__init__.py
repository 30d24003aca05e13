"""granite_swa: granite's multipliers with interleaved sliding-window layers and a
learned per-head attention sink (HF ``GraniteSWAForCausalLM``,
transformers/models/granite_swa/modular_granite_swa.py; llama.cpp arch
``granite_swa``, src/models/granite-swa.cpp; converter conversion/granite.py
``GraniteSWAModel(GraniteModel)``).

The attention half: granite's (``GraniteSWAAttention.__init__``: ``self.scaling =
config.attention_multiplier``; ``GraniteDecoderLayer.forward``: the branch times
``residual_multiplier``; the embedding times ``embedding_multiplier``), plus
- ``layer_types``: a sliding layer sees ``sliding_window`` keys (HF's default
  pattern: every fourth layer full, ``i % 4 == 0``); llama.cpp reads the
  converter's per-layer ``attention.sliding_window_pattern`` and the window,
  ``LLAMA_SWA_TYPE_STANDARD`` (granite-swa.cpp load_arch_hparams);
- ``sinks`` [heads]: one extra logit per head in the softmax denominator.
  llama.cpp puts it there (``build_attn(..., attn_sinks, ...)``:
  ``ggml_soft_max_add_sinks``) and so does impl. HF's eager path
  (modular_granite_swa.py ``eager_attention_forward``) computes the plain
  softmax and scales the OUTPUT by ``sigmoid(logsumexp(logits) - sink)`` -- the
  same heads (``e^l / (sum e^l + e^s)`` either way), but the probabilities it
  returns are the softmax without the sink. So, probe by probe:
  ``q`` .. ``k_rope``: comparable everywhere; ``attn_probs``: comparable between
  impl and llama.cpp only -- HF's tensor is another quantity and is
  not-exposed for HF (``hf_not_exposed``, with this reason), never excused;
  ``attn_heads``, ``attn_branch``, ``attn_out`` and after: comparable everywhere
  (HF's sink scale is applied before attn_heads is read, after ``attn @ V``).
- ``layer_rope_theta`` (per-layer RoPE base, 0 = NoPE): honoured by HF and impl
  (``rope``). The converter never reads it -- it writes ``rope_pattern`` from a
  ``no_rope_layers`` key HF's config does not have -- so llama.cpp rotates every
  layer with the global theta; the tiny config keeps HF's default (every layer
  the global theta).

Converter: granite's keys (head_dim popped, the four multipliers when truthy),
then the window and the per-layer pattern; ``sinks`` renamed ``sinks.weight``
(``GraniteSWAModel.filter_tensors``); Q/K permuted per head (LlamaModel's
``modify_tensors``; granite_swa is LLAMA_ROPE_TYPE_NORM, llama-model.cpp
llama_model_rope_type). Tiny config: granite's, 4 layers (full, slide, slide,
slide), a window of 4 at 16 tokens, sinks N(0, 1) (HF's init is zeros: no mass).
"""

from __future__ import annotations

import re
import copy

from .._gguf_import import llama_like_config, read_hparams, swa_pattern
from ..granite import Granite
from harness.lazy import lazy

gguf = lazy("gguf")

# why HF's attn_probs is not granite_swa's (the module docstring)
HF_PROBS = ("HF's eager attention (modular_granite_swa.py eager_attention_forward) returns the softmax "
            "WITHOUT the sink and applies the sink as an output scale sigmoid(lse - sink); impl and "
            "llama.cpp (ggml_soft_max_add_sinks) put it in the softmax denominator: the heads agree, "
            "the probabilities are different quantities, so HF's are not compared")


class _WithSinks:
    """gguf's tensor-name map of the base arch plus the tensors the installed gguf 0.19
    cannot name for granite_swa (it has no such arch; the vendored gguf-py's
    MODEL_TENSORS[GRANITE_SWA] is granite's list plus ATTN_SINKS, and FFN_GATE_UP_EXP /
    FFN_UP_SHEXP for the MoE form): ``self_attn.sinks`` -> ``attn_sinks``
    (tensor_mapping.py), the fused experts ``block_sparse_moe.experts.gate_up_proj`` ->
    ``ffn_gate_up_exps`` (GraniteMoeSWAModel.modify_tensors keeps it fused)."""

    EXTRA = {"self_attn.sinks": "attn_sinks", "block_sparse_moe.experts.gate_up_proj": "ffn_gate_up_exps"}

    def __init__(self, tmap):
        self._tmap = tmap

    def get_name(self, name, try_suffixes=()):
        for hf, gg in self.EXTRA.items():
            m = re.fullmatch(r"model\.layers\.(\d+)\." + re.escape(hf) + r"(\.weight)?", name)
            if m:
                return f"blk.{m.group(1)}.{gg}" + (m.group(2) or "")
        return self._tmap.get_name(name, try_suffixes=try_suffixes)

    def __getattr__(self, name):
        return getattr(self._tmap, name)


class GraniteSWA(Granite):
    name = "granite_swa"
    fuzz_space = {"knobs": ("heads", "theta", "window")}
    hf_model_type = "granite_swa"
    description = "granite's multipliers, interleaved sliding window, attention sinks (HF: an output scale)"
    tiny = dict(
        Granite.tiny, num_hidden_layers=4,  # HF's default layer_types: full, slide, slide, slide
        sliding_window=4,  # 4 keys of 16 on the sliding layers
        tie_word_embeddings=False,
        # GraniteSWAConfig's own bos / eos (100257) lie outside the tiny vocabulary
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "granite_swa"
    _tensor_map_arch = "granite"  # the arch whose gguf tensor map names the rest (_WithSinks)
    # GraniteSWAAttention.sinks: nn.Parameter([num_attention_heads])
    weight_map = {**Granite.weight_map, "self_attn.sinks": "sinks"}
    hf_not_exposed = {"attn_probs": HF_PROBS}

    def uses_rope(self, config, i: int) -> bool:
        # GraniteSWAModel.forward: theta 0 -> position_embeddings None (NoPE)
        return bool(config.layer_rope_theta[i])

    def rope(self, config, i: int, head_dim: int):
        if not self.uses_rope(config, i):
            return None
        # GraniteSWAModel.__init__: one rotary embedding per theta, rope_parameters' theta replaced
        c = copy.copy(config)
        c.rope_parameters = {**config.rope_parameters, "rope_theta": config.layer_rope_theta[i]}
        return super().rope(c, i, head_dim)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/granite.py GraniteSWAModel.set_gguf_parameters: granite's, then the window
        # and the per-layer pattern from layer_types (layer_types is always set in HF's config:
        # GraniteSWAConfig.__post_init__); no rope_pattern: HF's config has no no_rope_layers
        super().gguf_params(w, config, variant)
        w.add_sliding_window(config.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])

    def gguf_tensor_map(self, config):
        arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[self._tensor_map_arch]
        return _WithSinks(gguf.get_tensor_name_map(arch, config.num_hidden_layers))

    def gguf_convert(self, name, data, config, variant=None):
        if name.endswith("sinks"):  # GraniteSWAModel.filter_tensors: `name += ".weight"`
            name += ".weight"
        yield from super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """granite-swa.cpp load_arch_hparams: the RMS eps and the logit scale (required),
        the residual / embedding / attention scales (optional: 0 means none), the
        per-layer window pattern and the window (required), the rope pattern
        (optional; a NoPE layer is HF's theta 0), the optional experts."""
        hp = read_hparams(meta)
        swa = swa_pattern(meta, hp, 0)
        if not isinstance(meta.get("attention.sliding_window_pattern", None), (list, tuple)):
            meta.refuse("attention.sliding_window_pattern", meta.get("attention.sliding_window_pattern", None),
                        "granite-swa.cpp reads a per-layer array (ml.get_arr, required)")
        # granite-swa.cpp reads no rope.freq_base_swa: the sliding layers rotate at the main base
        theta = hp.rope_freq_base
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa), moe=self._moe)
        hd = kw["hidden_size"] // kw["num_attention_heads"]
        rope_on = meta.get("attention.rope_pattern", None) or [True] * hp.n_layer
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
                  logits_scaling=meta.get_f32("logit_scale"),
                  residual_multiplier=meta.get_f32("residual_scale", 0.0) or 1.0,
                  embedding_multiplier=meta.get_f32("embedding_scale", 0.0) or 1.0,
                  attention_multiplier=meta.get_f32("attention.scale", 0.0) or float(hd) ** -0.5,
                  sliding_window=int(meta.get("attention.sliding_window")),
                  layer_types=["sliding_attention" if s else "full_attention" for s in swa],
                  layer_rope_theta=[theta if r else 0.0 for r in rope_on])
        mapping = meta.get("deepstack_mapping", None) or []
        if any(int(v) >= 0 for v in mapping):
            meta.refuse("deepstack_mapping", mapping, "vision deepstack inputs (Granite 4 Vision) are not compared here")
        kw.update(self._experts_from_gguf(meta, hp))
        return kw

    _moe = False

    def _experts_from_gguf(self, meta, hp) -> dict:
        # granite_swa's HF model is dense (llama_like_config refused experts); a shared expert too
        n = int(meta.get("expert_shared_feed_forward_length", 0) or 0)
        if n:
            meta.refuse("expert_shared_feed_forward_length", n, "a shared expert; HF GraniteSWA's FFN is dense")
        return {}


FAMILY = GraniteSWA()
