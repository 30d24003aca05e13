"""glm_moe_dsa: GLM-5's multi-head latent attention with DeepSeek sparse
attention (HF ``GlmMoeDsaForCausalLM``, modeling_glm_moe_dsa.py
``GlmMoeDsaAttention`` + ``GlmMoeDsaIndexer``; llama.cpp arch ``glm-dsa``,
src/models/glm-dsa.cpp; converter conversion/glm.py ``GlmMoeDsaModel``, a
``DeepseekV2Model``).

The MLA layer: low-rank Q (required by both HF and llama.cpp), the latent and
its shared rope slice, interleaved RoPE of the decoupled slices (HF
``apply_rotary_pos_emb_interleave``: pairs like ggml NORM, the slice returned
de-interleaved -- re-interleaved by the capture). The two variants as in
deepseek_v2.py, except that llama.cpp's glm-dsa graph runs only the absorbed
form ("GLM_DSA architecture requires MLA", glm-dsa.cpp
``load_arch_hparams``): the ``naive`` variant is compared with HF only (its
llama.cpp reference reports an error row that says so).

The sparse-attention indexer: each full layer scores every visible key
(relu'd multi-head dot products of its own projections, weighted per head),
keeps the ``index_topk`` best, and masks the rest out of the attention
(``GlmMoeDsaAttention.forward``: ``attention_mask.masked_fill(index_mask,
finfo.min)``; llama.cpp ``build_attn`` with the DSA input: -inf except at the
top-k). A query at position i sees i + 1 keys, so nothing is dropped while the
sequence is at most ``index_topk`` long. The tiny config sets ``index_topk =
max_position_embeddings = 512``: the indexer runs in both references but never
changes which positions are attended, so HF and llama.cpp compute plain causal
MLA there -- the MLA impl implements. impl has no DSA indexer: a config whose
``index_topk`` is below ``max_position_embeddings`` (where some length makes the
indexer drop keys) lists its MLA layers as not implemented, and HF and
llama.cpp are still compared with each other (the HF-only config below).

Tiny config: hidden 64, 3 layers (layer 0 dense, 1-2 MoE, 4 experts), 4 heads,
q/kv lora 24, nope 12 / rope 8 / v 10, default RoPE (real GLM-5 has no YaRN),
indexer 4 heads x 64 (llama.cpp's Hadamard rotation of the indexer cache needs
a multiple of 64), ``rms_norm_eps = 1e-6`` (HF's latent norms use 1e-6 whatever
it says; the indexer's LayerNorm eps is 1e-6 in HF and 0 in llama.cpp, which
only matters to the indexer scores).

Extra configs:
- both references: YaRN with only ``mscale_all_dim`` -- ``--set
  rope_parameters.rope_type=yarn --set rope_parameters.factor=4.0 --set
  rope_parameters.original_max_position_embeddings=128 --set
  rope_parameters.mscale_all_dim=1.0``: the magnitude L(1) on the rotated
  channels and L(1)^2 in the softmax scale, the one YaRN setting glm-dsa
  reproduces (it never reads ``yarn_log_multiplier``).
- HF-only: the same plus ``--set rope_parameters.mscale=1.0`` (HF magnitude 1,
  llama.cpp still L(1)): a ``[[finding]]``.
- HF vs llama.cpp only: ``--set index_topk=8`` -- the indexer drops keys from
  position 8 on at 16 tokens (MLA layers not implemented in impl; the two
  references agree, no top-k ties at seed 0).
"""

from __future__ import annotations

from .._mla import MlaFamily, mla_lc_points
from ..base import LcPoint, NotInImpl
from .._gguf_import import read_hparams

DSA_REASON = ("DeepSeek sparse attention: the indexer's top-k key selection (HF GlmMoeDsaIndexer, llama.cpp "
              "glm-dsa.cpp) is not implemented in impl; it is inert only while index_topk >= the sequence length")


