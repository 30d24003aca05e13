"""bamba: Mamba-2 layers with attention layers among them (HF ``BambaForCausalLM``,
transformers/models/bamba/modeling_bamba.py; llama.cpp arch ``granitehybrid``,
src/models/granite-hybrid.cpp + mamba-base.cpp ``build_mamba2_layer``; converter
conversion/granite.py ``GraniteHybridModel``, registered for ``BambaForCausalLM`` and
``GraniteMoeHybridForCausalLM`` alike).

``attn_layer_indices`` are attention layers (``BambaAttention``: llama-shaped, RoPE
on ``partial_rotary_factor`` = 0.5 of the head -- ``BambaConfig.__post_init__``
hard-codes it), the others ``BambaMixer`` (the Mamba-2 mixer, harness/families/
_mamba2.py). Every layer: ``input_layernorm`` -> mixer or attention -> + residual ->
``pre_ff_layernorm`` -> a dense SwiGLU ``feed_forward``.

``GraniteHybrid`` is what both families of the converter's class share: the export
(``GraniteHybridModel.set_gguf_parameters``: GraniteMoeModel's keys -- LlamaModel's,
the granite multipliers where truthy, the shared expert's width -- then the SSM
keys, ``attention.head_count_kv`` per layer with 0 for a Mamba layer, which is how
granite-hybrid.cpp tells them apart: ``is_recr_impl[i] = n_head_kv(i) == 0``), the
probe maps of the two layer kinds, the states.

llama.cpp names (granite-hybrid.cpp): ``attn_norm``; in a Mamba layer
``mamba2_y_add_d`` and ``mamba_out`` (build_mamba2_layer), in an attention layer
``Qcur`` / ``Kcur`` / ``Vcur``, ``kq_soft_max``, ``kqv_out``, ``attn_out``; then
``ffn_inp`` (the residual, after ``f_residual_scale``) and ``l_out``.

RoPE: llama.cpp's granitehybrid rotates with LLAMA_ROPE_TYPE_NORM
(llama-model.cpp ``llama_model_rope_type``), so the converter permutes the Q / K
rows per head (``undo_permute = True``, LlamaModel.modify_tensors) and writes
``rope.dimension_count`` = ``attn_rotary_emb`` where the checkpoint's config.json
has it (the IBM checkpoints do: half the head), else the whole head
(LlamaModel.set_gguf_parameters). The tiny config carries ``attn_rotary_emb`` as
the checkpoints do. Both settings rotate other channel pairs than HF's partial
neox rotation (findings.toml).

Tiny config: 3 layers ``[mamba, attention, mamba]``, hidden 64, 4 heads / 2 KV heads
of 16 (rotary 8), Mamba-2 of 8 heads x 16, 2 groups, state 16, conv 4, HF chunk 16.
"""

from __future__ import annotations

import dataclasses

from contract.recurrent import RecurrentConfig
from contract.layers import NormSpec

from .._gguf_export import NegExpALog, gguf_moe_convert, text_model_gguf_params
from .._mamba2 import (LC_NOT_EXPOSED, LC_POINTS, Mamba2Sizes, mamba2_config, mamba2_convert, validate_ssd_shapes,
                       mamba2_state_canonical, mamba2_weights, refuse_short_conv)
from .._recurrent import RecurrentProbes
from ..base import LcPoint, LlamaLike, Point
from ..llama import PermutedQK
from .._gguf_import import hf_rope, read_hparams, special_tokens, vocab_of, refuse_experts


