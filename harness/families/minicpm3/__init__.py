"""minicpm3: multi-head latent attention with rotate-half LongRoPE slices and
MiniCPM's muP scales (HF ``MiniCPM3ForCausalLM``,
transformers/models/minicpm3/modular_minicpm3.py; llama.cpp arch ``minicpm3``,
src/models/minicpm3.cpp; converter conversion/minicpm.py ``MiniCPM3Model``).

HF: ``MiniCPM3Attention`` is ``DeepseekV2Attention``'s MLA (low-rank Q through
``q_a_layernorm``, ``kv_a_proj_with_mqa`` -> latent + one shared rope slice,
``kv_b_proj`` combined, ``scaling = qk_head_dim ** -0.5``; no YaRN mscale: no
``mscale_all_dim``) except the rope slices turn rotate-half
(``apply_rotary_pos_emb``), with ``MiniCPM3RotaryEmbedding`` at ``head_dim =
qk_rope_head_dim`` and the config's LongRoPE (short factor set up to
``original_max_position_embeddings``). The muP scales:
``MiniCPM3ScaledWordEmbedding`` multiplies the embedding by ``scale_emb``;
``MiniCPM3DecoderLayer.forward`` adds each branch times ``scale_depth /
sqrt(num_hidden_layers)``; ``MiniCPM3ForCausalLM.forward`` divides the final
norm by ``logits_scaling = hidden_size / dim_model_base``.

llama.cpp (minicpm3.cpp) runs the NAIVE form only (``k_states = concat(k_nope,
repeat(k_pe))``, ``v_states`` from ``wkv_b``; NEOX RoPE, llama-model.cpp
llama_model_rope_type) with ``rope_factors`` (``get_rope_factors``: long iff the
context per sequence exceeds ``n_ctx_orig_yarn``; the converter writes no
original length, so that is ``context_length``) and HARD-CODES the muP scales
(minicpm3.cpp graph: ``n_embd_base = 256``, ``scale_embd = 12.0f``,
``scale_depth = 1.4f``, "TODO: if the model varies, these parameters need to
be read from the model"): the converter writes none of them. The tiny config
sits at those constants (openbmb/MiniCPM3-4B's values), so all three sides agree;
any other value is HF's alone -- a bounded finding (findings.toml), impl
following HF. The converter also writes no ``rope.freq_base`` (llama.cpp's
default 10000) and no ``value_length`` (``n_embd / n_head``), so the tiny
config keeps theta 10000 and HF's default ``v_head_dim = hidden / heads``.

Probes (HF: ``_mla.MlaFamily``'s map; llama.cpp below): ``embeddings`` is the
SCALED embedding (HF's ``embed_tokens`` output; llama.cpp ``inp_scaled``);
``attn_out`` is wo's product, which minicpm3.cpp does not name (its
``hidden_scaled`` is after the residual scale): the llama.cpp capture derives
it as ``(ffn_inp - layer_in) / residual_multiplier``; ``resid_mid`` is ``ffn_inp``; ``q_pe`` is not named by the graph (the
rotated ``q_rope`` holds it). Tiny config: hidden 64, 2 layers, 4 heads,
q_lora_rank 24, kv_lora_rank 24, nope 12 / rope 8, v 16, LongRoPE short /
long factor sets over 256 positions (attention factor 1: max == original, as
MiniCPM3-4B's 32768 == 32768), ``rms_norm_eps = 1e-6`` (HF's latent norms use
1e-6 whatever it says; llama.cpp uses the file's).
"""

from __future__ import annotations

import math

from impl import make_rope

from .._convert import longrope_factor_tensors, longrope_factors_of, without_longrope_tensors
from .._gguf_import import llama_like_config, read_hparams, special_tokens, vocab_of  # noqa: F401
from .._mla import MlaFamily
from ..base import LcPoint

# what minicpm3.cpp's graph hard-codes (the muP scales the converter never writes)
LC_SCALE_EMB, LC_SCALE_DEPTH, LC_DIM_MODEL_BASE = 12.0, 1.4, 256
# the context per sequence the harness runs llama.cpp with for cases up to 256 tokens
# (references/llamacpp/capture.py): what get_rope_factors compares with n_ctx_orig_yarn
LONGROPE_CONTEXT = 256
# the HF-only config the tests run: every muP scale away from llama.cpp's constants
OFF_CONSTANTS = (("scale_emb", 10.0), ("scale_depth", 1.0), ("dim_model_base", 64))


