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

The KDA layers (HF ``KimiLinearDeltaAttention``; llama.cpp ``kimi-linear.cpp``,
the ``is_recr`` branch) are ``contract.recurrent.RecurrentConfig`` kind
``kimi_delta``: q / k / v projections through ONE SiLU conv over their 3 x
``linear_attn_config.num_heads x head_dim`` channels (llama.cpp: three convs, whose
states sit side by side in one ``r_l`` row -- the same channels in the same order),
the per-key-channel log-decay ``-exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)``
(``KimiLinearForgetGate``), beta = sigmoid(b_proj(x)), q / k L2-normalised (HF eps
1e-6, llama.cpp ``rms_norm_eps``), the delta rule, ``o_norm(y) * sigmoid(g_b(g_a(x)))``
per head and ``o_proj``. llama.cpp names the decay (``kda_g1``), the gate's input
(``g2 g_b(g_a(cur_2d))``), the recurrence's output (``attn_output``) and ``kda_out``;
the conv, q / k / v, beta after its sigmoid and the gated branch are unnamed there
(not exposed), and the states come from ``llama_state_seq_get_data``.

Tiny config: hidden 64, 3 layers ``[KDA, MLA, KDA]`` (llama.cpp's hybrid
memory needs at least one recurrent layer), 4 heads, kv_lora_rank 24, nope 12 /
rope 8 / v 10, KDA 4 heads x 16 with a 4-tap conv, MoE from layer 1 (4
experts, 2 used, 1 shared, sigmoid router). ``rms_norm_eps = 1e-6``: HF's
latent norm and the KDA q/k L2 norm use a fixed 1e-6, llama.cpp
``rms_norm_eps`` -- two findings (findings.toml), each from the layer it starts
at; the difference goes as (eps - 1e-6)^2: at HF's default 1e-5 the KDA rows
differ by ~2e-11 (within float32's table), at 1e-4 by ~2e-9 (measured,
docs/measurements/2026-12-02-fuzz-gemma3n-hrm.md).

