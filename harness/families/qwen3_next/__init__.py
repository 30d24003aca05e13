"""qwen3_next: gated attention in a hybrid stack (HF ``Qwen3NextForCausalLM``;
llama.cpp ``src/models/qwen3next.cpp``, converter ``conversion/qwen.py``
``Qwen3NextModel``).

Every ``full_attention_interval``-th layer is attention, the others are gated
delta-net (linear attention) layers (HF ``Qwen3NextGatedDeltaNet``; llama.cpp
``qwen3next.cpp build_layer_attn_linear`` + ``delta-net-base.cpp``), described to
impl as ``contract.recurrent.RecurrentConfig`` kind ``gated_delta_net``: the fused
``in_proj_qkvz`` / ``in_proj_ba`` split per key head as HF's
``fix_query_key_value_ordering`` reads them, a SiLU causal conv of
``linear_conv_kernel_dim`` rows, beta = sigmoid(b), the per-head log-decay
``-exp(A_log) * softplus(a + dt_bias)``, q and k L2-normalised (HF's fixed eps
1e-6, llama.cpp's ``rms_norm_eps``: ``qk_l2_eps``), the delta rule, the gated RMS
norm ``rms(y) * w * silu(z)`` per value head and ``out_proj``. The probes are read
from HF's functional conv / scan / l2norm calls and llama.cpp's ``cb()`` names
(``harness/families/_recurrent.py``); the states after each call from HF's cache
(``hf_cached``) and llama.cpp's ``llama_state_seq_get_data``.

The attention layers carry:
- the interleaved Q gate: ``q_proj`` is twice as wide, per head
  ``[q(D), gate(D)]`` (HF ``Qwen3NextAttention.forward``:
  ``torch.chunk(q_proj(x).view(..., -1, head_dim * 2), 2, dim=-1)``), and
  ``sigmoid(gate)`` multiplies the attention output before ``o_proj``;
- zero-centred ``(1 + w)`` RMS norms (HF ``Qwen3NextRMSNorm``) on the input
  and, per head before RoPE, on Q and K;
- partial neox RoPE (``partial_rotary_factor``).
The FFN is a mixture of experts with a gated shared expert (llama.cpp's
qwen3next cannot load a dense FFN layer: ``load_arch_tensors`` requires the
expert tensors), which only the reference-vs-reference rows see.

Tiny config: 4 layers ``[linear, attention, linear, attention]``
(``full_attention_interval=2``), hidden 64, 4 heads / 2 KV heads of 16, rotary
on 8 of the 16 channels, 4 experts (2 used). ``rms_norm_eps`` stays 1e-6: the
delta-net's q/k L2 norm uses a fixed 1e-6 in HF and ``rms_norm_eps`` in
llama.cpp (qwen3next.cpp ``build_gdn_l2_norm(..., hparams.f_norm_rms_eps)``).

HF-only setting: ``--set attention_bias=true`` (q/k/v biases, the q bias double
width like ``q_proj``, and an ``o_proj`` bias) is compared against HF only:
llama.cpp's qwen3next has no ``attn_output.bias`` slot and refuses the file the
converter would write ("wrong number of tensors"), an error row for ``--ref
llamacpp``. The same holds for qwen3_5_text.
"""

from __future__ import annotations

import numpy as np

from contract.recurrent import RecurrentConfig
from contract.layers import LayerConfig, NormSpec, QkNormSpec

from .._gguf_export import NegExpALog, NormPlusOne
from .._gguf_import import llama_like_config
from .._recurrent import RecurrentProbes
from ...errors import UsageError
from ..base import LcPoint, LlamaLike, Point, gguf_moe_convert, gguf_size_params, tensor
from .._gguf_import import experts, one_per_layer, read_hparams

# HF's l2norm inside the delta-rule scans (modeling_qwen3_next.py l2norm, called from
# torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule with eps=1e-6)
HF_QK_L2_EPS = 1e-6