class MiniCPM3(MlaFamily):
    name = "minicpm3"
    # the fuzz: the generic heads knob, then the norm eps, layer count and context length
    # every family gets (harness/fuzz.py case_strategy)
    fuzz_space = {"knobs": ("heads",)}
    hf_model_type = "minicpm3"
    description = "MLA (naive) with rotate-half LongRoPE slices, muP embedding / residual / logit scales"
    gguf_arch = "minicpm3"
    variants = ("naive",)  # minicpm3.cpp builds the naive graph only (combined wkv_b)
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=24, kv_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8,  # v: 64 / 4 = 16
        scale_emb=LC_SCALE_EMB, scale_depth=LC_SCALE_DEPTH, dim_model_base=LC_DIM_MODEL_BASE,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 256,
                         "short_factor": [1.0, 1.25, 1.875, 2.5], "long_factor": [1.5, 3.0, 7.0, 13.0]},
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    latent_norm_eps = 1e-6
    hf_model_points = {"embeddings": ("model.embed_tokens", "out"), "final_norm": ("model.norm", "out")}
    lc_model_points = {**MlaFamily.lc_model_points, "embeddings": LcPoint("inp_scaled")}
    lc_points = {
        "attn_in": LcPoint("attn_norm"),
        # the q occurrences: q_a (MUL_MAT), its norm (MUL), q_b (MUL_MAT), the reshape
        "q_latent": LcPoint("q", "op:MUL"),
        "q": LcPoint("q", "last", "heads"),
        "kv_latent": LcPoint("kv_compressed", "last"),  # the view, then its norm
        "k_pe": LcPoint("k_pe", "rope", "heads"),
        # the ROPE node (on the trailing rope channels of each head, ggml_rope_set_offset): named
        # "q_rope", then renamed by cb(q_states, "q_states") -- the same tensor
        "q_rope": LcPoint("q_states", "rope", "heads"),
        "k_rope": LcPoint("k_states", "last", "heads"),  # concat(k_nope, repeat(k_pe))
        "attn_probs": LcPoint("kq_soft_max", "last", "probs"),
        "attn_heads": LcPoint("kqv_out"),
        "attn_branch": LcPoint("kqv_out"),
        "resid_mid": LcPoint("ffn_inp"),
        "layer_out": LcPoint("l_out"),
    }
    lc_not_exposed = {"q_pe": "minicpm3.cpp rotates the whole query in place (ggml_rope_set_offset): its "
                              "rope slice is part of q_rope, never a tensor of its own"}

    def lc_points_for(self, config, i):
        return self.lc_points

    def mla_rope_layout(self, config) -> str:
        return "neox"  # MiniCPM3Attention: apply_rotary_pos_emb (rotate-half); minicpm3.cpp NEOX

    def _rope_set(self, config) -> str:
        """The LongRoPE factor set this case runs: HF takes ``long`` for a sequence
        longer than ``original_max_position_embeddings``; llama.cpp for a context
        (LONGROPE_CONTEXT) longer than ``context_length`` -- the tiny default (256,
        256) is short on every side."""
        orig = config.rope_parameters.get("original_max_position_embeddings", config.max_position_embeddings)
        return "long" if orig < LONGROPE_CONTEXT else "short"

    def mla_rope(self, config):
        rp = dict(config.rope_parameters or {})
        if rp.get("rope_type") != "longrope":
            return super().mla_rope(config)
        # HF _compute_longrope_parameters at dim = head_dim = qk_rope_head_dim
        rp.update(max_position_embeddings=config.max_position_embeddings, which=self._rope_set(config))
        return make_rope("longrope", rp["rope_theta"], config.qk_rope_head_dim, "neox", rp)

    def layer_config(self, config, i: int, variant: str = "naive"):
        # MiniCPM3DecoderLayer.__init__: residual_scale = scale_depth / sqrt(num_hidden_layers)
        return super().layer_config(config, i, variant).replace(
            residual_multiplier=float(config.scale_depth) / math.sqrt(config.num_hidden_layers))

    def feature_switches(self, config, features):
        sw = super().feature_switches(config, features)
        rp = dict(config.rope_parameters or {})
        if "mla_longrope" in features:
            # LongRoPE off in HF (MiniCPM3RotaryEmbedding at the plain bands), and so in impl
            sw["mla_longrope"] = {"rope_parameters": {"rope_type": "default", "rope_theta": rp["rope_theta"]}}
        if "mla_residual_multiplier" in features:
            # MiniCPM3DecoderLayer: scale_depth / sqrt(L) = 1
            sw["mla_residual_multiplier"] = {"scale_depth": math.sqrt(config.num_hidden_layers)}
        return sw

    def mla_router(self, meta, hp):
        return {}

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/minicpm.py MiniCPM3Model.set_gguf_parameters, key for key (no TextModel
        # super call: no rope.freq_base, no value_length, none of the muP scales)
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(config.hidden_size)
        w.add_block_count(config.num_hidden_layers)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(config.num_key_value_heads)
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_vocab_size(config.vocab_size)
        if config.q_lora_rank is not None:
            w.add_q_lora_rank(config.q_lora_rank)
        w.add_kv_lora_rank(config.kv_lora_rank)
        w.add_key_length(config.qk_nope_head_dim + config.qk_rope_head_dim)
        w.add_rope_dimension_count(config.qk_rope_head_dim)

    def gguf_tensors(self, model, config, variant=None):
        yield from super().gguf_tensors(model, config, variant)
        rp = config.rope_parameters
        yield from longrope_factor_tensors(rp)

    def gguf_import_prepare(self, tensors, config):
        return super().gguf_import_prepare(without_longrope_tensors(tensors), config)

    def config_from_gguf(self, meta, shapes, tensors):
        """minicpm3.cpp load_arch_hparams: the RMS eps, the Q and KV ranks (required);
        the head widths from key / value length (the naive form: a KV head per head);
        the LongRoPE factor tensors; the muP scales are the graph's constants."""
        hp = read_hparams(meta)
        r = int(meta.get("attention.kv_lora_rank"))
        q_rank = int(meta.get("attention.q_lora_rank"))
        if hp.head_kv != hp.head:
            meta.refuse("attention.head_count_kv", hp.head_kv, f"minicpm3.cpp's naive MLA has a KV head per head "
                                                               f"({hp.head})")
        if not 0 < hp.n_rot < hp.n_embd_head_k:
            meta.refuse("rope.dimension_count", hp.n_rot, f"the rope slice must lie inside the "
                                                          f"{hp.n_embd_head_k}-wide head")
        if hp.n_embd_head_v != hp.n_embd // hp.head:
            meta.refuse("attention.value_length", hp.n_embd_head_v, f"HF MiniCPM3's v_head_dim defaults to "
                                                                    f"hidden / heads ({hp.n_embd // hp.head})")
        rp = {"rope_type": "default", "rope_theta": hp.rope_freq_base}
        factors = longrope_factors_of(tensors)
        if factors is not None:
            rp.update(rope_type="longrope", original_max_position_embeddings=hp.n_ctx_orig_yarn, **factors)
            if hp.rope_attn_factor != 1.0:
                rp["attention_factor"] = hp.rope_attn_factor
        elif hp.rope_attn_factor != 1.0:
            meta.refuse("rope.scaling.attn_factor", hp.rope_attn_factor, "an attention factor without LongRoPE "
                        "factor tensors; HF's default RoPE has none")
        vocab = vocab_of(meta, shapes)
        return dict(
            num_hidden_layers=hp.n_layer, max_position_embeddings=hp.n_ctx_train, hidden_size=hp.n_embd,
            intermediate_size=hp.ff, vocab_size=vocab, tie_word_embeddings="output.weight" not in shapes,
            num_attention_heads=hp.head, num_key_value_heads=hp.head, q_lora_rank=q_rank, kv_lora_rank=r,
            qk_nope_head_dim=hp.n_embd_head_k - hp.n_rot, qk_rope_head_dim=hp.n_rot,
            rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), rope_parameters=rp,
            scale_emb=LC_SCALE_EMB, scale_depth=LC_SCALE_DEPTH, dim_model_base=LC_DIM_MODEL_BASE,
            **special_tokens(meta, vocab))


FAMILY = MiniCPM3()
