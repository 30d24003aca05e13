"""kimi_linear: hybrid Kimi-delta-attention (KDA) / MLA decoder (HF
``KimiLinearForCausalLM``, modeling_kimi_linear.py; llama.cpp arch
``kimi-linear``, src/models/kimi-linear.cpp; converter
conversion/kimi_linear.py ``KimiLinearModel``).

The MLA layers (``layer_types == "full_attention"``, HF
``KimiLinearAttention``) are DeepSeek's MLA WITHOUT any RoPE: the
``qk_rope_head_dim`` slices of Q and of ``kv_a_proj_with_mqa`` are plain extra
head channels, the shared ``k_rot`` is broadcast to every head unrotated
(HF ``forward`` never calls a rotary function; llama.cpp kimi-linear uses rope
type NONE) -- the spec's ``MlaConfig::rope: None``. Direct Q (llama.cpp's
kimi-linear never reads ``attention.q_lora_rank`` and always uses ``wq``), no
YaRN, softmax scale ``(nope + rope) ** -0.5`` in both. No output gate: the
sigmoid ``g_proj`` gate of the spec is Kimi K3's (llama.cpp kimi-k3.cpp), not
kimi_linear's.

Variants: ``absorbed`` (default) against both references; ``naive`` against
HF only -- llama.cpp's kimi-linear needs the ``_mla`` keys to load, and then
``is_mla()`` is true, so its graph builds no ``inp_attn_kv`` and the legacy
``attn_kv_b`` arm dereferences a null input (measured: exit 139); the
export refuses with that reason (an error row naming it).

The KDA layers (``KimiLinearDeltaAttention``) are NOT implemented in impl:
they are listed as ``not-implemented`` (kind ``kda``) and HF and llama.cpp are
still compared on them (``attn_in``, ``attn_out`` = the KDA ``o_proj`` output /
``kda_out``, ``resid_mid``, ``layer_out``).

Tiny config: hidden 64, 3 layers ``[KDA, MLA, KDA]`` (llama.cpp's hybrid
memory needs at least one recurrent layer), 4 heads, kv_lora_rank 24, nope 12 /
rope 8 / v 10, KDA 4 heads x 16 with a 4-tap conv, MoE from layer 1 (4
experts, 2 used, 1 shared, sigmoid router). ``rms_norm_eps = 1e-6``: HF's
latent norms and the KDA q/k L2 norm use a fixed 1e-6, llama.cpp
``rms_norm_eps`` (with 1e-5 the KDA layers differ by ~2e-2).

HF-only setting: ``--set num_attention_heads=N`` other than the KDA layers'
own head count (``linear_attn_config``, 4): HF sizes the MLA and KDA layers
from separate settings, llama.cpp's kimi-linear sizes both from ``n_head``
(kimi-linear.cpp: ``ssm_conv1d_q`` is ``n_embd_head_kda * n_head``) and refuses
the file ("check_tensor_dims: tensor 'blk.0.ssm_conv1d_q.weight' has wrong
shape"), an error row for ``--ref llamacpp``. Found by ``conformance fuzz``.
"""

from __future__ import annotations

import numpy as np

from impl.mla import MlaConfig

from .._gguf_export import NegExpALog
from .._mla import MlaFamily
from ..base import LcPoint, NotInImpl, Point

KDA_REASON = "Kimi delta attention: HF KimiLinearDeltaAttention, llama.cpp kimi-linear.cpp (the is_recr branch)"


