"""falcon_h1: attention and a Mamba-2 block in PARALLEL on the same normed row, summed
(HF ``FalconH1ForCausalLM``, transformers/models/falcon_h1/modeling_falcon_h1.py; llama.cpp
arch ``falcon-h1``, src/models/falcon-h1.cpp + mamba-base.cpp ``build_mamba2_layer``;
converter conversion/falcon_h1.py ``FalconH1Model(Mamba2Model)``).

Every layer (``FalconH1DecoderLayer.forward``): ``input_layernorm`` (RMS) -> the SAME
normed row into ``FalconH1Mixer`` (Mamba-2, the shared body of harness/families/_mamba2.py)
and into ``FalconH1Attention`` (llama-shaped, neox RoPE over the whole head) -> their sum
(each with its multipliers) + residual -> ``pre_ff_layernorm`` -> SwiGLU ``feed_forward``.
impl's description is ONE ``LayerConfig`` with ``parallel_ssm`` (the spec's
``parallel_ssm_rows``, falcon-h1.cpp:156-160): the attention body and the Mamba-2 body
unchanged, the layer sums them.

The multipliers (HF applies them at run time, the converter folds every one into a
weight -- conversion/falcon_h1.py ``modify_tensors`` -- and falcon-h1.cpp applies none):

=========================== ============================================== ==================================
multiplier                  HF (modeling_falcon_h1.py)                      converter folds it into
=========================== ============================================== ==================================
attention_in_multiplier     DecoderLayer: ``self_attn(h * m)``              q_proj, k_proj, v_proj
key_multiplier              Attention: ``k_proj(h).view(..) * m``           k_proj
attention_out_multiplier    DecoderLayer: ``attention_hidden_states * m``   o_proj
ssm_in_multiplier           Mixer: ``hidden_states * m`` before in_proj     in_proj
ssm_multipliers (mup)       Mixer: ``in_proj(h) * mup_vector`` (z|x|B|C|dt) in_proj's row segments
ssm_out_multiplier          DecoderLayer: ``mamba_hidden_states * m``       out_proj
mlp_multipliers             MLP: ``gate_proj(x) * m0``, ``down_proj(y) * m1`` gate_proj, down_proj
embedding_multiplier        Model: ``embed_tokens(ids) * m``                embed_tokens
lm_head_multiplier          CausalLM: ``lm_head(h) * m``                    lm_head
=========================== ============================================== ==================================

impl carries the attention / SSM ones in the layer description (``LayerConfig``
``attn_in_multiplier`` ... ``ssm_out_multiplier``, ``RecurrentConfig.proj_multipliers``),
as HF computes them; the FFN's and the model's act outside the attention half and are
compared at ``layer_out``, ``embeddings`` and ``logits``.

Probes. ``attn_in`` is the normed row (the mixer's input; HF's ``self_attn`` reads it
times attention_in_multiplier). ``q`` / ``v`` are HF's projections of the scaled row;
HF's ``k`` is ``k_proj``'s output times ``key_multiplier`` (the view HF multiplies,
modeling_falcon_h1.py:209), ``attn_out`` ``self_attn``'s output times
attention_out_multiplier (:935), ``ssm_out`` the mixer's output times
ssm_out_multiplier (:924) -- each multiplied here as HF's next line does, since no module
returns the product. llama.cpp names (falcon-h1.cpp): ``attn_norm``, ``Qcur`` / ``Kcur`` /
``Vcur``, ``kq_soft_max``, ``kqv_out``, ``attn_out`` (after wo), ``ssm_out`` (the Mamba-2
block's output), ``ffn_inp`` (the residual after the sum), ``l_out``. The Mamba-2
block's insides (rec_* and its states) are not probes of this layer: impl runs them as
the mamba2 families' body, judged there; here the SSM branch is judged at ``ssm_out``
on every call of every schedule, which a wrong carried state fails.

The gated norm (``mamba_rms_norm``): HF ``FalconH1RMSNormGated`` orders norm and gate by
``mamba_norm_before_gate``; build_mamba2_layer always gates then norms. The tiny config
sits where both agree (``mamba_rms_norm=True, mamba_norm_before_gate=False``); the other
order is a finding (findings.toml).

Tiny config: 2 layers (each with both branches), hidden 64, 4 heads / 2 KV heads of 16,
Mamba-2 of 8 heads x 16 (d_ssm 128), 2 groups, state 16, conv 4, HF chunk 16, every
multiplier other than 1 and the five mup segments distinct.
"""