class GlmMoeDsa(MlaFamily):
    name = "glm_moe_dsa"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    # the context length with the indexer's top-k (the generic knob would leave index_topk at
    # 512 under a longer context, where impl implements no layer: _indexer_inert)
    fuzz_space = {"knobs": ("mla", "values"), "values": {
        ("max_position_embeddings", "index_topk"): ((512, 512), (4096, 4096))}}
    hf_model_type = "glm_moe_dsa"
    description = "MLA (absorbed; naive vs HF only), low-rank Q, interleaved RoPE, DSA indexer (inert at index_topk >= tokens), MoE"
    gguf_arch = "glm-dsa"
    hf_rope_deinterleaves = True
    lc_naive_unsupported = ('glm-dsa.cpp load_arch_hparams throws "GLM_DSA architecture requires MLA" unless the '
                            "file has the _mla keys, and then requires attn_k_b / attn_v_b (no attn_kv_b)")
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=24, q_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        index_n_heads=4, index_head_dim=64, index_topk=512,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
    )

    def _indexer_inert(self, config) -> bool:
        return config.index_topk >= config.max_position_embeddings

    def layer_config(self, config, i, variant="absorbed"):
        if not self._indexer_inert(config):
            return NotInImpl("mla_dsa", DSA_REASON)
        return super().layer_config(config, i, variant)

    def hf_canonical(self, probe, arr, lc):
        # a layer not in impl keeps HF's raw layouts (no MLA canonical form, see
        # lc_points_for) -- but the eager query and key still go rows-first ([S, H, T, D]
        # -> [S, T, H, D], nothing reinterleaved): hf_cached puts its calls' probes
        # together along the token axis (references/hf/capture.py _merge_calls), and
        # only the head-major layout had tokens elsewhere (its calls failed to merge)
        if isinstance(lc, NotInImpl) and probe in ("q_rope", "k_rope") and arr.ndim == 4:
            return arr.transpose(0, 2, 1, 3)
        return super().hf_canonical(probe, arr, lc)

    def layer_weights(self, model, config, i):
        return super().layer_weights(model, config, i) if self._indexer_inert(config) else {}

    def lc_points_for(self, config, i):
        # glm-dsa.cpp: the Q latent is `qr` (q_a, then its norm); `q` is q_b's product
        pts = mla_lc_points(q_latent=LcPoint("qr", "last"))
        pts["q"] = LcPoint("q", "last", "rows")  # [T, H * (nope + rope)], never reshaped under that name
        if not self._indexer_inert(config):
            # the layer is not in impl, so neither side is put into the MLA canonical
            # layouts: keep the probes whose raw layouts already agree with HF's
            pts = {k: pts[k] for k in ("attn_in", "q_latent", "q", "kv_latent", "attn_probs", "attn_branch",
                                       "resid_mid", "layer_out")}
        return pts

    def gguf_params(self, w, config, variant=None):
        variant = variant or self.variants[0]
        self.check_lc_variant(variant)
        self.deepseek_params(w, config, variant)
        # GlmMoeDsaModel.set_gguf_parameters: the rotated width, the indexer
        rp = dict(config.rope_parameters or {})
        self.put(w, "rope.dimension_count", int(config.qk_rope_head_dim * rp.get("partial_rotary_factor", 1.0)),
                 w.add_rope_dimension_count)
        w.add_indexer_head_count(config.index_n_heads)
        w.add_indexer_key_length(config.index_head_dim)
        w.add_indexer_top_k(config.index_topk)
        if config.indexer_types is not None:
            # gguf_writer.add_indexer_types (the vendored gguf-py; the installed gguf
            # 0.19 lacks the helper, so the key is written by name)
            w.add_array(f"{w.arch}.attention.indexer.types", [t == "full" for t in config.indexer_types])

    def config_from_gguf(self, meta, shapes, tensors):
        """glm-dsa.cpp load_arch_hparams: the common MLA keys, the RoPE sections
        (read; no mrope in this graph), the Q and KV ranks (required: "GLM_DSA
        architecture requires MLA"), the experts' weights' scale / norm and the
        gating function (default sigmoid -- HF's router is sigmoid only), the
        indexer's heads, key length, top-k and per-layer types (default: all
        full below a 1M context). It never reads a YaRN log multiplier."""

        hp = read_hparams(meta)
        kw = self.mla_common(meta, shapes, hp)
        meta.get("rope.dimension_sections", None)
        if int(meta.get("expert_gating_func", 2)) not in (0, 2):
            meta.refuse("expert_gating_func", meta.get("expert_gating_func"), "HF GlmMoeDsa routes by sigmoid (2)")
        if "blk.0.attn_kv_b.weight" in shapes:
            meta.refuse("attention.key_length_mla", None, "the legacy (attn_kv_b) form: glm-dsa requires MLA")
        types = meta.get_per_layer("attention.indexer.types", hp.n_layer, None)
        if types[0] is None:
            types = [1] * hp.n_layer if hp.n_ctx_train < 1048576 else None
            if types is None:
                meta.refuse("context_length", hp.n_ctx_train, "GLM 5.2's built-in indexer pattern is not reproduced "
                                                              "here; write attention.indexer.types")
        return dict(kw, q_lora_rank=int(meta.get("attention.q_lora_rank")),
                    rope_parameters=self.mla_rope_parameters(meta, hp),
                    norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
                    routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0,
                    n_group=max(hp.n_expert_groups, 1), topk_group=max(hp.n_group_used, 1),
                    index_n_heads=int(meta.get("attention.indexer.head_count")),
                    index_head_dim=int(meta.get("attention.indexer.key_length")),
                    index_topk=int(meta.get("attention.indexer.top_k")),
                    indexer_types=["full" if t else "shared" for t in types])


FAMILY = GlmMoeDsa()
