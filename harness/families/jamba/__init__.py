"""jamba: Mamba-1 layers with attention layers among them and a mixture of experts
every few layers (HF ``JambaForCausalLM``, transformers/models/jamba/modeling_jamba.py;
llama.cpp arch ``jamba``, src/models/jamba.cpp + mamba-base.cpp ``build_mamba_layer``;
converter conversion/jamba.py ``JambaModel``).

Layer ``i`` is an attention layer where ``i % attn_layer_period == attn_layer_offset``
(``JambaConfig.layers_block_type``), else a Mamba layer; its FFN is a
``JambaSparseMoeBlock`` where ``i % expert_layer_period == expert_layer_offset``
(``layers_num_experts``), else a dense SwiGLU ``JambaMLP``. Every layer:
``input_layernorm`` -> ``JambaMambaMixer`` or ``JambaAttention`` -> + residual ->
``pre_ff_layernorm`` -> FFN -> + residual.

- ``JambaMambaMixer`` is Mamba-1 (family mamba's layer, harness/families/mamba
  ``mamba1_config``) with RMS norms WITH weights on dt / B / C right after
  ``x_proj``'s split (``dt_layernorm`` / ``b_layernorm`` / ``c_layernorm``:
  ``JambaRMSNorm(..., eps=config.rms_norm_eps)``, ``weight * x * rsqrt(mean(x^2) +
  eps)``); build_mamba_layer normalises them with the file's ``ssm_dt_norm`` /
  ``ssm_b_norm`` / ``ssm_c_norm`` weights (its ``layer.ssm_dt_norm && ...`` branch) at
  the file's RMS eps, which conversion/jamba.py writes from ``rms_norm_eps``: the same
  eps, so no eps finding (falcon_mamba's has one). impl: the kind's ``bc_norm`` with
  the weights ``dt_norm`` / ``b_norm`` / ``c_norm``.
- ``JambaAttention`` has NO positional encoding (no rotary: jamba.cpp "No RoPE :)"),
  scale ``head_dim ** -0.5`` (jamba.cpp ``1.0f/sqrtf(float(n_embd_head))``).
- The router (``JambaTopKRouter``): softmax over the experts, top-k, the k weights
  left unnormalised; jamba.cpp ``build_moe_ffn(..., LLM_FFN_SILU, false, ...,
  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX)``: the same.

llama.cpp names (jamba.cpp): ``attn_norm``; inside a Mamba layer nothing
(build_mamba_layer has no cb()); in an attention layer ``Qcur`` / ``Kcur`` / ``Vcur``
(no ROPE node: they enter kq as they are), ``kq_soft_max``, ``kqv_out``; then
``cb(cur, "ffn_inp", il)`` -- on ``cur``, the BRANCH's output (out_proj's / wo's),
not on the residual sum ``ffn_inp = ggml_add(inpL, cur)`` the line above makes, which
stays unnamed: jamba's ``ffn_inp`` is ``attn_out``, and ``resid_mid`` is not exposed;
``l_out``. The conv and SSM states come from ``llama_state_seq_get_data``.

Tiny config: 3 layers ``[mamba, attention, mamba]`` (attn period 3, offset 1), the
Mamba layers' FFN an MoE of 4 experts (2 used) of 64 (expert period 2, offset 0), the
attention layer's dense; hidden 64, 4 heads / 2 KV heads of 16, Mamba expand 2 (d_inner
128; jamba.cpp loads only 2), state 16, conv 4, dt rank 8.
"""

from __future__ import annotations

from contract.recurrent import RecurrentConfig
from contract.layers import NormSpec

from ...errors import UsageError
from .._gguf_export import NegExpALog, gguf_moe_convert
from .._lc_capture import lc_nope_points
from .._recurrent import RecurrentProbes
from ..base import LcPoint, LlamaLike, Point
from ..mamba import Mamba1Sizes, mamba1_config, mamba1_state_canonical, mamba1_weights
from .._gguf_import import experts, read_hparams, special_tokens, vocab_of

# jamba.cpp: `cb(cur, "ffn_inp", il)` names the branch's output; the sum is unnamed
_RESID_UNNAMED = ("jamba.cpp names the branch's output ffn_inp (cb(cur, \"ffn_inp\", il) after ffn_inp = "
                  "ggml_add(inpL, cur)): the residual sum itself carries no name")
