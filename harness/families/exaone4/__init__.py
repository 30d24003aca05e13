"""exaone4: EXAONE 4.0 -- no input norm, a norm on the attention branch, a
per-head QK norm before neox RoPE, and (32B) sliding layers with NoPE full
layers (HF ``Exaone4ForCausalLM``, transformers/models/exaone4/modeling_exaone4.py;
llama.cpp arch ``exaone4``, src/models/exaone4.cpp; converter conversion/exaone.py
``Exaone4Model(TextModel)``).

HF:
- ``Exaone4DecoderLayer.forward``: ``self_attn`` reads the RAW layer input,
  ``residual + post_attention_layernorm(attn)``; the MLP likewise with
  ``post_feedforward_layernorm``;
- ``Exaone4Attention.forward``: ``q_norm`` / ``k_norm`` (RMS over ``head_dim``)
  before RoPE; RoPE ``if self.sliding_window is None or self._is_sliding`` (with a
  window, the full layers are NoPE); the window on ``sliding_attention`` layers;
- ``Exaone4Config.__post_init__``: ``sliding_window`` 4096 and pattern 4 by
  default (``LLLG``); ``sliding_window=None`` (EXAONE-4.0-1.2B) needs
  ``layer_types`` (pattern 0: ``(i + 1) % 0`` otherwise).

llama.cpp (exaone4.cpp ``load_arch_hparams``): ONLY at ``n_layer == 64`` (the
32B) ``swa_type = STANDARD``, ``n_swa = 4096``, ``load_swa_pattern(ml, 4)`` and
``rope.freq_base_swa``; at any other depth the graph (``graph<false>``) has no
window and every layer rotates (``use_rope = is_swa(il) || swa_type == NONE``),
whatever the file's ``sliding_window`` says. At 64 layers every non-sliding
layer is NoPE -- even with no window key (the converter writes
``sliding_window`` and the pattern only when HF's ``sliding_window`` is set):
the 64-layer switch is the model's, not the config's. So a tiny config must not
pass or fail by its depth: the family's test runs both sides of the switch, and
the two ways llama.cpp ignores the config are findings (findings.toml). No
``attn_norm``: ``attn_post_norm`` is the branch norm (cb ``attn_post_norm``),
``ffn_inp`` the residual after it. NEOX RoPE (llama_model_rope_type), no Q/K
permutation in the converter.

Tiny config: EXAONE-4.0-1.2B's shape -- no window, every layer full and rotated
-- at 4 layers; the 32B's hybrid is ``--set sliding_window=5`` at
``num_hidden_layers=64`` (both references agree) and at 4 (a finding).
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import hf_rope, llama_like_config, one_theta, read_hparams, swa_pattern
from ..base import LcPoint, LlamaLike, lc_unrotated, post_norm_points

LC_HYBRID_DEPTH = 64  # exaone4.cpp load_arch_hparams: `if (hparams.n_layer() == 64)    // 32B`
LC_DEFAULT_WINDOW = 4096  # ... hparams.n_swa = 4096, then the optional attention.sliding_window key
LC_PATTERN = 4  # ... load_swa_pattern(ml, 4): il % 4 < 3 slides where the file has no pattern


class Exaone4(LlamaLike):
    name = "exaone4"
    hf_model_type = "exaone4"
    description = "no input norm, branch post-norm, per-head QK norm; llama.cpp: window / NoPE only at 64 layers"
    fuzz_space = {"knobs": ("heads", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        sliding_window=None, layer_types=["full_attention"] * 4,  # EXAONE-4.0-1.2B: no window
        tie_word_embeddings=False,
    )
    gguf_arch = "exaone4"
    extra_settable = ("sliding_window_pattern",)
    # attn_in: the raw layer input (no input norm); attn_out: post_attention_layernorm's
    # output, what the residual adds; resid_mid: the MLP's input
    hf_points = post_norm_points("mlp")
    lc_points = {
        **{k: v for k, v in LlamaLike.lc_points.items() if k != "attn_in"},  # no attn_norm
        "attn_out": LcPoint("attn_post_norm"),
    }
    lc_not_exposed = {"attn_in": "exaone4.cpp has no attn_norm: the attention reads the layer input itself "
                                 "(layer_in)"}
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")  # Exaone4Attention q_norm / k_norm
    post_norm_kind = "rms"  # post_attention_layernorm on the branch
    weight_map = {**LlamaLike.weight_map, "post_attention_layernorm.weight": "post_norm"}

    def config_kwargs(self, overrides):
        # Exaone4Config.__post_init__ derives layer_types from the window and its pattern
        # only: a depth or window override recomputes the tiny config's list, as HF would
        # from a config.json without one (sliding_window None: every layer full)
        kw = super().config_kwargs(overrides)
        if "layer_types" not in overrides and {"num_hidden_layers", "sliding_window",
                                               "sliding_window_pattern"} & set(overrides):
            if kw.get("sliding_window") is None:
                kw["layer_types"] = ["full_attention"] * int(kw["num_hidden_layers"])
            else:
                kw.pop("layer_types", None)
        return kw

    def layer_config(self, config, i: int):
        # Exaone4DecoderLayer has no input_layernorm
        return super().layer_config(config, i).replace(input_norm=NormSpec("none"))

    def uses_rope(self, config, i: int) -> bool:
        # Exaone4Attention.forward: `if self.sliding_window is None or self._is_sliding`
        return config.sliding_window is None or config.layer_types[i] == "sliding_attention"

    def _lc_sliding(self, config) -> list[bool] | None:
        """The layers llama.cpp slides (None: no window at all, every layer rotated):
        only at 64 layers, from the file's pattern or load_swa_pattern's default."""
        n = config.num_hidden_layers
        if n != LC_HYBRID_DEPTH:
            return None
        if config.sliding_window is not None:  # the converter's pattern, from layer_types
            return [t == "sliding_attention" for t in config.layer_types]
        return [il % LC_PATTERN < LC_PATTERN - 1 for il in range(n)]

    def lc_points_for(self, config, i: int):
        swa = self._lc_sliding(config)
        if swa is None or swa[i]:
            return self.lc_points
        # exaone4.cpp: no ggml_rope_ext where !use_rope -- q_rope / k_rope are the normed
        # Qcur / Kcur that enter the attention, and "pre_rope" would pick those too: q / k
        # are build_qkv's first Qcur / Kcur, the projections (2-D rows; exaone4 has no bias)
        return {**lc_unrotated(self.lc_points), "q": LcPoint("Qcur", "first", "rows"),
                "k": LcPoint("Kcur", "first", "rows")}

    def gguf_params(self, w, config, variant=None):
        # conversion/exaone.py Exaone4Model.set_gguf_parameters: TextModel's keys, the vocab
        # size, and -- only with HF's sliding_window set -- the window and the per-layer
        # pattern from layer_types (transformers 5 always saves layer_types)
        super().gguf_params(w, config, variant)
        if config.sliding_window is not None:
            w.add_sliding_window(config.sliding_window)
            w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])

    def config_from_gguf(self, meta, shapes, tensors):
        """exaone4.cpp load_arch_hparams: at 64 layers the window (default 4096), the
        pattern (load_swa_pattern(ml, 4)) and rope.freq_base_swa, with NoPE on every
        full layer; at any other depth none of them (the window key is read and
        unused): every layer full and rotated -- HF's sliding_window None."""
        hp = read_hparams(meta)
        if hp.n_layer == LC_HYBRID_DEPTH:
            swa = swa_pattern(meta, hp, LC_PATTERN)
            one_theta(meta, hp, swa)
            window = int(meta.get("attention.sliding_window", LC_DEFAULT_WINDOW))
            types = ["sliding_attention" if s else "full_attention" for s in swa]
        else:
            meta.get("attention.sliding_window", None)  # read by the loader, used by no graph
            for key in ("attention.sliding_window_pattern", "rope.freq_base_swa"):
                meta.skip(key, f"exaone4.cpp reads it only at {LC_HYBRID_DEPTH} layers")
            swa, window, types = [False] * hp.n_layer, None, ["full_attention"] * hp.n_layer
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa))
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), sliding_window=window,
                  layer_types=types, rope_parameters=hf_rope(meta, hp))
        return kw


FAMILY = Exaone4()