class GraniteHybrid(RecurrentProbes, NegExpALog, PermutedQK):
    """conversion/granite.py ``GraniteHybridModel`` -> llama.cpp ``granitehybrid``."""
    gguf_arch = "granitehybrid"
    hf_rec_module = "mamba"
    hf_rec_gate_norm = "norm"
    # the decoder layer's norm after the residual (bamba: pre_ff_layernorm)
    _hf_ffn_norm = "post_attention_layernorm"
    lc_not_exposed = LC_NOT_EXPOSED
    # what the converter reads the Mamba sizes by (find_hparam with the "mamba" prefix)
    size_keys = {"hidden": "hidden_size", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
                 "layers": "num_hidden_layers"}

    def is_recurrent(self, config, i: int) -> bool:
        # BambaConfig.layers_block_type (from attn_layer_indices) / GraniteMoeHybridConfig.layer_types
        return config.layers_block_type[i] == "linear_attention"

    def _ssm_sizes(self, config) -> Mamba2Sizes:
        """The mixer's sizes by the hybrid configs' ``mamba_*`` names (BambaMixer /
        GraniteMoeHybridMambaLayer ``__init__``: the gated norm's eps is ``rms_norm_eps``)."""
        return Mamba2Sizes(heads=config.mamba_n_heads, head_dim=config.mamba_d_head, groups=config.mamba_n_groups,
                           state=config.mamba_d_state, conv=config.mamba_d_conv,
                           conv_bias=bool(config.mamba_conv_bias), proj_bias=bool(config.mamba_proj_bias),
                           eps=float(config.rms_norm_eps), chunk=int(config.mamba_chunk_size),
                           limit=None if config.time_step_limit is None else tuple(config.time_step_limit))

    def _residual_multiplier(self, config) -> float:
        return 1.0

    def validate(self, kw: dict) -> None:
        """The Mamba shapes HF checks late or not at all, by their HF names."""
        super().validate(kw)
        g = {**self.tiny, **kw}
        validate_ssd_shapes({k: g.get(k) for k in ("mamba_n_heads", "mamba_n_groups", "mamba_d_state", "mamba_d_conv",
                                                   "mamba_chunk_size", "mamba_expand")},
                            "mamba_n_heads", "mamba_n_groups")

    def lc_refusal(self, config) -> str | None:
        """granite-hybrid.cpp load_arch_tensors ``GGML_ASSERT(2 * n_embd == d_inner)``
        (an expansion of 2 only) and build_mamba2_layer's conv state of K - 1 rows."""
        s = self._ssm_sizes(config)
        if s.inner != 2 * config.hidden_size:
            return (f"mamba_expand={config.mamba_expand} (d_inner {s.inner}): llama.cpp's granitehybrid asserts "
                    f"d_inner == 2 * hidden_size (granite-hybrid.cpp load_arch_tensors); valid for --ref llamacpp: "
                    f"mamba_expand=2 (HF computes any: --ref hf or hf_cached)")
        return refuse_short_conv(s, "mamba_d_conv")

    def layer_config(self, config, i: int):
        if self.is_recurrent(config, i):
            return mamba2_config(self._ssm_sizes(config), config.hidden_size, NormSpec("rms", float(config.rms_norm_eps)),
                                 residual_beta=self._residual_multiplier(config))
        return super().layer_config(config, i)

    def layer_weights(self, model, config, i: int):
        if self.is_recurrent(config, i):
            return mamba2_weights(self.decoder_layers(model)[i], "mamba", "input_layernorm", self._ssm_sizes(config))
        return super().layer_weights(model, config, i)

    # ------------------------------------------------------------------ probes
    def hf_points_for(self, config, i: int):
        if self.is_recurrent(config, i):
            # *DecoderLayer.forward: input_layernorm -> mamba -> residual (+ multiplier) -> ffn norm
            return {"layer_in": Point("", "in"), "attn_in": Point("mamba", "in"),
                    "attn_branch": Point("mamba.out_proj", "in"), "attn_out": Point("mamba", "out"),
                    "resid_mid": Point(self._hf_ffn_norm, "in"), "layer_out": Point("", "out")}
        return {**LlamaLike.hf_points, "resid_mid": Point(self._hf_ffn_norm, "in")}

    def lc_points_for(self, config, i: int):
        if self.is_recurrent(config, i):
            return {**LC_POINTS, "resid_mid": LcPoint("ffn_inp"), "layer_out": LcPoint("l_out")}
        return self.lc_points

    def lc_canonical(self, probe, arr, lc, config):
        if isinstance(lc, RecurrentConfig):
            return self.lc_recurrent_canonical(probe, arr, lc, config)
        return super().lc_canonical(probe, arr, lc, config)

    def lc_state_canonical(self, r_row, s_row, lc, config) -> dict:
        return mamba2_state_canonical(r_row, s_row, lc)

    # ------------------------------------------------------------------ GGUF
    def _uses_rope_in_gguf(self, config) -> bool:
        """GraniteHybridModel.set_gguf_parameters: ``use_rope = "BambaForCausalLM" in
        architectures or not self._ssm_layers``."""
        raise NotImplementedError

    def gguf_params(self, w, config, variant=None):
        """GraniteHybridModel.set_gguf_parameters, key for key (a key written twice keeps
        the later value: gguf-py's GGUFWriter overwrites a duplicated key)."""
        s = self._ssm_sizes(config)
        use_rope = self._uses_rope_in_gguf(config)
        # GraniteMoeModel -> GraniteModel (head_dim popped) -> LlamaModel -> TextModel, with the
        # keys this method writes again later given their final values here (one write each)
        text_model_gguf_params(w, _Overridden(config, num_key_value_heads=[
            0 if self.is_recurrent(config, i) else config.num_key_value_heads for i in range(config.num_hidden_layers)],
            max_position_embeddings=config.max_position_embeddings if use_rope else 2 ** 20))
        w.add_vocab_size(config.vocab_size)
        rope_dim = config.hidden_size // config.num_attention_heads
        for value, add in ((getattr(config, "attention_multiplier", None), w.add_attention_scale),
                           (getattr(config, "embedding_multiplier", None), w.add_embedding_scale),
                           (getattr(config, "residual_multiplier", None), w.add_residual_scale),
                           (getattr(config, "logits_scaling", None), w.add_logit_scale)):
            if value:
                add(value)
        if getattr(config, "shared_intermediate_size", None):
            w.add_expert_shared_feed_forward_length(config.shared_intermediate_size)
        # the Mamba mixer's keys (find_hparam(..., "mamba_" prefixed))
        w.add_ssm_conv_kernel(s.conv)
        w.add_ssm_state_size(s.state)
        w.add_ssm_group_count(s.groups)
        w.add_ssm_inner_size(config.mamba_expand * config.hidden_size)
        w.add_ssm_time_step_rank(s.heads)
        # attention: the rope dims (attn_rotary_emb overrides LlamaModel's), KV heads per layer
        # (head_count_kv: TextModel's scalar, then this list; context_length: 2**20 without RoPE)
        w.add_rope_dimension_count(getattr(config, "attn_rotary_emb", None) or rope_dim)
        w.add_rope_scaling_finetuned(use_rope)

    def _hybrid_gguf_config(self, meta, shapes) -> tuple[dict, object]:
        """What granite-hybrid.cpp load_arch_hparams reads for either family: the RMS eps,
        the SSM keys (inner size = expand x hidden; time-step rank = the Mamba heads), a
        layer with no KV head is a Mamba layer (``is_recr_impl[i] = n_head_kv(i) == 0``),
        one head / KV-head count for the attention layers, the RoPE switch
        (``rope.scaling.finetuned``, default true). ``(kwargs, hparams)``."""

        hp = read_hparams(meta)
        kv = {k for k in hp.n_head_kv if k}
        if len(kv) != 1:
            meta.refuse("attention.head_count_kv", hp.n_head_kv, "one KV head count for the attention layers "
                                                                  "(0 marks a Mamba layer)")
        heads = {h for h, k in zip(hp.n_head, hp.n_head_kv) if k}
        if len(heads) != 1:
            meta.refuse("attention.head_count", hp.n_head, "one head count for the attention layers")
        n_head = next(iter(heads))
        hp = dataclasses.replace(hp, n_head=[n_head] * hp.n_layer)
        if hp.n_embd_head_k != hp.n_embd // n_head or hp.n_embd_head_v != hp.n_embd_head_k:
            meta.refuse("attention.key_length", hp.n_embd_head_k, f"the HF attention's head_dim is hidden / heads "
                                                                   f"= {hp.n_embd // n_head}")
        inner, heads_ssm = int(meta.get("ssm.inner_size")), int(meta.get("ssm.time_step_rank"))
        if heads_ssm < 1 or inner % heads_ssm:
            meta.refuse("ssm.inner_size", inner, f"not a multiple of ssm.time_step_rank {heads_ssm} (the heads)")
        if inner % hp.n_embd:
            meta.refuse("ssm.inner_size", inner, f"not a multiple of embedding_length {hp.n_embd} (HF's expand)")
        vocab = vocab_of(meta, shapes)
        conv = int(meta.get("ssm.conv_kernel"))
        kw = {"vocab_size": vocab, "hidden_size": hp.n_embd, "num_hidden_layers": hp.n_layer,
              "num_attention_heads": n_head, "num_key_value_heads": kv.pop(),
              "max_position_embeddings": hp.n_ctx_train,
              "rms_norm_eps": meta.get_f32("attention.layer_norm_rms_epsilon"),
              "mamba_n_heads": heads_ssm, "mamba_d_head": inner // heads_ssm, "mamba_expand": inner // hp.n_embd,
              "mamba_n_groups": int(meta.get("ssm.group_count")), "mamba_d_state": int(meta.get("ssm.state_size")),
              "mamba_d_conv": conv, "mamba_proj_bias": False,
              "mamba_conv_bias": any(n.endswith("ssm_conv1d.bias") for n in shapes),
              # no key holds HF's SSD chunk (llama.cpp's ssm_scan is sequential): the family's own
              "mamba_chunk_size": self.tiny["mamba_chunk_size"],
              "tie_word_embeddings": "output.weight" not in shapes, **special_tokens(meta, vocab)}
        kw["_recurrent"] = [k == 0 for k in hp.n_head_kv]
        kw["_rope"] = bool(meta.get("rope.scaling.finetuned", True))
        kw["_rope_parameters"] = hf_rope(meta, hp)
        return kw, hp

    def gguf_convert(self, name, data, config, variant=None):
        """GraniteHybridModel.modify_tensors: a Mamba layer's tensors by Mamba2Model's
        steps, the rest by GraniteMoeModel's (the experts' and the shared MLP's fused
        input_linear split gate | up on dim -2) down to LlamaModel's Q / K permutation."""
        out = mamba2_convert(name, data, self._ssm_sizes(config)) if ".mamba." in name else None
        if out is not None:
            yield from out
            return
        if name.endswith("block_sparse_moe.experts.gate_up_proj"):
            # transformers 5 keeps the checkpoint's input_linear [E, 2F, H] as gate_up_proj
            f = data.shape[-2] // 2
            base = name.replace("block_sparse_moe.experts.gate_up_proj", "mlp.experts")
            yield base + ".gate_proj.weight", data[..., :f, :].copy()
            yield base + ".up_proj.weight", data[..., f:, :].copy()
            return
        if name.endswith("block_sparse_moe.experts.down_proj"):
            yield name.replace("block_sparse_moe.experts.down_proj", "mlp.experts.down_proj.weight"), data
            return
        if name.endswith("block_sparse_moe.router.weight"):
            yield name.replace("router.weight", "router.layer.weight"), data
            return
        if name.endswith("shared_mlp.input_linear.weight"):
            f = data.shape[-2] // 2
            experts = bool(getattr(config, "num_local_experts", 0))
            # with experts: the shared expert's gate / up; without: the dense FFN's
            part = "mlp.shared_expert" if experts else "mlp"
            base = name.replace("shared_mlp.input_linear.weight", part)
            yield base + ".gate_proj.weight", data[:f].copy()
            yield base + ".up_proj.weight", data[f:].copy()
            return
        if name.endswith("shared_mlp.output_linear.weight") and not getattr(config, "num_local_experts", 0):
            yield name.replace("shared_mlp.output_linear", "mlp.down_proj"), data
            return
        moe = gguf_moe_convert(name, data)
        if moe is not None:
            yield from moe
            return
        yield from super().gguf_convert(name, data, config, variant)


