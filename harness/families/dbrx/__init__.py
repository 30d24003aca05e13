"""dbrx: a fused ``Wqkv`` clamped to ``+-clip_qkv``, GQA, neox RoPE, LayerNorm
without bias, and softmax-routed experts with their own weight layout (HF
``DbrxForCausalLM``, transformers/models/dbrx/modeling_dbrx.py; llama.cpp arch
``dbrx``, src/models/dbrx.cpp; converter conversion/dbrx.py ``DbrxModel``).

HF ``DbrxAttention.forward``: ``qkv = Wqkv(x)`` (no bias), ``qkv.clamp(-clip_qkv,
clip_qkv)``, split ``[Q | K | V]`` (``hidden``, ``kv_n_heads * head_dim`` twice),
``apply_rotary_pos_emb`` (rotate_half: neox), the eager attention, ``out_proj``.
``DbrxNormAttentionNorm``: ``norm_1`` / ``norm_2`` are ``nn.LayerNorm(d_model,
bias=False)`` -- torch's default eps 1e-5, no config key. ``DbrxFFN``: softmax over
the experts, top-k, divided by the top-k's ``moe_normalize_expert_weights``-norm
(default 1: their sum).

llama.cpp (dbrx.cpp): ``LLM_NORM`` with no bias, ``build_qkv`` -- the fused
``wqkv`` clamped by ``f_clamp_kqv`` (cb ``wqkv_clamped``) and viewed as Q / K / V
(named ``Qcur`` / ``Kcur`` / ``Vcur`` before the RoPE) --, NEOX RoPE
(llama-model.cpp ``llama_model_rope_type``: LLM_ARCH_DBRX), ``build_moe_ffn(...,
LLM_FFN_SILU, true, ...)``: top-k renormalised by their sum, HF's default.
``load_arch_hparams`` requires ``layer_norm_epsilon`` and ``clamp_kqv``.

The converter (``DbrxModel.set_gguf_parameters``) writes ``layer_norm_eps = 1e-5``
whatever the config says (HF's torch default too: the two agree, nothing to
bound), ``clamp_kqv = attn_config["clip_qkv"]`` (so a config without a clamp
makes no file llama.cpp loads: refused for llamacpp) and ``rope_freq_base =
attn_config["rope_theta"]``. HF's ``DbrxRotaryEmbedding`` reads
``config.rope_parameters["rope_theta"]`` instead and ignores
``attn_config.rope_theta`` (transformers 5 keeps it as an unread key; the released
DBRX config.json has ``attn_config.rope_theta = 500000`` and no
``rope_parameters``): a finding where the two differ (findings.toml). The
experts: ``ffn.experts.mlp.{w1, v1, w2}`` are ``[E * F, H]`` each; the converter
views them ``(E, F, H)`` and transposes w2 to ``(E, H, F)`` (``modify_tensors``:
w1 -> ffn_gate_exps, v1 -> ffn_up_exps, w2 -> ffn_down_exps).

No HF module outputs the clamped Q / K / V (``clamp`` is not in place, ``Wqkv``'s
hook sees the unclamped product): ``hf_taps`` wraps the modeling module's
``apply_rotary_pos_emb`` for Q and K (the very tensors HF rotates) and the eager
attention's value for V.

Tiny config: 4 heads, 2 KV heads, head_dim 16, ``clip_qkv = 1.5`` (about 13% of
the Q / K / V entries are clamped), 4 experts of 32 (2 used), theta 10000 on both
sides.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

from contract.layers import LayerConfig

from .._gguf_import import experts, full_rotary, one_head_dim, read_hparams, special_tokens, vocab_of
from ..base import LlamaLike, Point, tensor
from harness.references.hf.capture import _to_np

CONVERTER_EPS = 1e-5  # conversion/dbrx.py DbrxModel.set_gguf_parameters: add_layer_norm_eps(1e-5)
HF_EPS = 1e-5  # modeling_dbrx.py DbrxNormAttentionNorm: nn.LayerNorm(d_model, bias=False), torch's default eps

_EXPERTS = {"ffn.experts.mlp.w1": None, "ffn.experts.mlp.v1": None, "ffn.experts.mlp.w2": (0, 2, 1)}


class Dbrx(LlamaLike):
    name = "dbrx"
    fuzz_space = {"knobs": ()}
    hf_model_type = "dbrx"
    description = "fused Wqkv with clip_qkv, GQA, bias-free LayerNorm, softmax-routed experts (own weight layout)"
    tiny = dict(
        vocab_size=128, d_model=64, n_heads=4, n_layers=2, max_seq_len=256,
        attn_config={"kv_n_heads": 2, "clip_qkv": 1.5, "rope_theta": 10000.0},
        ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,  # DbrxConfig.validate_architecture refuses a tied head
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "dbrx"
    layers_path = "transformer.blocks"
    size_keys = {"hidden": "d_model", "heads": "n_heads", "layers": "n_layers"}
    extra_settable = ()
    switch_modules = {**LlamaLike.switch_modules, "input_norm": ("norm_attn_norm.norm_1",)}
    hf_model_points = {"embeddings": ("transformer.wte", "out"), "final_norm": ("transformer.norm_f", "out")}
    hf_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("norm_attn_norm.norm_1", "out"),
        "attn_branch": Point("norm_attn_norm.attn.out_proj", "in"),
        "attn_out": Point("norm_attn_norm.attn.out_proj", "out"),
        "resid_mid": Point("norm_attn_norm.norm_2", "in"),
        "layer_out": Point("", "out"),
    }
    # llama.cpp: LlamaLike's points (build_qkv names the clamped views Qcur / Kcur / Vcur
    # before the RoPE); dbrx.cpp gives build_attn's wo product no name
    lc_points = {k: v for k, v in LlamaLike.lc_points.items() if k != "attn_out"}
    input_norm_kind = "layer"

    def head_dim(self, config) -> int:
        return config.d_model // config.n_heads  # DbrxAttention: hidden_size // num_heads

    def norm_eps(self, config) -> float:
        return HF_EPS

    def layer_config(self, config, i: int) -> LayerConfig:
        clip = config.attn_config.clip_qkv
        return super().layer_config(config, i).replace(
            n_kv_heads=config.attn_config.kv_n_heads,
            # DbrxAttention.forward: qkv_states.clamp(min=-clip_qkv, max=clip_qkv) (None: no clamp)
            qkv_clamp=None if clip is None else float(clip))

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        layer = self.decoder_layers(model)[i]
        h, hkv, d = config.d_model, config.attn_config.kv_n_heads, self.head_dim(config)
        wqkv = tensor(layer, "norm_attn_norm.attn.Wqkv.weight")  # split([hidden, kv * d, kv * d])
        return {"attn_norm": tensor(layer, "norm_attn_norm.norm_1.weight"),
                "wq": wqkv[:h], "wk": wqkv[h:h + hkv * d], "wv": wqkv[h + hkv * d:],
                "wo": tensor(layer, "norm_attn_norm.attn.out_proj.weight")}

    # No feature switch for the clamp: HF cannot run without one (reference_refusal), so
    # bisection has no clamp-free reference to compare with.

    def lc_refusal(self, config) -> str | None:
        if config.attn_config.clip_qkv is None:
            return ("attn_config.clip_qkv is None: the converter writes clamp_kqv from it unconditionally "
                    "(conversion/dbrx.py set_gguf_parameters) and dbrx.cpp requires the key; set a clamp")
        return super().lc_refusal(config)

    def hf_refusal(self, config) -> str | None:
        if config.attn_config.clip_qkv is None:
            # modeling_dbrx.py:206 DbrxAttention.forward: qkv_states.clamp(min=None, max=None)
            return ("attn_config.clip_qkv is None: HF DbrxAttention.forward calls qkv_states.clamp(min=None, "
                    "max=None), which torch refuses; set a clamp")
        return super().hf_refusal(config)

    # ------------------------------------------------------------------ HF probes
    def hf_taps(self, model, config, sink: dict):
        """Q and K as ``apply_rotary_pos_emb`` receives them (clamped, split, before
        the rotation), V as the eager attention receives it (clamped; the cache's rows
        in front on HF's cached path, which the capture's merge takes the last of)."""

        layers = self.decoder_layers(model)
        mod = sys.modules[type(layers[0].norm_attn_norm.attn).__module__]
        state = {"layer": None}

        @contextlib.contextmanager
        def taps():
            rope_fn, eager_fn = mod.apply_rotary_pos_emb, mod.eager_attention_forward

            def rope(q, k, *args, **kwargs):
                if state["layer"] is not None:
                    rec = sink.setdefault(state["layer"], {})
                    rec["q"], rec["k"] = _to_np(q), _to_np(k)
                return rope_fn(q, k, *args, **kwargs)

            def eager(module, query, key, value, *args, **kwargs):
                if state["layer"] is not None:
                    sink.setdefault(state["layer"], {})["v"] = _to_np(value)
                return eager_fn(module, query, key, value, *args, **kwargs)

            handles = []
            for i, layer in enumerate(layers):
                def enter(m, args, kwargs, i=i):
                    state["layer"] = i

                def leave(m, args, kwargs, out):
                    state["layer"] = None

                attn = layer.norm_attn_norm.attn
                handles.append(attn.register_forward_pre_hook(enter, with_kwargs=True))
                handles.append(attn.register_forward_hook(leave, with_kwargs=True))
            mod.apply_rotary_pos_emb, mod.eager_attention_forward = rope, eager
            try:
                yield
            finally:
                # the capture's own eager wrapper may have wrapped ours: put back what we replaced only
                if mod.apply_rotary_pos_emb is rope:
                    mod.apply_rotary_pos_emb = rope_fn
                if mod.eager_attention_forward is eager:
                    mod.eager_attention_forward = eager_fn
                for hd in handles:
                    hd.remove()

        return taps()

    def hf_canonical(self, probe, arr, lc):
        if probe in ("q", "k", "v") and arr.ndim == 4:
            return arr.transpose(0, 2, 1, 3)  # [B, heads, T, D] -> [B, T, heads, D]
        return super().hf_canonical(probe, arr, lc)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/dbrx.py DbrxModel.set_gguf_parameters (no TextModel super call)
        a, f = config.attn_config, config.ffn_config
        w.add_block_count(config.n_layers)
        w.add_context_length(config.max_seq_len)
        w.add_embedding_length(config.d_model)
        w.add_feed_forward_length(f.ffn_hidden_size)
        w.add_head_count(config.n_heads)
        w.add_head_count_kv(a.kv_n_heads)
        # attn_config["rope_theta"]: a KeyError in the converter where config.json has none
        w.add_rope_freq_base(a.rope_theta)
        w.add_clamp_kqv(a.clip_qkv)
        w.add_expert_count(f.moe_num_experts)
        w.add_expert_used_count(f.moe_top_k)
        w.add_layer_norm_eps(CONVERTER_EPS)

    def gguf_convert(self, name, data, config, variant=None):
        # DbrxModel.modify_tensors: the expert tensors (no .weight suffix) viewed as
        # (n_expert, n_ff, n_embd), w2 permuted to (n_expert, n_embd, n_ff), and named
        # with ".weight" appended
        f = config.ffn_config
        for key, perm in _EXPERTS.items():
            if name.endswith(key):
                data = data.reshape(f.moe_num_experts, f.ffn_hidden_size, config.d_model)
                if perm is not None:
                    data = np.ascontiguousarray(data.transpose(perm))
                yield name + ".weight", data
                return
        yield from super().gguf_convert(name, data, config, variant)

    def config_from_gguf(self, meta, shapes, tensors):
        """dbrx.cpp load_arch_hparams: layer_norm_epsilon (HF's LayerNorm fixes 1e-5:
        another is refused) and clamp_kqv (required; > 0 clamps); load_hparams' sizes,
        experts and RoPE base (HF's rope_parameters, and attn_config.rope_theta as
        the converter reads it)."""
        hp = read_hparams(meta)
        eps = meta.get_f32("attention.layer_norm_epsilon")
        if np.float32(eps) != np.float32(HF_EPS):
            meta.refuse("attention.layer_norm_epsilon", eps, "HF DbrxNormAttentionNorm's LayerNorm has eps 1e-5")
        clamp = meta.get_f32("attention.clamp_kqv")
        one_head_dim(meta, hp, self)
        full_rotary(meta, hp, self)  # dbrx.cpp: GGML_ASSERT(n_embd_head == n_rot)
        if hp.rope_freq_scale != 1.0:
            meta.refuse("rope.scaling.factor", 1.0 / hp.rope_freq_scale, "the converter writes no RoPE scaling")
        n_exp, n_used = experts(meta, hp, self.name)
        vocab = vocab_of(meta, shapes)
        theta = hp.rope_freq_base
        return {"vocab_size": vocab, "d_model": hp.n_embd, "n_heads": hp.head, "n_layers": hp.n_layer,
                "max_seq_len": hp.n_ctx_train, "tie_word_embeddings": False,
                "attn_config": {"kv_n_heads": hp.head_kv, "clip_qkv": clamp if clamp > 0 else None,
                                "rope_theta": theta},
                "ffn_config": {"ffn_hidden_size": hp.ff, "moe_num_experts": n_exp, "moe_top_k": n_used,
                               "moe_normalize_expert_weights": 1.0},
                "rope_parameters": {"rope_type": "default", "rope_theta": theta},
                **special_tokens(meta, vocab)}


FAMILY = Dbrx()