HF-only setting: ``--set num_attention_heads=N`` other than the KDA layers'
own head count (``linear_attn_config``, 4): HF sizes the MLA and KDA layers
from separate settings, llama.cpp's kimi-linear sizes both from ``n_head``
(kimi-linear.cpp: ``ssm_conv1d_q`` is ``n_embd_head_kda * n_head``) and refuses
the file ("check_tensor_dims: tensor 'blk.0.ssm_conv1d_q.weight' has wrong
shape"), an error row for ``--ref llamacpp``. Found by ``conformance fuzz``.
"""

from __future__ import annotations

import numpy as np

from contract.recurrent import RecurrentConfig
from contract.layers import NormSpec, MlaConfig

from .._gguf_export import NegExpALog
from .._mla import MlaFamily
from .._recurrent import RecurrentProbes
from ..base import LcPoint, Point, tensor
from harness.lazy import lazy
from .._gguf_import import experts, one_per_layer, read_hparams, special_tokens, vocab_of

gguf = lazy("gguf")

# HF's l2norm in both KDA scans (modeling_kimi_linear.py l2norm(..., eps=1e-6))
HF_QK_L2_EPS = 1e-6


class KimiLinear(RecurrentProbes, NegExpALog, MlaFamily):
    name = "kimi_linear"
    # kimi-linear.cpp sizes the KDA layers from n_head (ssm_conv1d_q: n_embd_head_kda * n_head)
    # while HF's take linear_attn_config's heads: an MLA head count other than the KDA's is HF-only
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("mla_nope", "kimi_heads"), "hf_only": ("kimi_heads",)}
    hf_model_type = "kimi_linear"
    description = "hybrid: NoPE MLA (absorbed; naive vs HF only), direct Q + Kimi delta attention layers, MoE"
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
    _hf_kda_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("self_attn", "in"),
        "attn_branch": Point("self_attn.o_proj", "in"),
        "attn_out": Point("self_attn", "out"),
        "resid_mid": Point("post_attention_layernorm", "in"),
        "layer_out": Point("", "out"),
    }
    # the KDA module is the decoder layer's self_attn; its gated norm o_norm(y, gate)
    hf_rec_module = "self_attn"
    hf_rec_gate_norm = "o_norm"
    # kimi-linear.cpp's KDA arm: what it names (the conv outputs, q / k / v, beta after its
    # sigmoid and the gated branch are not)
    _lc_kda_points = {
        "attn_in": LcPoint("attn_norm"),
        "rec_z": LcPoint("g2 g_b(g_a(cur_2d))"),
        "rec_decay": LcPoint("kda_g1", "last", "heads"),
        "rec_out": LcPoint("attn_output", "last", "heads"),
        "attn_out": LcPoint("kda_out"),
        "resid_mid": LcPoint("ffn_inp"),
        "layer_out": LcPoint("l_out"),
    }
    # kimi-linear.cpp's MLA arm names neither the wq product, nor kv_cmpr_pe, nor the
    # normed kv_cmpr: the latent and the shared rope slice are read out of `Kcur`
    # ([c | k_pe], one head), the Q rope slice from the `q_pe` view
    _lc_mla_points = {
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

    def is_recurrent(self, config, i: int) -> bool:
        return not self.is_mla(config, i)

    def _qk_l2_eps(self, config) -> float:
        """The q/k L2 norm's epsilon impl computes, HF's: HF fixes 1e-6 (modeling_kimi_linear.py
        ``l2norm(query, dim=-1, eps=1e-6)`` in both scans), llama.cpp reads
        ``rms_norm_eps`` (kimi-linear.cpp ``build_gdn_l2_norm(ctx0, Qcur, eps_norm)``,
        ``eps_norm = hparams.f_norm_rms_eps``). impl computes HF's model."""
        return HF_QK_L2_EPS

    def layer_config(self, config, i, variant="absorbed"):
        if not self.is_mla(config, i):
            # HF KimiLinearDeltaAttention.__init__: one head count and head_dim for q, k, v;
            # the decay and the gate through head_dim-wide bottlenecks (f_a_proj, g_a_proj)
            h, d = config.linear_num_heads, config.linear_head_dim
            eps = float(config.rms_norm_eps)
            return RecurrentConfig.of("kimi_delta", hidden_size=config.hidden_size, n_k_heads=h, n_v_heads=h,
                                      k_dim=d, v_dim=d, conv_kernel=config.linear_conv_kernel_dim, decay_rank=d,
                                      z_rank=d, qk_norm_eps=self._qk_l2_eps(config), out_norm_eps=eps,
                                      input_norm=NormSpec("rms", eps))
        return super().layer_config(config, i, variant)

    def layer_weights(self, model, config, i):
        if self.is_mla(config, i):
            return super().layer_weights(model, config, i)
        layer = self.decoder_layers(model)[i]
        a = "self_attn."
        w = {"attn_norm": tensor(layer, "input_layernorm.weight"),
             "w_in": np.concatenate([tensor(layer, a + p + "_proj.weight") for p in "qkv"]),
             "conv": tensor(layer, a + "conv1d.weight")[:, 0]}  # [3 qkv_dim, 1, K] -> [C, K]
        for hf, ours in (("forget_gate.f_a_proj.weight", "w_decay_a"), ("forget_gate.f_b_proj.weight", "w_decay"),
                         ("forget_gate.dt_bias", "dt_bias"), ("forget_gate.A_log", "A_log"),
                         ("b_proj.weight", "w_beta"), ("g_a_proj.weight", "w_z_a"), ("g_b_proj.weight", "w_z"),
                         ("o_norm.weight", "out_norm"), ("o_proj.weight", "wo")):
            w[ours] = tensor(layer, a + hf)
        w["A_log"] = w["A_log"].reshape(-1)  # [1, 1, H, 1] -> [H]
        return w

    # ------------------------------------------------------------------ probes
    def hf_points_for(self, config, i):
        return super().hf_points_for(config, i) if self.is_mla(config, i) else self._hf_kda_points

    def lc_points_for(self, config, i):
        return self._lc_mla_points if self.is_mla(config, i) else self._lc_kda_points

    def lc_canonical(self, probe, arr, lc, config):
        if isinstance(lc, RecurrentConfig):
            return self.lc_recurrent_canonical(probe, arr, lc, config)
        if isinstance(lc, MlaConfig) and probe in ("kv_latent", "k_pe"):
            row = arr[:, :, 0, :]  # Kcur: [S, T, 1, kv_lora_rank + rope]
            return row[..., : lc.kv_lora_rank] if probe == "kv_latent" else row[..., lc.kv_lora_rank:]
        return super().lc_canonical(probe, arr, lc, config)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """KimiLinearModel.set_gguf_parameters on top of TextModel's."""
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