class KimiLinear(NegExpALog, MlaFamily):
    name = "kimi_linear"
    # kimi-linear.cpp sizes the KDA layers from n_head (ssm_conv1d_q: n_embd_head_kda * n_head)
    # while HF's take linear_attn_config's heads: an MLA head count other than the KDA's is HF-only
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("mla_nope", "kimi_heads"), "hf_only": ("kimi_heads",)}
    hf_model_type = "kimi_linear"
    description = "hybrid: NoPE MLA (absorbed; naive vs HF only), direct Q + KDA linear-attention layers (not in impl), MoE"
    gguf_arch = "kimi-linear"
    lc_naive_unsupported = ("kimi-linear.cpp builds inp_attn_kv only when !is_mla(), but load_arch_hparams requires "
                            "the _mla keys (so is_mla() is always true) and the attn_kv_b arm then reads a null "
                            "attention input: the process segfaults")
    extra_settable = ("linear_attn_config", "first_k_dense_replace", "moe_router_activation_func")
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=24, q_lora_rank=None, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        num_experts=4, num_experts_per_token=2, num_shared_experts=1, first_k_dense_replace=1,
        num_expert_group=1, topk_group=1, moe_renormalize=True, routed_scaling_factor=2.5,
        # the converter writes expert_gating_func from this key (conversion/base.py); the
        # HF router is sigmoid whatever it says
        moe_router_activation_func="sigmoid",
        model_max_length=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        # the original (Moonshot) key the converter reads; HF derives its linear_* fields from it
        linear_attn_config=dict(full_attn_layers=[2], kda_layers=[1, 3], head_dim=16, num_heads=4,
                                short_conv_kernel_size=4),
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    # kimi-linear.cpp graph(): the embeddings are renamed `model.embed_tokens`
    lc_model_points = {
        "embeddings": LcPoint("model.embed_tokens"),
        "final_norm": LcPoint("result_norm"),
        "logits": LcPoint("result_output"),
    }
    hf_kda_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("self_attn", "in"),
        "attn_out": Point("self_attn", "out"),
        "resid_mid": Point("post_attention_layernorm", "in"),
        "layer_out": Point("", "out"),
    }
    lc_kda_points = {
        "attn_in": LcPoint("attn_norm"),
        "attn_out": LcPoint("kda_out"),
        "resid_mid": LcPoint("ffn_inp"),
        "layer_out": LcPoint("l_out"),
    }
    # kimi-linear.cpp's MLA arm names neither the wq product, nor kv_cmpr_pe, nor the
    # normed kv_cmpr: the latent and the shared rope slice are read out of `Kcur`
    # ([c | k_pe], one head), the Q rope slice from the `q_pe` view
    lc_mla_points = {
        "attn_in": LcPoint("attn_norm"),
        "kv_latent": LcPoint("Kcur", "last", "heads"),
        "q_pe": LcPoint("q_pe", "last", "heads"),
        "k_pe": LcPoint("Kcur", "last", "heads"),
        "q_absorbed": LcPoint("Qcur", "op:CONCAT", "heads"),
        "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
        "attn_heads": LcPoint("kqv_out"),
        "attn_branch": LcPoint("kqv_out"),
        "attn_out": LcPoint("mla_out"),
        "resid_mid": LcPoint("ffn_inp"),
        "layer_out": LcPoint("l_out"),
    }

    def is_mla(self, config, i: int) -> bool:
        return config.layer_types[i] == "full_attention"

    def mla_rope(self, config):
        return None  # KimiLinearAttention: no rotary embedding at all (NoPE MLA)

    def softmax_mscale(self, config) -> float:
        return 1.0  # KimiLinearAttention.__init__: self.scaling = self.qk_head_dim ** (-0.5)

    def layer_config(self, config, i, variant="absorbed"):
        if not self.is_mla(config, i):
            return NotInImpl("kda", KDA_REASON)
        return super().layer_config(config, i, variant)

    # ------------------------------------------------------------------ probes
    def hf_points_for(self, config, i):
        return super().hf_points_for(config, i) if self.is_mla(config, i) else self.hf_kda_points

    def lc_points_for(self, config, i):
        return self.lc_mla_points if self.is_mla(config, i) else self.lc_kda_points

    def lc_canonical(self, probe, arr, lc, config):
        if isinstance(lc, MlaConfig) and probe in ("kv_latent", "k_pe"):
            row = arr[:, :, 0, :]  # Kcur: [S, T, 1, kv_lora_rank + rope]
            return row[..., : lc.kv_lora_rank] if probe == "kv_latent" else row[..., lc.kv_lora_rank:]
        return super().lc_canonical(probe, arr, lc, config)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """KimiLinearModel.set_gguf_parameters on top of TextModel's."""
        import gguf

        self.check_lc_variant(variant)
        self.text_params(w, config)
        r, nope, rope, v = config.kv_lora_rank, config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_token)
        # base.py reads `n_group` from config.json, which kimi writes as num_expert_group:
        # no expert_group_count; `topk_group` is there under its own name
        w.add_expert_group_used_count(config.topk_group)
        w.add_expert_gating_func({"sigmoid": gguf.ExpertGatingFuncType.SIGMOID,
                                  "softmax": gguf.ExpertGatingFuncType.SOFTMAX}[config.moe_router_activation_func])
        w.add_value_length(config.head_dim)  # base: head_dim (forced to qk_rope_head_dim); not overridden
        w.add_vocab_size(config.vocab_size)
        # n_head_kv per layer: 1 for an MLA layer (MQA over the latent), 0 marks KDA
        w.add_head_count_kv([1 if t == "full_attention" else 0 for t in config.layer_types])
        w.add_ssm_conv_kernel(config.linear_conv_kernel_dim)  # linear_attn_config.short_conv_kernel_size
        w.add_kda_head_dim(config.linear_head_dim)  # linear_attn_config.head_dim
        if config.q_lora_rank is not None:
            w.add_q_lora_rank(config.q_lora_rank)
        w.add_kv_lora_rank(r)
        w.add_rope_dimension_count(rope)
        w.add_key_length(r + rope)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_count(config.num_shared_experts)
        w.add_leading_dense_block_count(config.mlp_layer_types.index("sparse")
                                        if "sparse" in config.mlp_layer_types else config.num_hidden_layers)
        w.add_expert_weights_scale(config.routed_scaling_factor)

    def gguf_convert(self, name, data, config, variant=None):
        """KimiLinearModel.modify_tensors, on transformers 5's in-memory names (HF's
        conversion_mapping "kimi_linear" renames and fuses the Moonshot checkpoint;
        these steps undo that first, as save_pretrained would)."""
        if name.endswith("self_attn.conv1d.weight"):
            # HF fuses [q_conv1d; k_conv1d; v_conv1d] along dim 0 ([3*d_inner, 1, d_conv]);
            # the converter reshapes each to numpy (1, d_inner, 1, d_conv) -> ggml
            # ne [d_conv, 1, d_inner, 1]
            base = name.removesuffix("conv1d.weight")
            for part, chunk in zip("qkv", np.split(data, 3, axis=0)):
                d_inner, _, d_conv = chunk.shape
                yield f"{base}{part}_conv1d.weight", chunk.reshape(1, d_inner, 1, d_conv)
            return
        if ".self_attn.forget_gate." in name:
            name = name.replace(".forget_gate.", ".")  # HF attaches these to its forget-gate module
            if name.endswith(".dt_bias"):
                yield name.rpartition(".dt_bias")[0] + ".dt_proj.bias", data
                return
        yield from super().gguf_convert(name, data, config, variant)


    def config_from_gguf(self, meta, shapes, tensors):
        """kimi-linear.cpp load_arch_hparams: the RMS eps, the ``_mla`` head sizes,
        the KV rank, the KDA conv kernel and head size (all required); a layer
        with no KV head is a KDA layer; the experts' width, shared count, gating
        function (required) and weights' scale. The graph always renormalises
        the routed weights (build_moe_ffn norm_w = true), never reads a Q rank
        (a direct wq) and rotates nothing (rope type NONE: the RoPE keys load_hparams
        reads have no effect here)."""
        from .._gguf_import import experts, one_per_layer, read_hparams, special_tokens, vocab_of

        hp = read_hparams(meta)
        if self.gguf_variant_of(shapes) == "naive":
            meta.refuse("attention.key_length_mla", meta.get("attention.key_length_mla", None),
                        f"the legacy attn_kv_b form, which {self.lc_naive_unsupported}")
        kda = [kv == 0 for kv in hp.n_head_kv]
        mla_kv = {kv for kv in hp.n_head_kv if kv}
        if mla_kv != {1}:
            meta.refuse("attention.head_count_kv", hp.n_head_kv, "an MLA layer of kimi-linear has one KV head "
                                                                 "(0 marks a KDA layer)")
        r, rope = int(meta.get("attention.kv_lora_rank")), hp.n_rot
        qk, v = int(meta.get("attention.key_length_mla")), int(meta.get("attention.value_length_mla"))
        vocab = vocab_of(meta, shapes)
        n_exp, n_used = experts(meta, hp, self.name)
        if int(meta.get("expert_gating_func")) != 2:
            meta.refuse("expert_gating_func", meta.get("expert_gating_func"), "HF KimiLinear routes by sigmoid (2)")
        lead = int(meta.get("leading_dense_block_count", 0))
        return dict(
            num_hidden_layers=hp.n_layer, model_max_length=hp.n_ctx_train, hidden_size=hp.n_embd,
            intermediate_size=hp.ff, num_attention_heads=hp.head, num_key_value_heads=hp.head, vocab_size=vocab,
            tie_word_embeddings="output.weight" not in shapes, rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
            kv_lora_rank=r, q_lora_rank=None, qk_nope_head_dim=qk - rope, qk_rope_head_dim=rope, v_head_dim=v,
            layer_types=["linear_attention" if k else "full_attention" for k in kda],
            mlp_layer_types=["dense" if i < lead else "sparse" for i in range(hp.n_layer)],
            linear_head_dim=int(meta.get("kda.head_dim")), linear_num_heads=hp.head,
            linear_conv_kernel_dim=int(meta.get("ssm.conv_kernel")),
            num_experts=n_exp, num_experts_per_token=n_used, num_shared_experts=int(meta.get("expert_shared_count")),
            moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
            moe_renormalize=True, routed_scaling_factor=meta.get_f32("expert_weights_scale", 0.0) or 1.0,
            moe_router_activation_func="sigmoid", **special_tokens(meta, vocab))


FAMILY = KimiLinear()
