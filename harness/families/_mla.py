"""What the multi-head latent attention families share (deepseek_v2,
deepseek_v3, kimi_linear, glm_moe_dsa): the mapping of an HF MLA layer into
``impl.mla.MlaConfig`` in either FORM (the family variants ``absorbed`` /
``naive``), the HF and llama.cpp probe maps, the canonical channel order of the
rope slices, and the GGUF export steps of llama.cpp's deepseek converter
(``conversion/deepseek.py`` ``DeepseekV2Model``) the other converters inherit
or repeat.

Canonical probes (``impl.mla``): the rope slices are in the INTERLEAVED order
the rotation works in (pairs ``(2i, 2i+1)``), which is llama.cpp's order
(``LLAMA_ROPE_TYPE_NORM`` rotates adjacent pairs in place, ggml-cpu ops.cpp
``rotate_pairs``) and HF deepseek_v2's (``apply_rotary_emb``: complex multiply
on ``reshape(..., -1, 2)``, ``view_as_real(...).flatten(3)``). HF deepseek_v3
and glm_moe_dsa rotate the same pairs but RETURN them de-interleaved
(``apply_rotary_pos_emb_interleave``: ``cat([x1 * cos - x2 * sin, x2 * cos +
x1 * sin])`` over ``x1 = x[..., 0::2]``, ``x2 = x[..., 1::2]``); their family
sets ``hf_rope_deinterleaves`` and the capture re-interleaves the rope slice of
``q_rope`` / ``k_rope`` (and so of ``q_pe`` / ``k_pe``, which are views of them).

Where each probe is read:

=========== ============================================ ==========================================
probe       HF (decoder layer i)                         llama.cpp (deepseek2 / glm-dsa graph)
=========== ============================================ ==========================================
attn_in     ``self_attn`` input                          ``attn_norm``
q_latent    ``self_attn.q_a_layernorm`` output           ``q`` (the MUL after the q_a rms_norm;
                                                         glm-dsa: ``qr``, last)
q           ``self_attn.q_b_proj`` / ``q_proj`` output   ``q`` (last: the reshape [T, H, nope+rope])
kv_latent   ``self_attn.kv_a_layernorm`` output          ``kv_cmpr`` (last: after its norm)
q_pe        rope slice of the eager ``query``            ``q_pe`` (ROPE; absorbed graph only)
k_pe        rope slice of the eager ``key`` (head 0)     ``k_pe`` (ROPE)
q_rope      the eager ``query`` [T, H, nope+rope]        ``Qcur`` (ROPE; naive graph only)
k_rope      the eager ``key`` (naive impl only)          ``Kcur`` (naive graph only)
q_absorbed  -- (HF never absorbs)                        ``Qcur`` (CONCAT; absorbed graph only)
attn_probs  eager ``attn_weights``                       ``kq_soft_max``
attn_heads  eager output [T, H, v]                       ``kqv_out`` (no gate in these graphs)
attn_branch ``self_attn.o_proj`` input                   ``kqv_out``
attn_out    ``self_attn`` output                         -- (``wo``'s product is unnamed)
resid_mid   ``post_attention_layernorm`` input           ``ffn_inp``
=========== ============================================ ==========================================
"""

from __future__ import annotations

import math

import numpy as np

from contract.layers import NormSpec
from impl import make_rope
from contract.layers import ConfigError, MlaConfig, MlaYarn
from impl.mla import mla_yarn as yarn_from_params

from ..errors import UsageError
from .base import (Family, LcPoint, Point, gguf_moe_convert, gguf_size_params, gguf_yarn_params,
                   rope_identity_overrides, tensor)
from harness.lazy import lazy
from ._gguf_import import get_mscale, hf_rope, experts, one_per_layer, special_tokens, vocab_of, read_hparams

gguf = lazy("gguf")