from __future__ import annotations

import numpy as np

from ...errors import UsageError
from .._gguf_export import NegExpALog
from .._mamba2 import (Mamba2Sizes, mamba2_config, mamba2_convert, mamba2_weights, refuse_short_conv,
                      validate_ssd_shapes)
from ..base import LcPoint, LlamaLike, Point
from contract.layers import NormSpec
from harness.lazy import lazy
from ..base import tensor
from .._gguf_import import hf_rope, read_hparams, refuse_experts, special_tokens, vocab_of

torch = lazy("torch")

MULTIPLIERS = ("attention_in_multiplier", "key_multiplier", "attention_out_multiplier", "ssm_in_multiplier",
               "ssm_out_multiplier", "embedding_multiplier", "lm_head_multiplier")


class FalconH1(NegExpALog, LlamaLike):
    name = "falcon_h1"
    # the fuzz: the generic heads knob, then the norm eps, layer count and context length
    # every family gets (harness/fuzz.py case_strategy)
    fuzz_space = {"knobs": ("heads",)}
    hf_model_type = "falcon_h1"
    description = "parallel hybrid: attention + Mamba-2 on the same normed row, summed; muP multipliers"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
        mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
        mamba_rms_norm=True, mamba_norm_before_gate=False, projectors_bias=False, attention_bias=False,
        mlp_bias=False,
        attention_in_multiplier=0.75, key_multiplier=0.5, attention_out_multiplier=0.9,
        ssm_in_multiplier=1.25, ssm_out_multiplier=0.6, ssm_multipliers=[0.4, 0.6, 0.8, 1.2, 0.5],
        mlp_multipliers=[0.8, 0.7], embedding_multiplier=1.5, lm_head_multiplier=0.8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    extra_settable = ("head_dim",)
    gguf_arch = "falcon-h1"
    # feature bisection's weight switch of the parallel branch (harness/kinds/attention/switches.py):
    # FalconH1Mixer.out_proj (and its bias, with projectors_bias) zeroed
    switch_params = {**LlamaLike.switch_params, "parallel_ssm": ("mamba.out_proj.weight", "mamba.out_proj.bias")}

    hf_points = {
        "layer_in": Point("", "in"),
        # the normed row both branches read (FalconH1DecoderLayer.forward: `self.mamba(hidden_states=...)`
        # takes it as it is; self_attn takes it times attention_in_multiplier)
        "attn_in": Point("mamba", "in"),
        "q": Point("self_attn.q_proj", "out"),
        "k": Point("self_attn.k_proj", "out"),
        "v": Point("self_attn.v_proj", "out"),
        "attn_branch": Point("self_attn.o_proj", "in"),
        "attn_out": Point("self_attn", "out"),
        "ssm_out": Point("mamba", "out"),
        "resid_mid": Point("pre_ff_layernorm", "in"),
        "layer_out": Point("", "out"),
    }
    # FalconH1Model.forward: `inputs_embeds = embed_tokens(ids) * embedding_multiplier` outside the
    # module: the first layer's input is the scaled embedding (llama.cpp's `embd`: the folded table)
    hf_model_points = {"embeddings": ("model.layers.0", "in"), "final_norm": ("model.final_layernorm", "out")}
    # falcon-h1.cpp cb() names: the graph renames the rotated Q / K and the reshaped V
    # (`cb(Qcur, "Qcur-post-rope", il)`, same tensor objects: ggml keeps the last name)
    lc_points = {**LlamaLike.lc_points, "q_rope": LcPoint("Qcur-post-rope", "last", "heads"),
                 "k_rope": LcPoint("Kcur-post-rope", "last", "heads"),
                 "v": LcPoint("Vcur-post-rope", "last", "heads"), "ssm_out": LcPoint("ssm_out")}

    # ------------------------------------------------------------------ config
    def validate(self, kw: dict) -> None:
        super().validate(kw)
        g = {**self.tiny, **kw}
        validate_ssd_shapes({k: g.get(k) for k in ("mamba_n_heads", "mamba_n_groups", "mamba_d_state", "mamba_d_conv",
                                                   "mamba_chunk_size", "mamba_d_ssm")},
                            "mamba_n_heads", "mamba_n_groups")
        if g["mamba_d_ssm"] % g["mamba_n_heads"]:
            raise UsageError(f"mamba_d_ssm={g['mamba_d_ssm']} is not a multiple of mamba_n_heads="
                             f"{g['mamba_n_heads']}; valid: a multiple (HF FalconH1Config.validate_architecture)")
        for key in MULTIPLIERS:
            v = g.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise UsageError(f"{key}={v!r}: must be a finite number")
        for key, n in (("ssm_multipliers", 5), ("mlp_multipliers", 2)):
            v = g.get(key)
            if not isinstance(v, (list, tuple)) or len(v) != n or not all(
                    isinstance(m, (int, float)) and not isinstance(m, bool) and np.isfinite(m) for m in v):
                raise UsageError(f"{key}={v!r}: must be a list of {n} finite numbers")

    def _ssm_sizes(self, config) -> Mamba2Sizes:
        """FalconH1Mixer.__init__'s sizes (intermediate = mamba_d_ssm; the gated norm's eps is
        rms_norm_eps)."""
        return Mamba2Sizes(heads=config.mamba_n_heads, head_dim=config.mamba_d_head, groups=config.mamba_n_groups,
                           state=config.mamba_d_state, conv=config.mamba_d_conv,
                           conv_bias=bool(config.mamba_conv_bias), proj_bias=bool(config.mamba_proj_bias),
                           eps=float(config.rms_norm_eps), chunk=int(config.mamba_chunk_size),
                           limit=None if config.time_step_limit is None else tuple(config.time_step_limit))

    def lc_refusal(self, config) -> str | None:
        for key in ("mamba_proj_bias", "projectors_bias"):
            if getattr(config, key, False):
                return (f"{key}=true: falcon-h1.cpp load_arch_tensors loads no ssm_in / ssm_out bias; valid for "
                        f"--ref llamacpp: false (HF computes it: --ref hf or hf_cached)")
        # falcon-h1.cpp:91 loads attn_output.bias (wo_b, not required), and :152-154
        # build_attn(..., model.layers[il].wo, NULL, ...) passes NULL for it: o_proj's bias
        # (HF FalconH1Attention: o_proj bias=config.attention_bias) is never added. (The
        # converter also scales the q/k/v biases by attention_in_multiplier, which HF applies
        # to the input only: conversion/falcon_h1.py:68-73 match "q_proj" in the bias's name.)
        if getattr(config, "attention_bias", False):
            return ("attention_bias=true: falcon-h1.cpp loads attn_output.bias (:91) and never adds it "
                    "(build_attn(..., wo, NULL, ...) at :152-154), where HF biases o_proj; valid for "
                    "--ref llamacpp: false (HF computes it: --ref hf or hf_cached)")
        # conversion/falcon_h1.py modify_tensors scales the WEIGHT, where HF scales the biased
        # output: the same model only where the multiplier on that output is 1
        for key, mults in (("mlp_bias", (("mlp_multipliers", config.mlp_multipliers[0]),
                                         ("mlp_multipliers", config.mlp_multipliers[1]))),):
            bad = [m for m, v in mults if v != 1.0]
            if getattr(config, key, False) and bad:
                return (f"{key}=true with {bad[0]} != 1: the converter folds the multiplier into the weight "
                        f"only (conversion/falcon_h1.py modify_tensors), HF scales the biased output; valid for "
                        f"--ref llamacpp: {key}=false or those multipliers 1 (HF computes it: --ref hf)")
        if config.tie_word_embeddings:
            return ("tie_word_embeddings=true: the converter folds embedding_multiplier into token_embd, which "
                    "llama.cpp's tied head reuses, where HF's head is lm_head_multiplier times the unscaled "
                    "table; valid for --ref llamacpp: false")
        return refuse_short_conv(self._ssm_sizes(config), "mamba_d_conv")

    def _gate(self, config) -> dict:
        """FalconH1Mixer's output stage: ``FalconH1RMSNormGated(norm_before_gate=...)`` over
        ``n_groups`` groups when ``mamba_rms_norm``, else ``scan_output * silu(gate)``."""
        s = self._ssm_sizes(config)
        if not config.mamba_rms_norm:
            return dict(out_norm_groups=0, gate_order="gate_only")
        return dict(out_norm_groups=s.groups,
                    gate_order="norm_then_gate" if config.mamba_norm_before_gate else "gate_then_norm")

    def layer_config(self, config, i: int):
        s = self._ssm_sizes(config)
        ssm = mamba2_config(s, config.hidden_size, NormSpec("none", float(config.rms_norm_eps))).replace(
            out_bias=bool(config.projectors_bias), proj_multipliers=tuple(float(m) for m in config.ssm_multipliers),
            **self._gate(config))
        return super().layer_config(config, i).replace(
            parallel_ssm=ssm, attn_in_multiplier=float(config.attention_in_multiplier),
            key_multiplier=float(config.key_multiplier), attn_out_multiplier=float(config.attention_out_multiplier),
            ssm_in_multiplier=float(config.ssm_in_multiplier), ssm_out_multiplier=float(config.ssm_out_multiplier))

    def layer_weights(self, model, config, i: int) -> dict:
        w = super().layer_weights(model, config, i)
        s = self._ssm_sizes(config)
        m = mamba2_weights(self.decoder_layers(model)[i], "mamba", None, s)
        if not config.mamba_rms_norm:
            m.pop("out_norm", None)  # nn.Identity: no weight
        if config.projectors_bias and not s.proj_bias:
            m["bo"] = tensor(self.decoder_layers(model)[i], "mamba.out_proj.bias")
        w.update({f"ssm.{k}": v for k, v in m.items() if v is not None})
        return w

    # ------------------------------------------------------------------ probes
    def hf_products(self, lc):
        """HF's ``k`` / ``attn_out`` / ``ssm_out`` times the multiplier HF's next line applies
        (modeling_falcon_h1.py:209 ``* self.key_multiplier``, :935 ``* self.attn_out_multiplier``,
        :924 ``* self.ssm_out_multiplier``): no module returns the product."""
        return {"k": lc.key_multiplier, "attn_out": lc.attn_out_multiplier, "ssm_out": lc.ssm_out_multiplier}

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """conversion/mamba.py ``Mamba2Model.set_gguf_parameters`` then
        conversion/falcon_h1.py ``FalconH1Model.set_gguf_parameters``, each key once at the
        value it ends with (the Falcon method overwrites Mamba2's context length, feed-forward
        length and head count). No rope.dimension_count: neither writes one (llama.cpp rotates
        the whole key_length head, as HF does). Mamba2's find_hparam reads the ``mamba_``
        names (FalconH1Model.hparam_prefixes)."""
        s = self._ssm_sizes(config)
        d_inner = config.mamba_d_ssm
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count(config.num_attention_heads)
        w.add_block_count(config.num_hidden_layers)
        w.add_ssm_conv_kernel(s.conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(s.state)
        w.add_ssm_time_step_rank(d_inner // s.head_dim)
        w.add_ssm_group_count(s.groups)
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_vocab_size(config.vocab_size)
        w.add_head_count_kv(config.num_key_value_heads)
        w.add_key_length(self.head_dim(config))
        w.add_value_length(self.head_dim(config))
        w.add_rope_freq_base((config.rope_parameters or {})["rope_theta"])

    def _fold(self, name: str, config):
        """conversion/falcon_h1.py ``modify_tensors``: the multiplier folded into HF tensor
        ``name`` -- a scalar, a per-row vector (in_proj: ssm_in times the mup segment of each
        row), or None. The converter's own ``elif`` order on the HF name."""
        if "down_proj" in name:
            return config.mlp_multipliers[1]
        if "gate_proj" in name:
            return config.mlp_multipliers[0]
        if "k_proj" in name:
            return config.key_multiplier * config.attention_in_multiplier
        if "q_proj" in name or "v_proj" in name:
            return config.attention_in_multiplier
        if "o_proj" in name:
            return config.attention_out_multiplier
        if "out_proj" in name:
            return config.ssm_out_multiplier
        if "in_proj" in name:
            m = config.ssm_multipliers
            di, gn = config.mamba_d_ssm, config.mamba_n_groups * config.mamba_d_state
            rows = np.concatenate([np.full(di, m[0]), np.full(di, m[1]), np.full(gn, m[2]), np.full(gn, m[3]),
                                   np.full(config.mamba_n_heads, m[4])])
            return config.ssm_in_multiplier * rows[:, None]
        if "lm_head" in name:
            return config.lm_head_multiplier
        if "embed_tokens" in name:
            return config.embedding_multiplier
        return None

    # what a falcon-h1 file reads back as (config_from_gguf): every multiplier 1, the weights
    # folded -- the overrides that make the HF config of that model (tests/test_gguf_files.py)
    _gguf_unit_multipliers = tuple((k, 1.0) for k in MULTIPLIERS) + (("ssm_multipliers", [1.0] * 5),
                                                                     ("mlp_multipliers", [1.0, 1.0]))

    def _gguf_fold(self, name, data, config):
        """HF tensor ``name`` with its multiplier folded in, as the converter writes it
        (``_fold``; float32, the converter's torch product: one rounding)."""
        f = self._fold(name, config)
        if f is None:
            return data

        t = torch.from_numpy(np.ascontiguousarray(data))
        return (t * torch.as_tensor(np.asarray(f, dtype=np.float32))).numpy() if np.ndim(f) else (t * f).numpy()

    def gguf_value_map(self, name, data, config):
        return self._gguf_fold(name, super().gguf_value_map(name, data, config), config)

    def gguf_value_unmap(self, name, data, config):
        f = self._fold(name, config)
        if f is not None:
            data = (data.astype(np.float64) / np.asarray(f, dtype=np.float64)).astype(np.float32)
        return super().gguf_value_unmap(name, data, config)

    def config_from_gguf(self, meta, shapes, tensors):
        """falcon-h1.cpp load_arch_hparams (the RMS eps, ``ssm.conv_kernel`` / ``inner_size`` /
        ``state_size`` / ``time_step_rank`` (the heads) / ``group_count``) and the attention's
        sizes, as HF FalconH1 holds them. The file carries no multiplier: the converter folded
        each into a weight and falcon-h1.cpp applies none, so the file reads back as the model
        with every multiplier 1 and the folded weights -- the model llama.cpp runs. The gated
        norm is the file's ``ssm_norm`` (present: ``mamba_rms_norm``, gate then norm as
        build_mamba2_layer orders it); the conv bias is ``ssm_conv1d.bias``."""

        hp = read_hparams(meta)
        refuse_experts(meta, hp, self.name)
        for key, vals in (("attention.head_count", hp.n_head), ("attention.head_count_kv", hp.n_head_kv),
                          ("feed_forward_length", hp.n_ff)):
            if len(set(vals)) != 1:
                meta.refuse(key, vals, "one value for every layer (falcon-h1.cpp reads layer 0's)")
        inner, heads = int(meta.get("ssm.inner_size")), int(meta.get("ssm.time_step_rank"))
        if heads < 1 or inner % heads:
            meta.refuse("ssm.inner_size", inner, f"not a multiple of ssm.time_step_rank {heads} (the heads)")
        vocab = vocab_of(meta, shapes)
        n_head = hp.n_head[0]
        ff = hp.n_ff[0]
        return {"vocab_size": vocab, "hidden_size": hp.n_embd, "num_hidden_layers": hp.n_layer,
                "num_attention_heads": n_head, "num_key_value_heads": hp.n_head_kv[0],
                "head_dim": hp.n_embd_head_k, "intermediate_size": ff, "max_position_embeddings": hp.n_ctx_train,
                "rms_norm_eps": meta.get_f32("attention.layer_norm_rms_epsilon"),
                "mamba_d_ssm": inner, "mamba_n_heads": heads, "mamba_d_head": inner // heads,
                "mamba_expand": max(1, inner // hp.n_embd),
                "mamba_n_groups": int(meta.get("ssm.group_count")), "mamba_d_state": int(meta.get("ssm.state_size")),
                "mamba_d_conv": int(meta.get("ssm.conv_kernel")), "mamba_proj_bias": False,
                "attention_bias": "blk.0.attn_q.bias" in shapes, "mlp_bias": "blk.0.ffn_up.bias" in shapes,
                "mamba_conv_bias": "blk.0.ssm_conv1d.bias" in shapes,
                "mamba_rms_norm": "blk.0.ssm_norm.weight" in shapes, "mamba_norm_before_gate": False,
                # no key holds HF's SSD chunk (ggml's ssm_scan is sequential): the family's own
                "mamba_chunk_size": self.tiny["mamba_chunk_size"],
                **{k: 1.0 for k in MULTIPLIERS}, "ssm_multipliers": [1.0] * 5, "mlp_multipliers": [1.0, 1.0],
                "rope_parameters": hf_rope(meta, hp),
                "tie_word_embeddings": "output.weight" not in shapes, **special_tokens(meta, vocab)}

    def gguf_convert(self, name, data, config, variant=None):
        """Mamba2Model.modify_tensors' layout steps (harness/families/_mamba2.py mamba2_convert:
        conv squeezed, A / D unsqueezed, the gated norm ``(n_groups, d_ssm / n_groups)``)."""
        out = mamba2_convert(name, data, self._ssm_sizes(config)) if ".mamba." in name else None
        yield from out if out is not None else [(name, data)]


FAMILY = FalconH1()
