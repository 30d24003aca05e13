"""deepseek_v32: DeepSeek-V3.2's multi-head latent attention with DeepSeek
sparse attention (HF ``DeepseekV32ForCausalLM``, modeling_deepseek_v32.py
``DeepseekV32Attention`` + ``DeepseekV32Indexer``; llama.cpp arch
``deepseek32``, src/models/deepseek32.cpp; converter conversion/deepseek.py
``DeepseekV32Model``, a ``DeepseekV2Model``).

The layer is glm_moe_dsa's (GLM-5's DSA inherits HF's DeepseekV32Indexer,
modular_glm_moe_dsa.py): one body -- this family is ``GlmMoeDsa`` with the
settings where the two architectures differ:

- YaRN: deepseek32.cpp ``load_arch_hparams`` reads ``rope.scaling.
  yarn_log_multiplier`` (divided by 0.1, [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]),
  which glm-dsa.cpp never reads, so the real V3.2 setting ``mscale ==
  mscale_all_dim == 1.0`` is computed alike (HF magnitude 1, softmax scale
  L(1)^2; llama-context.cpp: ``yarn_attn_factor = get_mscale(f, 1) /
  get_mscale(f, 1)``, the DEEPSEEK2-only special case does not apply): the
  tiny config runs it, as deepseek_v3's.
- the router: sigmoid with ``e_score_correction_bias`` (HF inherits
  Glm4MoeLite's MoE). deepseek32.cpp reads ``expert_gating_func`` as a
  REQUIRED key, and the converter writes it only when config.json names
  ``scoring_func`` (conversion/base.py), a key HF's DeepseekV32Config has no
  field for: the tiny config passes it as an extra key (kept in config.json),
  as the hub's V3.2 config.json has it.
- the indexer (inert at the default config, see glm_moe_dsa.py): every layer is
  a full indexer (no ``indexer_types``); its RoPE is NEOX in both references
  (HF ``apply_rotary_pos_emb`` on the [rope | nope] head, "NON-interleaved";
  deepseek32.cpp ``LLAMA_ROPE_TYPE_NEOX``, where glm-dsa.cpp uses NORM); its
  key LayerNorm eps is 1e-6 in both (deepseek32.cpp ``f_norm_eps = 1e-6``;
  glm-dsa.cpp leaves 0); the indexer tensors are required by deepseek32.cpp.
- the naive (combined kv_b) form: deepseek32.cpp throws "DEEPSEEK32
  architecture requires MLA" as glm-dsa.cpp does -- compared with HF only.

Tiny config: hidden 64, 3 layers (layer 0 dense, 1-2 MoE, 4 experts), 4 heads,
q/kv lora 24, nope 12 / rope 8 / v 10, YaRN factor 4 over 128 positions with
``mscale = mscale_all_dim = 1.0``, indexer 4 heads x 64 (llama.cpp's Hadamard
rotation of the indexer cache needs a multiple of 64), ``index_topk =
max_position_embeddings = 512`` (the indexer inert).

Extra configs:
- HF vs llama.cpp only: ``--set index_topk=8`` -- the indexer drops keys from
  position 8 on at 16 tokens (MLA layers not implemented in impl, as for
  glm_moe_dsa).
"""

from __future__ import annotations

from ..glm_moe_dsa import GlmMoeDsa
from harness.lazy import lazy
from .._gguf_import import read_hparams

gguf = lazy("gguf")


class DeepseekV32(GlmMoeDsa):
    name = "deepseek_v32"
    fuzz_space = {"knobs": ("mla", "mla_yarn", "values"), "values": GlmMoeDsa.fuzz_space["values"]}
    hf_model_type = "deepseek_v32"
    description = ("MLA (absorbed; naive vs HF only), low-rank Q, interleaved RoPE with YaRN, DSA indexer (inert "
                   "at index_topk >= tokens), sigmoid MoE")
    gguf_arch = "deepseek32"
    extra_settable = ("scoring_func",)
    lc_naive_unsupported = ('deepseek32.cpp load_arch_tensors throws "DEEPSEEK32 architecture requires MLA" unless '
                            "the file has the _mla keys, and then requires attn_k_b / attn_v_b (no attn_kv_b)")
    tiny = dict(
        GlmMoeDsa.tiny, scoring_func="sigmoid",
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=128,
                             mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1),
    )

    def gguf_tensor_map(self, config):
        """The installed gguf (0.19) has no deepseek32 arch; the vendored gguf-py's
        MODEL_TENSORS[DEEPSEEK32] is MODEL_TENSORS[GLM_DSA] less ATTN_KV_B (which
        the absorbed form never writes, and the naive form is not exported for
        llama.cpp), and tensor_mapping.py names the same HF modules for both --
        so glm-dsa's map names every tensor deepseek32.cpp loads."""

        return gguf.get_tensor_name_map(gguf.MODEL_ARCH.GLM_DSA, config.num_hidden_layers)

    def gguf_params(self, w, config, variant=None):
        """conversion/deepseek.py ``DeepseekV32Model.set_gguf_parameters``:
        ``DeepseekV2Model``'s keys (rope width ``qk_rope_head_dim``, the YaRN log
        multiplier), then the indexer's heads, key length and top-k (no
        per-layer types)."""
        variant = variant or self.variants[0]
        self.check_lc_variant(variant)
        self.deepseek_params(w, config, variant)
        w.add_indexer_head_count(config.index_n_heads)
        w.add_indexer_key_length(config.index_head_dim)
        w.add_indexer_top_k(config.index_topk)

    def config_from_gguf(self, meta, shapes, tensors):
        """deepseek32.cpp load_arch_hparams: the common MLA keys, the RoPE sections
        (read; the graph has no M-RoPE), the Q and KV
        ranks (required: "DEEPSEEK32 architecture requires MLA"), the experts'
        weights' scale / norm, the gating function (required; HF's router is
        sigmoid only), the YaRN log multiplier (divided by 0.1), the indexer's
        heads, key length and top-k. Every layer is a full indexer."""

        hp = read_hparams(meta)
        kw = self.mla_common(meta, shapes, hp)
        meta.get("rope.dimension_sections", None)  # read (get_key_or_arr); no M-RoPE in this graph
        gating = int(meta.get("expert_gating_func"))
        if gating != 2:
            meta.refuse("expert_gating_func", gating, "HF DeepseekV32 routes by sigmoid (2)")
        if "blk.0.attn_kv_b.weight" in shapes:
            meta.refuse("attention.key_length_mla", None, "the legacy (attn_kv_b) form: deepseek32 requires MLA")
        log_mul = meta.get_f32("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
        return dict(kw, q_lora_rank=int(meta.get("attention.q_lora_rank")),
                    rope_parameters=self.mla_rope_parameters(meta, hp, log_mul), scoring_func="sigmoid",
                    norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
                    routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0,
                    n_group=max(hp.n_expert_groups, 1), topk_group=max(hp.n_group_used, 1),
                    index_n_heads=int(meta.get("attention.indexer.head_count")),
                    index_head_dim=int(meta.get("attention.indexer.key_length")),
                    index_topk=int(meta.get("attention.indexer.top_k")))


FAMILY = DeepseekV32()
