"""olmo3: olmo2 with sliding windows on three of every four layers and RoPE
parameters per layer type (HF ``Olmo3ForCausalLM``,
transformers/models/olmo3/modeling_olmo3.py; llama.cpp arch ``olmo2``,
``src/models/olmo2.cpp``; converter conversion/olmo.py ``Olmo2Model``, which
registers ``Olmo3ForCausalLM`` too).

HF: the attention is olmo2's (``harness.families.olmo2``: no input norm, a
whole-row RMS QK norm before RoPE, the post-attention norm), plus
- ``Olmo3Attention.__init__``: ``sliding_window = config.sliding_window if
  layer_types[i] == "sliding_attention"`` (``Olmo3Config.__post_init__``:
  every layer but each 4th slides);
- ``Olmo3RotaryEmbedding``: one table per layer type, from
  ``rope_parameters[layer_type]`` (YaRN on the full layers of the long-context
  checkpoints, plain RoPE on the sliding ones).

llama.cpp: olmo2.cpp ``load_arch_hparams``: ``found_swa && n_swa > 0`` ->
``LLAMA_SWA_TYPE_STANDARD``, ``load_swa_pattern(ml, 4)``, and
``rope.freq_base_swa`` read into ``rope_freq_base_train_swa`` -- which the
graph never uses: its sliding layers call ``ggml_rope_ext`` with ``freq_base``
(the full layers' base) and no scaling ("Olmo3 use regular rope with no yarn
rope scaling"). So a sliding-layer theta other than the full layers' is HF's
alone: a ``[[finding]]`` (findings.toml). The converter writes TextModel's keys
(theta of ``full_attention``, ``rope.freq_base_swa`` of ``sliding_attention``),
the window and the pattern from ``layer_types``.

Tiny config: 4 layers (S, S, S, F), window 4 (reached at 16 tokens), theta
5e5 on both layer types (Olmo3Config's default and the released
checkpoints').
"""

from __future__ import annotations

from .._gguf_import import llama_like_config, read_hparams, swa_pattern
from ..base import text_model_gguf_params
from ..olmo2 import Olmo2


class Olmo3(Olmo2):
    name = "olmo3"
    hf_model_type = "olmo3"
    description = "olmo2 with 3:1 sliding windows and RoPE per layer type"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "window")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, sliding_window=4,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 500000.0}},
        tie_word_embeddings=False,  # olmo2.cpp: output.weight is required
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "olmo2"
    # Olmo3RotaryEmbedding: position_embeddings[layer_type]
    rope_per_layer_type = True
    # window: LlamaLike's (layer_types[i] == "sliding_attention" -> config.sliding_window)

    def gguf_params(self, w, config, variant=None):
        # conversion/olmo.py Olmo2Model.set_gguf_parameters: TextModel's keys, then the
        # window and the pattern from layer_types
        text_model_gguf_params(w, config)
        if getattr(config, "sliding_window", None) is not None:
            w.add_sliding_window(config.sliding_window)
            w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])

    def config_from_gguf(self, meta, shapes, tensors):
        """olmo2.cpp load_arch_hparams with a window: the RMS eps, the pattern
        (``load_swa_pattern(ml, 4)``) and ``rope.freq_base_swa``, which the graph
        does not use (sliding layers rotate with the main base, unscaled): the HF
        config gets that base on both layer types."""
        hp = read_hparams(meta)
        n_swa = int(meta.get("attention.sliding_window", 0))
        if n_swa > 0:
            swa = swa_pattern(meta, hp, 4)
            meta.skip("rope.freq_base_swa", "olmo2.cpp reads it, but its graph rotates the sliding layers with "
                                            "rope.freq_base")
        else:
            swa = [False] * hp.n_layer
            for key in ("attention.sliding_window_pattern", "rope.freq_base_swa"):
                meta.skip(key, "olmo2.cpp reads it only when attention.sliding_window > 0")
        kw = llama_like_config(self, meta, shapes, hp, swa=any(swa))
        full = kw["rope_parameters"]
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
                  sliding_window=n_swa or None,
                  layer_types=["sliding_attention" if s else "full_attention" for s in swa],
                  rope_parameters={"full_attention": full,
                                   "sliding_attention": {"rope_type": "default", "rope_theta": full["rope_theta"]}})
        return kw


FAMILY = Olmo3()