_MAMBA_UNNAMED = ("mamba-base.cpp build_mamba_layer names no tensor inside the layer (jamba.cpp names only "
                  "attn_norm, then the mixer's output as ffn_inp); the conv and SSM states are read from "
                  "llama_state_seq_get_data")


class Jamba(RecurrentProbes, NegExpALog, LlamaLike):
    name = "jamba"
    # the fuzz: the generic heads knob, then the norm eps, layer count and context length
    # every family gets (harness/fuzz.py case_strategy)
    fuzz_space = {"knobs": ("heads",)}
    hf_model_type = "jamba"
    description = "hybrid: Mamba-1 layers (weighted dt / B / C norms) + NoPE attention layers, MoE every other layer"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        attn_layer_period=3, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0,
        num_experts=4, num_experts_per_tok=2,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8, mamba_conv_bias=True,
        mamba_proj_bias=False, use_mambapy=False, use_associative_scan=False,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    # JambaAttention.__init__ reads getattr(config, "head_dim", ...), but conversion/jamba.py writes
    # no key_length and jamba.cpp's wo is {n_embd, n_embd}: no head_dim of its own
    extra_settable = ()
    gguf_arch = "jamba"
    # JambaExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"
    hf_model_points = {"embeddings": ("model.embed_tokens", "out"), "final_norm": ("model.final_layernorm", "out")}
    hf_rec_module = "mamba"
    # z enters the scan (mamba_selective_scan's `z`): the taps read it there, no gated norm
    hf_rec_gate_norm = None
    lc_not_exposed = {**{p: _MAMBA_UNNAMED for p in ("rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v",
                                                     "rec_decay", "rec_out", "attn_branch")},
                      "resid_mid": _RESID_UNNAMED}
    # jamba.cpp: build_qkv's Qcur / Kcur / Vcur enter build_attn unrotated; build_attn's
    # kq_soft_max and kqv_out; the wo product named ffn_inp by jamba.cpp; l_out
    _lc_attention_points = lc_nope_points(attn_out=LcPoint("ffn_inp"), resid_mid=None)
    _lc_mamba_points = {"attn_in": LcPoint("attn_norm"), "attn_out": LcPoint("ffn_inp"), "layer_out": LcPoint("l_out")}

    def is_recurrent(self, config, i: int) -> bool:
        return config.layers_block_type[i] == "mamba"

    def uses_rope(self, config, i: int) -> bool:
        return False  # JambaAttention.forward rotates nothing (no rotary_emb in JambaModel)

    def _mamba1_sizes(self, config) -> Mamba1Sizes:
        """JambaMambaMixer.__init__'s names: d_inner = ``mamba_expand * hidden_size``,
        ``mamba_d_state``, ``mamba_dt_rank`` (JambaConfig.__post_init__ resolves "auto" to
        ceil(hidden / 16)), ``mamba_d_conv``."""
        return Mamba1Sizes(inner=config.mamba_expand * config.hidden_size, state=config.mamba_d_state,
                           dt_rank=int(config.mamba_dt_rank), conv=config.mamba_d_conv,
                           conv_bias=bool(config.mamba_conv_bias), proj_bias=bool(config.mamba_proj_bias))

    def validate(self, kw: dict) -> None:
        """The Mamba sizes by their HF names (HF checks them late or not at all)."""
        super().validate(kw)
        g = {**self.tiny, **kw}
        for key in ("mamba_d_state", "mamba_d_conv", "mamba_expand", "attn_layer_period", "expert_layer_period",
                    "num_experts", "num_experts_per_tok"):
            v = g.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UsageError(f"{key}={v!r}: must be a positive integer")
        r = g.get("mamba_dt_rank")
        if r != "auto" and (not isinstance(r, int) or isinstance(r, bool) or r < 1):
            raise UsageError(f"mamba_dt_rank={r!r}: must be a positive integer or \"auto\" (HF JambaConfig: "
                             f"ceil(hidden_size / 16))")
        if g["num_experts_per_tok"] > g["num_experts"]:
            raise UsageError(f"num_experts_per_tok={g['num_experts_per_tok']} > num_experts={g['num_experts']}; "
                             f"valid: 1 to {g['num_experts']}")

    def lc_refusal(self, config) -> str | None:
        """jamba.cpp load_arch_tensors ``GGML_ASSERT(2 * n_embd == d_inner)``, and
        build_mamba_layer's conv state of K - 1 rows."""
        if config.mamba_expand != 2:
            return (f"mamba_expand={config.mamba_expand}: llama.cpp's jamba loads only an expansion factor of 2 "
                    f"(jamba.cpp load_arch_tensors); valid for --ref llamacpp: 2 (HF computes any: --ref hf or "
                    f"hf_cached)")
        if config.mamba_d_conv < 2:
            return (f"mamba_d_conv={config.mamba_d_conv}: llama.cpp's Mamba keeps d_conv - 1 rows of conv state "
                    f"and asserts at least one; valid for --ref llamacpp: >= 2 (HF computes 1: --ref hf or hf_cached)")
        return None

    def layer_config(self, config, i: int):
        if self.is_recurrent(config, i):
            eps = float(config.rms_norm_eps)
            # JambaMambaMixer.__init__: dt / b / c_layernorm = JambaRMSNorm(..., eps=config.rms_norm_eps)
            return mamba1_config(self._mamba1_sizes(config), config.hidden_size, NormSpec("rms", eps),
                                 NormSpec("rms", eps))
        return super().layer_config(config, i)

    def layer_weights(self, model, config, i: int):
        if self.is_recurrent(config, i):
            return mamba1_weights(self.decoder_layers(model)[i], "mamba", "input_layernorm", self._mamba1_sizes(config),
                                  bc_weights=True)
        return super().layer_weights(model, config, i)

    # ------------------------------------------------------------------ probes
    def hf_points_for(self, config, i: int):
        if self.is_recurrent(config, i):
            # JambaMambaDecoderLayer.forward: input_layernorm -> mamba -> residual -> pre_ff_layernorm
            return {"layer_in": Point("", "in"), "attn_in": Point("mamba", "in"),
                    "attn_branch": Point("mamba.out_proj", "in"), "attn_out": Point("mamba", "out"),
                    "resid_mid": Point("pre_ff_layernorm", "in"), "layer_out": Point("", "out")}
        # JambaAttentionDecoderLayer.forward: the residual is pre_ff_layernorm's input
        return {**LlamaLike.hf_points, "resid_mid": Point("pre_ff_layernorm", "in")}

    def lc_points_for(self, config, i: int):
        return self._lc_mamba_points if self.is_recurrent(config, i) else self._lc_attention_points

    def lc_canonical(self, probe, arr, lc, config):
        if isinstance(lc, RecurrentConfig):
            return self.lc_recurrent_canonical(probe, arr, lc, config)
        return super().lc_canonical(probe, arr, lc, config)

    def lc_state_canonical(self, r_row, s_row, lc, config) -> dict:
        return mamba1_state_canonical(r_row, s_row, lc)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """conversion/jamba.py ``JambaModel.set_gguf_parameters``, key for key (it does not
        call TextModel's): ``attention.head_count_kv`` per layer, 0 for a Mamba layer
        (``n_kv_vec``: jamba.cpp ``is_recr_impl[i] = n_head_kv(i) == 0``), the SSM keys,
        the RMS eps from ``rms_norm_eps``, the expert counts; no ``vocab_size`` (it writes
        none: the vocabulary is token_embd's rows)."""
        s = self._mamba1_sizes(config)
        if s.proj_bias:
            raise ValueError(f"{self.name} export: mamba_proj_bias=true is not exported (jamba.cpp load_arch_tensors "
                             f"loads no ssm_in / ssm_out bias); valid: false")
        if not s.conv_bias:
            raise ValueError(f"{self.name} export: mamba_conv_bias=false is not exported (jamba.cpp "
                             f"load_arch_tensors requires ssm_conv1d.bias); valid: true")
        off, per = config.attn_layer_offset, config.attn_layer_period
        n_kv = [0] * off + [config.num_key_value_heads if (i - off) % per == 0 else 0
                            for i in range(off, config.num_hidden_layers)]
        w.add_block_count(config.num_hidden_layers)
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(n_kv)
        w.add_ssm_conv_kernel(s.conv)
        w.add_ssm_inner_size(s.inner)
        w.add_ssm_state_size(s.state)
        w.add_ssm_time_step_rank(s.dt_rank)
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_tok)

    def gguf_convert(self, name, data, config, variant=None):
        """JambaModel.modify_tensors: the experts stacked under qwen2moe's merged name
        (``model.layers.{bid}.mlp.experts.{wid}.weight``; transformers 5 holds them fused,
        split as gguf_moe_convert does), the conv squeezed (``A_log``'s ``-exp`` is the
        value step, NegExpALog); the router (``feed_forward.router``) and a dense layer's
        ``feed_forward.*_proj`` by gguf's own map."""
        if ".feed_forward.experts." in name:
            yield from gguf_moe_convert(name.replace(".feed_forward.experts.", ".mlp.experts."), data)
            return
        yield name, (data.squeeze() if name.endswith("mamba.conv1d.weight") else data)

    def config_from_gguf(self, meta, shapes, tensors):
        """jamba.cpp load_arch_hparams: the SSM keys, the RMS eps, a layer with no KV head
        is a Mamba layer; as HF Jamba can hold it: the attention layers every
        ``attn_layer_period`` from ``attn_layer_offset``, the MoE layers (``ffn_gate_inp``
        present) every ``expert_layer_period`` from ``expert_layer_offset``, one head and
        KV-head count, expand = inner / hidden."""

        hp = read_hparams(meta)
        attn = [i for i, k in enumerate(hp.n_head_kv) if k]
        moe = [i for i in range(hp.n_layer) if f"blk.{i}.ffn_gate_inp.weight" in shapes]
        kv = {hp.n_head_kv[i] for i in attn}
        heads = {hp.n_head[i] for i in attn}
        if len(kv) != 1 or len(heads) != 1:
            meta.refuse("attention.head_count_kv", hp.n_head_kv, "one head and KV-head count for the attention "
                                                                 "layers, at least one (0 marks a Mamba layer)")
        a_off, a_per = _period(attn, hp.n_layer)
        if a_per is None:
            meta.refuse("attention.head_count_kv", hp.n_head_kv, "attention layers every attn_layer_period from "
                                                                 "attn_layer_offset (HF JambaConfig.layers_block_type)")
        n_exp, n_used = experts(meta, hp, self.name) if moe else (1, 1)
        e_off, e_per = _period(moe, hp.n_layer) if moe else (0, hp.n_layer + 1)
        if e_per is None:
            meta.refuse("ffn_gate_inp", moe, "MoE layers every expert_layer_period from expert_layer_offset "
                                             "(HF JambaConfig.layers_num_experts)")
        inner = int(meta.get("ssm.inner_size"))
        if inner % hp.n_embd:
            meta.refuse("ssm.inner_size", inner, f"not a multiple of embedding_length {hp.n_embd} (HF's mamba_expand)")
        n_head = heads.pop()
        if hp.n_embd % n_head or hp.n_embd_head_k != hp.n_embd // n_head:
            meta.refuse("attention.key_length", hp.n_embd_head_k, f"HF JambaAttention's head_dim is hidden / heads "
                                                                   f"= {hp.n_embd // n_head}")
        vocab = vocab_of(meta, shapes)
        return {"vocab_size": vocab, "hidden_size": hp.n_embd, "intermediate_size": hp.ff,
                "num_hidden_layers": hp.n_layer, "num_attention_heads": n_head, "num_key_value_heads": kv.pop(),
                "max_position_embeddings": hp.n_ctx_train,
                "rms_norm_eps": meta.get_f32("attention.layer_norm_rms_epsilon"),
                "attn_layer_period": a_per, "attn_layer_offset": a_off,
                "expert_layer_period": e_per, "expert_layer_offset": e_off,
                "num_experts": n_exp, "num_experts_per_tok": n_used,
                "mamba_d_state": int(meta.get("ssm.state_size")), "mamba_d_conv": int(meta.get("ssm.conv_kernel")),
                "mamba_expand": inner // hp.n_embd, "mamba_dt_rank": int(meta.get("ssm.time_step_rank")),
                "mamba_conv_bias": True, "mamba_proj_bias": False, "use_mambapy": False,
                "use_associative_scan": False,
                "tie_word_embeddings": "output.weight" not in shapes, **special_tokens(meta, vocab)}


def _period(layers: list[int], n_layer: int) -> tuple[int, int | None]:
    """``(offset, period)`` with ``layers == [i for i in range(n_layer) if i % period ==
    offset]`` and offset < period (JambaConfig.validate_architecture), or ``(0, None)``."""
    if not layers:
        return 0, None
    off = layers[0]
    steps = {b - a for a, b in zip(layers, layers[1:])}
    cands = list(steps) if steps else list(range(off + 1, n_layer + 1))
    for per in cands:
        if per > off and layers == [i for i in range(n_layer) if i % per == off]:
            return off, per
    return 0, None


FAMILY = Jamba()