def split_kv_b(kv_b: np.ndarray, n_heads: int, nope: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """conversion/deepseek.py ``DeepseekV2Model.modify_tensors`` (kv_b_proj):
    ``kv_b.view(n_head, nope + v, r)``, split into ``k_b`` / ``v_b`` along the
    per-head rows, ``k_b.transpose(1, 2)`` -> ``k_b [H, r, nope]`` (the absorb
    direction, ggml ``attn_k_b`` {nope, r, H}) and ``v_b [H, v, r]`` (ggml
    ``attn_v_b`` {r, v, H})."""
    kv3 = kv_b.reshape(n_heads, nope + v, kv_b.shape[-1])
    return np.ascontiguousarray(kv3[:, :nope].transpose(0, 2, 1)), np.ascontiguousarray(kv3[:, nope:])


def reinterleave(a: np.ndarray, start: int) -> np.ndarray:
    """Undo HF ``apply_rotary_pos_emb_interleave``'s output order on the channels
    ``[start:]`` of the last axis: ``[evens | odds]`` -> ``(e0, o0, e1, o1, ...)``."""
    rope = a[..., start:]
    half = rope.shape[-1] // 2
    out = np.empty_like(rope)
    out[..., 0::2] = rope[..., :half]
    out[..., 1::2] = rope[..., half:]
    return np.concatenate([a[..., :start], out], axis=-1)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """HF ``yarn_get_mscale`` (modeling_deepseek_v2.py)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class MlaFamily(Family):
    """An HF MLA decoder (``DeepseekV2Attention`` and its copies)."""
    variants = ("absorbed", "naive")
    # HF returns the rope slice de-interleaved (apply_rotary_pos_emb_interleave)
    hf_rope_deinterleaves = False
    # HF builds q_a_layernorm / kv_a_layernorm with the RMSNorm's default eps
    # (e.g. modeling_deepseek_v2.py: `DeepseekV2RMSNorm(config.kv_lora_rank)`),
    # whatever rms_norm_eps says; llama.cpp uses rms_norm_eps for both
    # (deepseek2.cpp build_norm -> f_norm_rms_eps). impl mirrors HF.
    latent_norm_eps = 1e-6
    # why llama.cpp cannot run the naive (combined kv_b) form of this arch, if it cannot
    lc_naive_unsupported: str | None = None
    # deepseek2, direct Q: write `attention.q_lora_rank = 0`, which the converter omits
    # (a test switches it off to show llama.cpp then refuses the file)
    direct_q_rank_key = True

    hf_mla_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("self_attn", "in"),
        "q_latent": Point("self_attn.q_a_layernorm", "out"),
        "kv_latent": Point("self_attn.kv_a_layernorm", "out"),
        "attn_branch": Point("self_attn.o_proj", "in"),
        "attn_out": Point("self_attn", "out"),
        "resid_mid": Point("post_attention_layernorm", "in"),
        "layer_out": Point("", "out"),
    }

    experts_implementation = "eager"

    # ------------------------------------------------------------------ config
    def validate(self, kw: dict) -> None:
        super().validate(kw)
        nh, nkv = kw.get("num_attention_heads"), kw.get("num_key_value_heads")
        if nh and nkv and nh != nkv:
            # HF eager: repeat_kv(key, num_attention_heads // num_key_value_heads) on keys
            # that already have num_attention_heads heads (kv_b_proj expands to every
            # head) -- any other value is a shape error inside the forward
            raise UsageError(f"family {self.name}: MLA expands K/V to every head; num_key_value_heads must equal "
                             f"num_attention_heads ({nh}), got {nkv}")

    def is_mla(self, config, i: int) -> bool:
        return True

    def mla_rope_layout(self, config) -> str:
        return "interleaved"

    def mla_rope(self, config):
        """impl RoPE of the decoupled slices from ``config.rope_parameters``, at
        their plain bands: HF's rotary embedding runs at ``dim = head_dim``, which
        the configs force to ``qk_rope_head_dim`` (configuration_deepseek_v2.py
        ``__post_init__``). YaRN is not here but in ``mla_yarn``."""
        rp = dict(config.rope_parameters or {})
        kind = rp.get("rope_type", "default")
        if kind not in ("default", "yarn", "linear"):
            raise ConfigError(f"MLA RoPE scaling {kind!r} is not in the spec's MLA (plain RoPE at theta, or YaRN); "
                              "valid rope_type: default, yarn (linear: the bisection's identity rotation)")
        if kind == "linear" and rp.get("mscale_all_dim"):
            # HF yarn_apply_mscale squares yarn_get_mscale into the softmax scale for ANY
            # non-default type; the spec's kq_scale takes mscale from YaRN alone
            raise ConfigError("mscale_all_dim scales MLA's softmax with YaRN only (spec kq_scale(yarn, ..)); "
                              "valid with rope_type yarn")
        params = {} if kind == "yarn" else rp
        return make_rope("default" if kind == "yarn" else kind, rp["rope_theta"], config.qk_rope_head_dim,
                         self.mla_rope_layout(config), params)

    def mla_yarn(self, config, rope) -> MlaYarn | None:
        """The ONE YaRN setting of the layer (spec ``yarn`` argument): YaRN's per-band
        divisors and its magnitude on the rotated channels (HF
        ``_compute_yarn_parameters``: ``inv_freq`` and ``attention_factor``, the
        magnitude on cos and sin), and the softmax half ``softmax_mscale``."""
        if rope is None:
            return None
        rp = dict(config.rope_parameters or {})
        if rp.get("rope_type", "default") != "yarn":
            return None
        rp.setdefault("max_position_embeddings", config.max_position_embeddings)
        return yarn_from_params(rope, rp, self.softmax_mscale(config))

    def softmax_mscale(self, config) -> float:
        """HF ``yarn_apply_mscale``: ``scaling *= yarn_get_mscale(factor,
        mscale_all_dim) ** 2`` when the RoPE type is not default and
        ``mscale_all_dim`` is set and non-zero (``mscale`` alone never enters the
        softmax scale)."""
        rp = dict(config.rope_parameters or {})
        if rp.get("rope_type", "default") != "default" and rp.get("mscale_all_dim"):
            return yarn_get_mscale(float(rp["factor"]), float(rp["mscale_all_dim"]))
        return 1.0

    def layer_configs(self, config, variant: str | None = None):
        variant = variant or self.variants[0]
        return [self.layer_config(config, i, variant) for i in range(config.num_hidden_layers)]

    def layer_config(self, config, i: int, variant: str = "absorbed"):
        rope = self.mla_rope(config)
        return MlaConfig(
            hidden_size=config.hidden_size,
            n_heads=config.num_attention_heads,
            kv_lora_rank=config.kv_lora_rank,
            qk_nope_head_dim=config.qk_nope_head_dim,
            qk_rope_head_dim=config.qk_rope_head_dim,
            v_head_dim=config.v_head_dim,
            q_lora_rank=config.q_lora_rank,
            input_norm=NormSpec("rms", config.rms_norm_eps),
            q_a_norm=NormSpec("rms", self.latent_norm_eps),
            kv_a_norm=NormSpec("rms", self.latent_norm_eps),
            rope=rope,
            yarn=self.mla_yarn(config, rope),
            form=variant,
        )

    # HF name (relative to the decoder layer) -> impl weight name
    mla_weight_map = {
        "input_layernorm.weight": "attn_norm",
        "self_attn.q_proj.weight": "wq",
        "self_attn.q_a_proj.weight": "wq_a",
        "self_attn.q_a_proj.bias": "bq_a",
        "self_attn.q_a_layernorm.weight": "q_a_norm",
        "self_attn.q_b_proj.weight": "wq_b",
        "self_attn.kv_a_proj_with_mqa.weight": "wkv_a",
        "self_attn.kv_a_proj_with_mqa.bias": "bkv_a",
        "self_attn.kv_a_layernorm.weight": "kv_a_norm",
        "self_attn.kv_b_proj.weight": "wkv_b",
        "self_attn.o_proj.weight": "wo",
        "self_attn.o_proj.bias": "bo",
    }

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        """Both decompressions: HF's combined ``kv_b`` (the naive form) and the
        split ``k_b`` / ``v_b`` the converter writes (the absorbed form,
        ``split_kv_b``); each form's layer holds only its own."""
        if not self.is_mla(config, i):
            return {}
        layer = self.decoder_layers(model)[i]
        out = {}
        for hf_name, ours in self.mla_weight_map.items():
            t = tensor(layer, hf_name)
            if t is not None:
                out[ours] = t
        out["wk_b"], out["wv_b"] = split_kv_b(out["wkv_b"], config.num_attention_heads, config.qk_nope_head_dim,
                                              config.v_head_dim)
        return out

    def feature_switches(self, config, features):
        sw = super().feature_switches(config, features)
        rp = dict(config.rope_parameters or {}) if hasattr(config, "rope_parameters") else {}
        if "mla_yarn" in features and rp.get("rope_type", "default") != "default":
            # YaRN off in HF, and so in impl: plain RoPE at the same theta
            sw["mla_yarn"] = {"rope_parameters": {"rope_type": "default", "rope_theta": rp["rope_theta"]}}
        if "mla_rope" in features:
            # the decoupled RoPE turned into the identity (linear scaling, factor 1e30; no
            # mscale_all_dim, so yarn_apply_mscale leaves the softmax scale alone)
            ident = rope_identity_overrides(config)
            if ident is not None:
                sw["mla_rope"] = ident
        if "mla_low_rank_q" in features and "q_lora_rank" in self.settable_keys():
            sw["mla_low_rank_q"] = {"q_lora_rank": None}  # DeepseekV2Attention: q_proj directly
        return sw

    def case_switches(self, case, features):
        # the other FORM of the same weights: absorbed (split k_b / v_b) <-> naive (combined kv_b)
        sw = super().case_switches(case, features)
        for tag, other in (("mla_absorbed", "naive"), ("mla_naive", "absorbed")):
            if tag in features and other in self.variants:
                sw[tag] = {"variant": other}
        return sw

    # ------------------------------------------------------------------ HF probes
    def hf_points_for(self, config, i: int):
        pts = dict(self.hf_mla_points)
        # the query after its projection: q_b_proj (low-rank) or q_proj (direct)
        pts["q"] = Point("self_attn.q_proj" if config.q_lora_rank is None else "self_attn.q_b_proj", "out")
        return pts

    def hf_canonical(self, probe, arr, lc):
        if not isinstance(lc, MlaConfig):
            return arr
        if probe == "q":  # [S, T, H * (nope + rope)]
            return arr.reshape(*arr.shape[:2], lc.n_heads, lc.qk_head_dim)
        if probe in ("q_rope", "k_rope"):  # eager: [S, H, T, nope + rope]
            arr = arr.transpose(0, 2, 1, 3)
            if self.hf_rope_deinterleaves and lc.rope is not None and lc.rope.layout == "interleaved":
                arr = reinterleave(arr, lc.qk_nope_head_dim)
            return arr
        return arr

    def hf_derived(self, probes, config, layer_cfgs):
        """``q_pe`` / ``k_pe``: the rope slices of the query and key HF's eager
        attention reads (``query_states = cat(q_nope, q_rot)``, ``key_states =
        [k_nope | k_rot.expand(H)]``); the key's slice is the same on every head
        (``expand``), so head 0 is ``k_rot``."""
        out = {}
        for i, lc in enumerate(layer_cfgs):
            if not isinstance(lc, MlaConfig) or not lc.qk_rope_head_dim:
                continue
            n = lc.qk_nope_head_dim
            if f"L{i}.q_rope" in probes:
                out[f"L{i}.q_pe"] = probes[f"L{i}.q_rope"][..., n:]
            if f"L{i}.k_rope" in probes:
                out[f"L{i}.k_pe"] = probes[f"L{i}.k_rope"][:, :, 0, n:]
        return out

    # ------------------------------------------------------------------ llama.cpp probes
    def lc_canonical(self, probe, arr, lc, config):
        if not isinstance(lc, MlaConfig):
            return arr
        s, t = arr.shape[:2]
        if probe == "q":  # rows [S, T, H*(nope+rope)] or the reshape [S, T, H, nope+rope]
            return arr.reshape(s, t, lc.n_heads, lc.qk_head_dim)
        if probe == "k_pe" and arr.ndim == 4:  # [S, T, 1, rope]: one shared head
            return arr[:, :, 0, :]
        if probe == "k_rope" and lc.form == "absorbed":
            # the absorbed graph's Kcur is the latent cache row [c | k_pe], not a per-head key
            return None
        if probe == "attn_heads" and arr.ndim == 3:  # kqv_out [S, T, H*v]
            return arr.reshape(s, t, lc.n_heads, lc.v_head_dim)
        return arr

    # ------------------------------------------------------------------ GGUF import
    def gguf_variant_of(self, shapes):
        # deepseek2.cpp load_arch_tensors: attn_k_b / attn_v_b when is_mla() (the
        # absorbed form the converter writes today), attn_kv_b otherwise (legacy)
        return "naive" if any(n.endswith("attn_kv_b.weight") for n in shapes) else "absorbed"

    def mla_sizes(self, meta, hp) -> dict:
        """The MLA head sizes as llama.cpp derives them (llama_hparams::is_mla:
        both ``_mla`` lengths present): absorbed -- key_length ``r + rope``,
        value_length ``r``, one KV head, the head sizes in the ``_mla`` keys;
        legacy -- key_length ``nope + rope``, value_length ``v``, a KV head per
        head. HF expands K/V to every head either way."""
        r = int(meta.get("attention.kv_lora_rank"))
        k_mla, v_mla = meta.get("attention.key_length_mla", None), meta.get("attention.value_length_mla", None)
        rope = hp.n_rot
        if k_mla and v_mla:
            qk, v = int(k_mla), int(v_mla)
            if (hp.n_embd_head_k, hp.n_embd_head_v) != (r + rope, r):
                meta.refuse("attention.key_length", hp.n_embd_head_k, f"an MLA file's cache row is kv_lora_rank + "
                                                                      f"rope = {r + rope} (value {r})")
            if hp.head_kv != 1:
                meta.refuse("attention.head_count_kv", hp.head_kv, "an MLA file (the _mla keys) has one KV head")
        else:
            qk, v = hp.n_embd_head_k, hp.n_embd_head_v
            if hp.head_kv != hp.head:
                meta.refuse("attention.head_count_kv", hp.head_kv, f"the legacy MLA file has a KV head per head "
                                                                   f"({hp.head})")
        if not 0 < rope < qk:
            meta.refuse("rope.dimension_count", rope, f"the rope slice must lie inside the {qk}-wide head")
        return dict(num_attention_heads=hp.head, num_key_value_heads=hp.head, kv_lora_rank=r,
                    qk_nope_head_dim=qk - rope, qk_rope_head_dim=rope, v_head_dim=v)

    def mla_rope_parameters(self, meta, hp, log_mul: float = 0.0) -> dict:
        """HF YaRN parameters for what deepseek2.cpp / glm-dsa.cpp compute: the
        rotated channels' magnitude ``a`` (llama-context.cpp: ``get_mscale(f)``, or
        ``get_mscale(f, m) / get_mscale(f, log_mul)`` with ``m = log_mul`` for
        deepseek2 when it is not 1, times ``rope.scaling.attn_factor``) and the
        softmax scale ``(a * (1 + 0.1 log_mul ln f))^2 / sqrt(d)`` (the graphs'
        ``kq_scale``), which HF takes as ``get_mscale(f, mscale_all_dim)^2``."""

        if hp.rope_scaling_type != "yarn" or hp.rope_freq_scale == 1.0:
            return hf_rope(meta, hp)
        f = float(np.float32(1.0 / hp.rope_freq_scale))
        if log_mul:
            m = log_mul if self.gguf_arch == "deepseek2" and log_mul != 1.0 else 1.0
            a = get_mscale(f, m) / get_mscale(f, log_mul)
        else:
            a = get_mscale(f)
        a *= hp.rope_attn_factor
        kq_mscale = a * (1.0 + 0.1 * log_mul * math.log(f))
        return {"rope_type": "yarn", "rope_theta": hp.rope_freq_base, "factor": f,
                "original_max_position_embeddings": hp.n_ctx_orig_yarn, "beta_fast": 32.0, "beta_slow": 1.0,
                "attention_factor": a, "mscale_all_dim": (kq_mscale - 1.0) / (0.1 * math.log(f))}

    def mla_router(self, meta, hp) -> dict:
        """The HF router keys from the file's gating keys (a family per router)."""
        raise NotImplementedError

    @staticmethod
    def deepseek2_gating(meta, hp) -> int:
        """The gating function deepseek2.cpp ``load_arch_hparams`` routes a file by:
        its ``expert_gating_func``, or -- absent ("for compatibility with existing
        DeepSeek V2 and V2.5 GGUFs") -- sigmoid (2) for "GLM 4.7 Lite", which it
        recognises by 47 or 48 layers and a 154880-token vocabulary, softmax (1)
        otherwise."""
        gating = int(meta.get("expert_gating_func", 0))
        if gating == 0:
            vocab = meta.get("vocab_size", None)
            glm_lite = hp.n_layer in (47, 48) and vocab is not None and int(vocab) == 154880
            gating = 2 if glm_lite else 1
        return gating

    def mla_common(self, meta, shapes, hp) -> dict:
        """What deepseek2.cpp and glm-dsa.cpp read alike: the sizes, the RMS eps,
        the leading dense layers, the experts (width, shared count), the tied
        head, the vocabulary."""

        vocab = vocab_of(meta, shapes)
        n_exp, n_used = experts(meta, hp, self.name, groups=True)
        return dict(
            num_hidden_layers=hp.n_layer, max_position_embeddings=hp.n_ctx_train, hidden_size=hp.n_embd,
            intermediate_size=hp.ff, vocab_size=vocab, tie_word_embeddings="output.weight" not in shapes,
            rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
            first_k_dense_replace=int(meta.get("leading_dense_block_count", 0)),
            n_routed_experts=n_exp, num_experts_per_tok=n_used,
            moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
            n_shared_experts=int(meta.get("expert_shared_count")),
            **self.mla_sizes(meta, hp), **special_tokens(meta, vocab))

    def config_from_gguf(self, meta, shapes, tensors):
        """deepseek2.cpp load_arch_hparams: the common MLA keys, the Q rank
        (required unless the layer count makes it a "lite" model; 0 means a direct
        ``wq``), the experts' weights' scale / norm / gating function (the
        family's router), the YaRN log multiplier (written as ``0.1 *
        mscale_all_dim``: divided back), and the mistral-large temperature
        (refused)."""

        hp = read_hparams(meta)
        kw = self.mla_common(meta, shapes, hp)
        lite = hp.n_layer in (26, 27) or (hp.n_layer == 48 and kw["vocab_size"] == 128256)
        if lite:
            meta.skip("attention.q_lora_rank", "deepseek2.cpp reads it only when the model is not 'lite' (26 / 27 "
                                               "layers): a direct wq")
        q_rank = 0 if lite else int(meta.get("attention.q_lora_rank"))
        for key in ("attention.temperature_scale", "attention.temperature_length"):
            if meta.get(key, 0):
                meta.refuse(key, meta.get(key), "attention temperature tuning (mistral-large; deepseek2.cpp "
                                                "inp_attn_scale) is not read into an HF config here: HF's DeepSeek "
                                                "attention has none, and mistral4's converter writes none")
        log_mul = meta.get_f32("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
        return dict(kw, q_lora_rank=q_rank or None, rope_parameters=self.mla_rope_parameters(meta, hp, log_mul),
                    **self.mla_router(meta, hp))

    # ------------------------------------------------------------------ GGUF
    def check_lc_variant(self, variant: str | None) -> None:
        if variant == "naive" and self.lc_naive_unsupported:
            raise RuntimeError(f"llama.cpp cannot run the naive (combined kv_b) MLA form of {self.gguf_arch}: "
                               f"{self.lc_naive_unsupported}; the naive form is compared with HF only")

    def gguf_tensors(self, model, config, variant=None):
        self.check_lc_variant(variant)
        yield from super().gguf_tensors(model, config, variant)

    def gguf_convert(self, name: str, data: np.ndarray, config, variant: str | None = None):
        """``DeepseekV2Model.modify_tensors`` on transformers 5's in-memory layout
        (the MoE tensors: ``gguf_moe_convert``)."""
        variant = variant or self.variants[0]
        moe = gguf_moe_convert(name, data)
        if moe is not None:
            yield from moe
            return
        if name.endswith("kv_b_proj.weight"):
            if variant == "naive":
                # the legacy file: attn_kv_b unsplit (TextModel.modify_tensors, what the
                # converter wrote before the `_mla` keys existed)
                yield name, data
                return
            # DeepseekV2Model.modify_tensors: "MLA with the absorption optimization,
            # needs these two split and k_b_proj transposed"
            k_b, v_b = split_kv_b(data, config.num_attention_heads, config.qk_nope_head_dim, config.v_head_dim)
            yield name.replace("kv_b_proj", "k_b_proj"), k_b
            yield name.replace("kv_b_proj", "v_b_proj"), v_b
            return
        yield name, data

    @staticmethod
    def put(w, key: str, value, adder) -> None:
        """Write a key the converter writes twice (base TextModel first, then the
        arch's own value): drop the first, as GGUFWriter's "Duplicated key name
        ... overwriting" does, without the warning."""
        full = f"{w.arch}.{key}"
        for kv in w.kv_data:
            kv.pop(full, None)
        adder(value)

    def text_params(self, w, config) -> None:
        """conversion/base.py ``TextModel.set_gguf_parameters`` for these configs,
        after ``DeepseekV2Model.set_gguf_parameters`` has set
        ``hparams["num_key_value_heads"] = 1`` ("deepseek2 using MLA converts into
        MQA"); the naive variant's legacy file keeps the real head count."""
        gguf_size_params(w, config, head_count_kv=False)
        rp = dict(getattr(config, "rope_parameters", None) or {})
        if rp.get("rope_type") == "yarn" and rp.get("factor") is not None:
            gguf_yarn_params(w, rp)
        if rp.get("rope_theta") is not None:
            w.add_rope_freq_base(rp["rope_theta"])
        w.add_layer_norm_rms_eps(config.rms_norm_eps)

    def deepseek_params(self, w, config, variant: str) -> None:
        """conversion/deepseek.py ``DeepseekV2Model.set_gguf_parameters`` on top of
        ``TextModel``'s, key for key, for the two forms: ``absorbed`` = what the
        converter writes today (head_count_kv 1, key_length ``r + rope``,
        value_length ``r``, the ``_mla`` lengths); ``naive`` = the legacy file
        llama.cpp still loads on its ``!is_mla()`` path (deepseek2.cpp
        ``llama_model_deepseek2::load_arch_tensors``: ``attn_kv_b`` when the
        ``_mla`` keys are absent), with the head metadata of an MHA
        (head_count_kv = H, key_length ``nope + rope``, value_length ``v``)."""

        self.text_params(w, config)
        h = config.num_attention_heads
        r, nope, rope, v = config.kv_lora_rank, config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        w.add_head_count_kv(1 if variant == "absorbed" else h)
        if (n := getattr(config, "n_routed_experts", None)) is not None:
            w.add_expert_count(n)
        if (n := getattr(config, "num_experts_per_tok", None)) is not None:
            w.add_expert_used_count(n)
        if (n := getattr(config, "n_group", None)) is not None:
            w.add_expert_group_count(n)
        if (n := getattr(config, "topk_group", None)) is not None:
            w.add_expert_group_used_count(n)
        # base.py: the gating function only when config.json names one (deepseek_v3's
        # HF config class has no `scoring_func` field: it must be passed as an extra key,
        # or llama.cpp falls back to softmax, deepseek2.cpp load_arch_hparams)
        score = getattr(config, "scoring_func", None)
        if score is not None:
            w.add_expert_gating_func({"sigmoid": gguf.ExpertGatingFuncType.SIGMOID,
                                      "softmax": gguf.ExpertGatingFuncType.SOFTMAX}[score])
        # "first_k_dense_replace: number of leading layers using dense FFN instead of MoE";
        # absent: every layer dense without experts, none with them (glm4_moe_lite's HF
        # config keeps its dense layers in mlp_layer_types, which the converter never reads)
        fkd = getattr(config, "first_k_dense_replace", None)
        if fkd is None:
            fkd = config.num_hidden_layers if getattr(config, "n_routed_experts", None) is None else 0
        w.add_leading_dense_block_count(fkd)
        w.add_vocab_size(config.vocab_size)
        if config.q_lora_rank is not None:
            w.add_q_lora_rank(config.q_lora_rank)
        elif self.gguf_arch in ("deepseek2", "mistral4") and self.direct_q_rank_key:
            # (mistral4: llama_model_mistral4 reuses deepseek2's load_arch_hparams, models.h)
            # NOT what the converter does: it writes no q_lora_rank for a direct-Q
            # model, and deepseek2.cpp load_arch_hparams then requires the key (unless
            # n_layer is 26/27, its "lite" guess) and the file fails to load. 0 is the
            # value the loader's lite path assumes (wq instead of wq_a/wq_b).
            w.add_q_lora_rank(0)
        w.add_kv_lora_rank(r)
        if variant == "absorbed":
            w.add_key_length(r + rope)
            w.add_value_length(r)
            w.add_key_length_mla(nope + rope)
            w.add_value_length_mla(v)
        else:
            w.add_key_length(nope + rope)
            w.add_value_length(v)
        # find_hparam(["moe_intermediate_size", "intermediate_size"]): the first config.json
        # has -- a dense model's (youtu) is its dense width, "required by C++ code"
        ffn = getattr(config, "moe_intermediate_size", None)
        w.add_expert_feed_forward_length(config.intermediate_size if ffn is None else ffn)
        w.add_expert_shared_count(getattr(config, "n_shared_experts", 0) or 0)
        if (s := getattr(config, "routed_scaling_factor", None)) is not None:
            w.add_expert_weights_scale(s)
        if getattr(config, "norm_topk_prob", None):
            w.add_expert_weights_norm(True)
        w.add_rope_dimension_count(rope)
        rp = dict(getattr(config, "rope_parameters", None) or {})
        if rp.get("mscale_all_dim") is not None:
            # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: the converter writes 0.1 * mscale_all_dim;
            # deepseek2.cpp divides it by 0.1 again
            w.add_rope_scaling_yarn_log_mul(0.1 * rp["mscale_all_dim"])


def mla_lc_points(q_latent: LcPoint | None = LcPoint("q", "op:MUL")) -> dict[str, LcPoint]:
    """llama.cpp's MLA layer points for the deepseek2-style graph (deepseek2.cpp
    / glm-dsa.cpp). Both forms' names are listed: a name the loaded graph does
    not build (``q_pe`` in the naive graph, the ROPE ``Qcur`` in the absorbed
    one) is simply absent, and ``lc_canonical`` drops what is not the probe."""
    pts = {
        "attn_in": LcPoint("attn_norm"),
        # the q occurrences: q_a (MUL_MAT), its norm (MUL), q_b (MUL_MAT), the reshape
        "q": LcPoint("q", "last", "heads"),
        "kv_latent": LcPoint("kv_cmpr", "last"),  # the view, then its norm (MUL)
        "q_pe": LcPoint("q_pe", "rope", "heads"),
        "k_pe": LcPoint("k_pe", "rope", "heads"),
        "q_rope": LcPoint("Qcur", "rope", "heads"),  # naive graph: RoPE on the trailing channels
        "k_rope": LcPoint("Kcur", "last", "heads"),
        "q_absorbed": LcPoint("Qcur", "op:CONCAT", "heads"),  # absorbed graph: [q_nope.k_b | q_pe]
        "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
        "attn_heads": LcPoint("kqv_out"),
        "attn_branch": LcPoint("kqv_out"),
        "resid_mid": LcPoint("ffn_inp"),
        "layer_out": LcPoint("l_out"),
    }
    if q_latent is not None:
        pts["q_latent"] = q_latent
    return pts