class _Overridden:
    """The HF config with a few values replaced, as the converter ends up writing them."""
    def __init__(self, config, **values):
        self._config, self._values = config, values

    def __getattr__(self, name):
        values = self.__dict__["_values"]
        return values[name] if name in values else getattr(self.__dict__["_config"], name)


class Bamba(GraniteHybrid):
    name = "bamba"
    # the fuzz: the generic heads knob, then the norm eps, layer count and context length
    # every family gets (harness/fuzz.py case_strategy)
    fuzz_space = {"knobs": ("heads",)}
    hf_model_type = "bamba"
    description = "hybrid: Mamba-2 layers + attention layers (partial RoPE 0.5), dense SwiGLU"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=2, mamba_d_state=16,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
        # the IBM checkpoints' config.json carries it (Bamba-9B: 64 of head_dim 128); HF's
        # BambaConfig does not read it (partial_rotary_factor 0.5 is hard-coded), the converter does
        attn_rotary_emb=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    extra_settable = ("attn_rotary_emb",)
    _hf_ffn_norm = "pre_ff_layernorm"
    hf_model_points = {"embeddings": ("model.embed_tokens", "out"), "final_norm": ("model.final_layernorm", "out")}

    def _uses_rope_in_gguf(self, config) -> bool:
        return True  # "BambaForCausalLM" in architectures

    def config_from_gguf(self, meta, shapes, tensors):
        """granite-hybrid.cpp load_arch_hparams, as HF Bamba can hold it: RoPE on (HF's
        BambaAttention always rotates), no experts, no granite multipliers (BambaConfig
        has none: each key absent or 0, which the graph reads as none), a dense FFN."""

        kw, hp = self._hybrid_gguf_config(meta, shapes)
        refuse_experts(meta, hp, self.name)
        if not kw.pop("_rope"):
            meta.refuse("rope.scaling.finetuned", False, "no RoPE (a Granite 4.0-H file: family granitemoehybrid); "
                                                         "HF Bamba rotates")
        # each key absent, 0 or its no-op value (1; the attention scale 1/sqrt(head_dim))
        hd = kw["hidden_size"] // kw["num_attention_heads"]
        for key, noop in (("logit_scale", 1.0), ("residual_scale", 1.0), ("embedding_scale", 1.0),
                          ("attention.scale", float(hd) ** -0.5)):
            v = meta.get_f32(key, 0.0)
            if v and abs(v - noop) > 1e-6 * noop:
                meta.refuse(key, v, f"a granite multiplier; HF Bamba has none (valid: absent, 0 or {noop:g}; "
                                    f"family granitemoehybrid has them)")
        meta.get("expert_shared_feed_forward_length", None)  # a shared expert exists only with experts (refused)
        recr = kw.pop("_recurrent")
        kw["rope_parameters"] = kw.pop("_rope_parameters")
        kw["attn_layer_indices"] = [i for i, r in enumerate(recr) if not r]
        kw["intermediate_size"] = hp.ff
        # rope.dimension_count: written from attn_rotary_emb (conversion/granite.py); HF rotates
        # half the head whatever it says (configuration_bamba.py partial_rotary_factor = 0.5)
        if hp.n_rot != kw["hidden_size"] // kw["num_attention_heads"]:
            kw["attn_rotary_emb"] = hp.n_rot
        return kw


FAMILY = Bamba()