class GatedHybrid(RecurrentProbes, NegExpALog, NormPlusOne, LlamaLike):
    """What qwen3_next and qwen3_5_text share: the gated attention layer, the
    gated delta-net layers, the probe maps of both kinds."""

    extra_settable = ("head_dim", "full_attention_interval")  # popped by the config's __post_init__
    # llama.cpp names the pre-norm Q view differently in the two graphs
    _lc_q_view = "Qcur_view"

    # the delta-net layers: what HF exposes around the token mixer (module hooks); the
    # recurrence's own probes come from the functional calls (RecurrentProbes.recurrent_taps)
    _hf_linear_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("linear_attn", "in"),
        "attn_branch": Point("linear_attn.out_proj", "in"),
        "attn_out": Point("linear_attn", "out"),
        "resid_mid": Point("post_attention_layernorm", "in"),
        "layer_out": Point("", "out"),
    }
    # ... and what llama.cpp names there (qwen3next.cpp / qwen35.cpp build_layer_attn_linear,
    # delta-net-base.cpp build_recurrent_attn): `attn_norm`, the qkv before the conv
    # (`linear_attn_qkv_mixed`), the conv's SiLU output, the z projection, q / k after the
    # L2 norm (`*_conv_predelta`: qwen3next repeats them to the value heads first), the
    # log-decay `gate`, the recurrence's `attn_output`, the normed and gated `final_output`,
    # the `linear_attn_out` matmul, the `attn_residual` add, `l_out`. beta after its sigmoid
    # is named in qwen35.cpp only (`beta_sigmoid`; qwen3next.cpp names the pre-sigmoid `b`).
    _lc_linear_points = {
        "attn_in": LcPoint("attn_norm"),
        "rec_conv_in": LcPoint("linear_attn_qkv_mixed"),
        "rec_conv": LcPoint("conv_output_silu"),
        "rec_z": LcPoint("z"),
        "rec_q": LcPoint("q_conv_predelta", "last", "heads"),
        "rec_k": LcPoint("k_conv_predelta", "last", "heads"),
        "rec_v": LcPoint("v_conv_predelta", "last", "heads"),
        "rec_decay": LcPoint("gate"),
        "rec_out": LcPoint("attn_output", "last", "heads"),
        "attn_branch": LcPoint("final_output"),
        "attn_out": LcPoint("linear_attn_out"),
        "resid_mid": LcPoint("attn_residual"),
        "layer_out": LcPoint("l_out"),
    }

    def _is_linear(self, config, i: int) -> bool:
        return config.layer_types[i] == "linear_attention"

    def validate(self, kw: dict) -> None:
        """The delta-net's sizes, by their HF names, before HF builds a model on them:
        a causal conv of at least one row, value heads in whole groups per key head
        (HF ``fix_query_key_value_ordering`` views the projection per key head)."""
        super().validate(kw)
        k = kw.get("linear_conv_kernel_dim", self.tiny.get("linear_conv_kernel_dim"))
        if k is not None and (not isinstance(k, int) or k < 1):
            raise UsageError(f"linear_conv_kernel_dim={k!r}: the delta-net's causal conv needs a kernel of at least "
                             f"1 row; valid: an integer >= 1")
        nk = kw.get("linear_num_key_heads", self.tiny["linear_num_key_heads"])
        nv = kw.get("linear_num_value_heads", self.tiny["linear_num_value_heads"])
        if isinstance(nk, int) and isinstance(nv, int) and nk >= 1 and nv % nk:
            raise UsageError(f"linear_num_key_heads={nk} does not divide linear_num_value_heads={nv}; valid: a "
                             f"divisor of {nv} ({', '.join(str(d) for d in range(1, nv + 1) if nv % d == 0)})")

    def lc_refusal(self, config) -> str | None:
        """llama.cpp's delta net needs key and value heads of one width:
        delta-net-base.cpp ``GGML_ASSERT(S_k == S_v)`` (build_delta_net_chunking,
        _autoregressive, _fused) aborts the process otherwise; HF computes either."""
        dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
        if dk != dv:
            return (f"linear_key_head_dim={dk} != linear_value_head_dim={dv}: llama.cpp's delta net asserts equal "
                    f"widths (delta-net-base.cpp GGML_ASSERT(S_k == S_v)); valid for --ref llamacpp: equal widths "
                    f"(HF computes either: --ref hf or hf_cached)")
        return None

    def is_recurrent(self, config, i: int) -> bool:
        return self._is_linear(config, i)

    def _qk_l2_eps(self, config) -> float:
        """The q/k L2 norm's epsilon impl computes, HF's: HF fixes 1e-6
        (modeling_qwen3_next.py / modeling_qwen3_5.py ``l2norm(..., eps=1e-6)`` in both
        scans), llama.cpp reads ``rms_norm_eps`` (qwen3next.cpp / qwen35.cpp
        ``build_gdn_l2_norm(ctx0, q_conv, hparams.f_norm_rms_eps)``). impl computes HF's
        model; where they differ (a file whose rms_norm_eps is not 1e-6) it is a finding
        (fixtures/tolerance.toml, "the delta net's q/k L2 norm epsilon")."""
        return HF_QK_L2_EPS

    def _recurrent_config(self, config, i: int) -> RecurrentConfig:
        """Layer ``i``'s gated delta-net (HF Qwen3NextGatedDeltaNet.__init__ / forward)."""
        return RecurrentConfig.of(
            "gated_delta_net", hidden_size=config.hidden_size, n_k_heads=config.linear_num_key_heads,
            n_v_heads=config.linear_num_value_heads, k_dim=config.linear_key_head_dim,
            v_dim=config.linear_value_head_dim, conv_kernel=config.linear_conv_kernel_dim,
            qk_norm_eps=self._qk_l2_eps(config), out_norm_eps=float(config.rms_norm_eps),
            # the decoder layer's input_layernorm: Qwen3NextRMSNorm, (1 + w)
            input_norm=NormSpec("rms1p", float(config.rms_norm_eps)))

    def _recurrent_weights(self, layer, config) -> dict:
        """The delta-net's projections per role (impl.recurrent.RECURRENT_WEIGHTS):
        ``in_proj_qkvz`` / ``in_proj_ba`` split as HF's ``fix_query_key_value_ordering``
        reads them -- per key head ``[q (Dk) | k (Dk) | v (r Dv) | z (r Dv)]`` and
        ``[b (r) | a (r)]``, r = value heads per key head."""
        hid, nk, nv = config.hidden_size, config.linear_num_key_heads, config.linear_num_value_heads
        dk, dv, r = config.linear_key_head_dim, config.linear_value_head_dim, nv // nk
        qkvz = tensor(layer, "linear_attn.in_proj_qkvz.weight").reshape(nk, 2 * dk + 2 * r * dv, hid)
        ba = tensor(layer, "linear_attn.in_proj_ba.weight").reshape(nk, 2 * r, hid)
        return {"w_in": np.concatenate([qkvz[:, :dk].reshape(-1, hid), qkvz[:, dk:2 * dk].reshape(-1, hid),
                                        qkvz[:, 2 * dk:2 * dk + r * dv].reshape(-1, hid)]),
                "w_z": qkvz[:, 2 * dk + r * dv:].reshape(-1, hid), "w_beta": ba[:, :r].reshape(-1, hid),
                "w_decay": ba[:, r:].reshape(-1, hid)}

    # Qwen3NextRMSNorm: x / rms(x) * (1 + w), in float32
    input_norm_kind = "rms1p"
    # q_norm / k_norm: the same (1 + w) norm over head_dim, before RoPE
    qk_norm = QkNormSpec(NormSpec("rms1p"), over="head", where="pre_rope")

    def layer_config(self, config, i: int):
        if self._is_linear(config, i):
            return self._recurrent_config(config, i)
        # RoPE: partial rotary, int(head_dim * partial_rotary_factor) leading channels, neox
        return super().layer_config(config, i).replace(q_gate_interleaved=True)

    def layer_weights(self, model, config, i: int):
        if self._is_linear(config, i):
            layer = self.decoder_layers(model)[i]
            w = {"attn_norm": tensor(layer, "input_layernorm.weight"), **self._recurrent_weights(layer, config)}
            for hf, ours in (("conv1d.weight", "conv"), ("dt_bias", "dt_bias"), ("A_log", "A_log"),
                             ("norm.weight", "out_norm"), ("out_proj.weight", "wo")):
                w[ours] = tensor(layer, f"linear_attn.{hf}")
            w["conv"] = w["conv"][:, 0]  # [C, 1, K] -> [C, K]
            return w
        w = super().layer_weights(model, config, i)
        if "bq" in w and not self._is_linear(config, i):
            # HF q_proj's bias is as wide as q_proj: per head [q(D) | gate(D)]. impl (the
            # spec) biases Q at the Q width after the split; the gate halves are the
            # gate's own bias (added to the gate after the split, as HF's chunk does).
            h, d = config.num_attention_heads, self.head_dim(config)
            b = w["bq"].reshape(h, 2 * d)
            w["bq"], w["bq_gate"] = b[:, :d].reshape(-1).copy(), b[:, d:].reshape(-1).copy()
        return w

    # ------------------------------------------------------------------ probes
    def hf_points_for(self, config, i: int):
        return self._hf_linear_points if self._is_linear(config, i) else self.hf_points

    def hf_canonical(self, probe, arr, lc):
        if probe == "q" and isinstance(lc, LayerConfig) and lc.q_gate_interleaved:
            # q_proj's output carries [q, gate] per head; the canonical q is the
            # query half (the gate is not a probe of its own).
            s, t = arr.shape[:2]
            return arr.reshape(s, t, lc.n_heads, 2 * lc.head_dim)[..., : lc.head_dim]
        return super().hf_canonical(probe, arr, lc)

    def lc_canonical(self, probe, arr, lc, config):
        if isinstance(lc, RecurrentConfig):
            return self.lc_recurrent_canonical(probe, arr, lc, config)
        return super().lc_canonical(probe, arr, lc, config)

    def lc_points_for(self, config, i: int):
        if self._is_linear(config, i):
            return self._lc_linear_points
        # build_layer_attn: Qcur_full (q + gate) -> the query view -> Qcur_normed -> Qcur
        # (ROPE); Kcur (MUL_MAT) -> Kcur_normed -> Kcur (ROPE); Vcur (reshape, last);
        # build_attn's kqv_out is renamed `attn_pregate`, then `attn_gated` (x sigmoid
        # gate) enters wo, whose output is `attn_output`.
        return {
            "attn_in": LcPoint("attn_norm"),
            "q": LcPoint(self._lc_q_view, "last", "heads"),
            "k": LcPoint("Kcur", "pre_rope", "rows"),
            "v": LcPoint("Vcur", "last", "heads"),
            "q_rope": LcPoint("Qcur", "rope", "heads"),
            "k_rope": LcPoint("Kcur", "rope", "heads"),
            "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
            "attn_heads": LcPoint("attn_pregate"),
            "attn_branch": LcPoint("attn_gated"),
            "attn_out": LcPoint("attn_output"),
            "resid_mid": LcPoint("attn_residual"),
            "layer_out": LcPoint("l_out"),
        }

    # ------------------------------------------------------------------ GGUF import
    def _hybrid_config(self, meta, shapes, hp, moe: bool) -> dict:
        """What qwen3next.cpp and qwen35.cpp load_arch_hparams read alike: the RMS
        eps, the delta-net sizes (conv kernel, inner size = value head dim x
        value heads, state size = key head dim, time-step rank = value heads,
        group count = key heads), the recurrent layers (the per-layer array, else
        every layer but each ``full_attention_interval``-th, default 4). The
        attention layers rotate ``rope.dimension_count`` leading channels."""
        n = hp.n_layer
        recr = meta.get_per_layer("attention.recurrent_layers", n, None)
        if recr[0] is None:
            interval = int(meta.get("full_attention_interval", 4))
            recr = [(i + 1) % interval != 0 for i in range(n)]
        else:
            meta.skip("full_attention_interval", "attention.recurrent_layers is present (read first)")
        kw = llama_like_config(self, meta, shapes, hp, moe=moe, rotary=False)
        nv, inner = int(meta.get("ssm.time_step_rank")), int(meta.get("ssm.inner_size"))
        if not nv or inner % nv:
            meta.refuse("ssm.inner_size", inner, f"not a multiple of ssm.time_step_rank {nv} (value heads)")
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
                  linear_conv_kernel_dim=int(meta.get("ssm.conv_kernel")),
                  linear_key_head_dim=int(meta.get("ssm.state_size")),
                  linear_num_key_heads=int(meta.get("ssm.group_count")),
                  linear_num_value_heads=nv, linear_value_head_dim=inner // nv,
                  layer_types=["linear_attention" if r else "full_attention" for r in recr])
        kw["rope_parameters"]["partial_rotary_factor"] = hp.n_rot / hp.n_embd_head_k
        return kw

    # ------------------------------------------------------------------ GGUF
    def _params_common(self, w, config) -> None:
        """conversion/base.py TextModel.set_gguf_parameters + Qwen3NextModel's additions
        (conversion/qwen.py), for an HF config without MTP layers (``--no-mtp``)."""
        gguf_size_params(w, config)
        rp = dict(config.rope_parameters or {})
        # rope_type "default": the converter only warns "Unknown RoPE type" and writes no scaling
        if "mrope_section" in rp:
            # base.py: mrope_section padded to 4 [time, height, width, extra]
            sec = list(rp["mrope_section"])
            w.add_rope_dimension_sections((sec + [0] * 4)[:4])
        w.add_rope_freq_base(rp["rope_theta"])
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_key_length(self.head_dim(config))
        w.add_value_length(self.head_dim(config))
        # Qwen3NextModel.set_gguf_parameters
        w.add_ssm_conv_kernel(config.linear_conv_kernel_dim)
        w.add_ssm_state_size(config.linear_key_head_dim)
        w.add_ssm_group_count(config.linear_num_key_heads)
        w.add_ssm_time_step_rank(config.linear_num_value_heads)
        w.add_ssm_inner_size(config.linear_value_head_dim * config.linear_num_value_heads)
        # gguf_writer.add_recurrent_layers (the vendored gguf-py; the installed gguf
        # 0.19 lacks the helper, so the key is written by name)
        w.add_array(f"{w.arch}.attention.recurrent_layers", [t == "linear_attention" for t in config.layer_types])
        # hparams.get("full_attention_interval", 4): HF does not save the interval
        # (its __post_init__ pops it), so the converter always writes 4; the
        # recurrent_layers array above is what llama.cpp reads first.
        w.add_full_attention_interval(4)
        prf = rp.get("partial_rotary_factor", 0.25)
        w.add_rope_dimension_count(int(self.head_dim(config) * prf))

    def _params_experts(self, w, config) -> None:
        """base.py: expert_count / expert_used_count; Qwen2MoeModel: the expert and
        shared-expert feed-forward lengths (qwen3_next and qwen3_5_moe alike)."""
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)

    def _experts_config(self, meta, hp, kw: dict) -> dict:
        """qwen3next.cpp / qwen35moe.cpp load_arch_hparams: the experts' width
        (default ``n_ff / n_expert_used``) and the shared expert's (default
        ``n_ff``); the graphs route by softmax and always renormalise
        (build_moe_ffn norm_w = true), every layer MoE with a sigmoid-gated shared
        expert -- HF's Qwen3NextSparseMoeBlock / Qwen3_5MoeSparseMoeBlock."""

        n_exp, n_used = experts(meta, hp, self.name)
        kw.update(num_experts=n_exp, num_experts_per_tok=n_used,
                  moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer,
                                                      hp.ff // n_used),
                  shared_expert_intermediate_size=int(meta.get("expert_shared_feed_forward_length", hp.ff)))
        if "norm_topk_prob" in self.tiny:  # Qwen3NextConfig's switch; Qwen3_5MoeTopKRouter always renormalises
            kw["norm_topk_prob"] = True
        return kw

    # Qwen3NextModel.modify_tensors: every *norm.weight except the delta-net's gated
    # norm gets + 1 (NormPlusOne: llama.cpp's RMS norm multiplies by w, HF by 1 + w)
    norm_plus_one_skip = ("linear_attn.norm.weight",)

    def gguf_convert(self, name, data, config, variant=None):
        """Qwen3NextModel.modify_tensors, then Qwen2MoeModel.modify_tensors (the
        fused-QKVZ and expert steps find no tensor in qwen3_5_text's dense model
        with split projections)."""
        if name.endswith(".dt_bias"):
            yield name.rpartition(".dt_bias")[0] + ".dt_proj.bias", data
            return
        if "conv1d" in name:
            yield name, data.squeeze()  # (C, 1, K) -> (C, K)
            return
        if "in_proj_qkvz.weight" in name:
            # per key head [q, k, v, z] -> [Q_all | K_all | V_all] (attn_qkv) and Z_all (attn_gate)
            hk, hv = config.linear_key_head_dim, config.linear_value_head_dim
            nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
            sizes = [hk, hk, nv // nk * hv, nv // nk * hv]
            t = data.T.reshape(config.hidden_size, nk, sum(sizes))
            q, k, v, z = np.split(t, np.cumsum(sizes)[:-1], axis=-1)
            flat = [x.reshape(config.hidden_size, -1) for x in (q, k, v, z)]
            base = name.rpartition(".in_proj_qkvz")[0]
            yield base + ".in_proj_qkv.weight", np.concatenate(flat[:3], axis=-1).T.copy()
            yield base + ".in_proj_z.weight", flat[3].T.copy()
            return
        # HF's fused experts [E, 2F, H] split on dim -2 into gate and up
        yield from gguf_moe_convert(name, data) or [(name, data)]


class Qwen3Next(GatedHybrid):
    name = "qwen3_next"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "partial", "bias"), "hf_only": ("bias",)}
    hf_model_type = "qwen3_next"
    description = "hybrid: gated attention (interleaved Q gate, (1+w) norms, partial RoPE) + delta-net layers, MoE"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        norm_topk_prob=True, full_attention_interval=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        tie_word_embeddings=False,
    )
    gguf_arch = "qwen3next"
    _lc_q_view = "Qcur_view"
    # qwen3next.cpp graph(): the embeddings are renamed `model.embed_tokens`
    lc_model_points = {
        "embeddings": LcPoint("model.embed_tokens"),
        "final_norm": LcPoint("result_norm"),
        "logits": LcPoint("result_output"),
    }

    experts_implementation = "eager"

    def gguf_params(self, w, config, variant=None):
        self._params_common(w, config)
        self._params_experts(w, config)

    def config_from_gguf(self, meta, shapes, tensors):
        """qwen3next.cpp load_arch_hparams: the hybrid keys and the experts'
        (``experts_config``)."""

        hp = read_hparams(meta)
        return self._experts_config(meta, hp, self._hybrid_config(meta, shapes, hp, moe=True))


FAMILY = Qwen3Next()
