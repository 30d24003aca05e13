"""mistral3: the text model of Mistral 3 (HF ``Mistral3ForConditionalGeneration``,
transformers/models/mistral3/modeling_mistral3.py, whose ``text_config`` is a
``MistralConfig``: Mistral-Small-3.1-24B; the text decoder is HF's
``MistralForCausalLM``), as llama.cpp's ``mistral3`` arch runs it
(``src/models/mistral3.cpp``; converter conversion/mistral3.py
``Mistral3Model``, which delegates a non-``mistral4`` text config to
``Ministral3Model(LlamaModel)``).

The attention is mistral's (``harness.families.mistral``): llama's shape with
``sliding_window`` on every layer when set. The converter is LlamaModel's
(Q/K rows permuted per head, TextModel's keys, vocab size, rope dimension
count); the YaRN log multiplier and the attention temperature it adds only for
``model_type == "ministral3"`` (Ministral 3, not this family). mistral3.cpp
is llama.cpp's llama graph plus an optional temperature tuning
(``attention.temperature_scale``, absent here) and YaRN betas; it has no
sliding window, like llama's (the same finding as mistral's,
findings.toml).

HF side: the decoder alone (``MistralForCausalLM`` of the text config) --
the vision tower and projector are not part of the attention the harness
compares, and the converter drops them (conversion/base.py
``TextModel.filter_tensors``: ``vision_tower`` / ``multi_modal_projector``).
``--hf-model`` on a Mistral 3 checkpoint resolves its text ``model_type``
``mistral`` to the mistral family; ``--family mistral3`` chooses this one.
"""

from __future__ import annotations

from ..mistral import Mistral


class Mistral3(Mistral):
    name = "mistral3"
    hf_model_type = "mistral"  # Mistral3Config.text_config: MistralConfig
    description = "Mistral 3's text decoder (mistral) on llama.cpp's mistral3 graph"
    gguf_arch = "mistral3"

    def config_from_gguf(self, meta, shapes, tensors):
        """mistral3.cpp load_arch_hparams: the RMS eps, then the temperature scale and
        the YaRN betas and log multiplier (optional). HF's Mistral has no attention
        temperature: a file with one is refused; the YaRN keys are read with the
        RoPE (none here: a default RoPE reads no YaRN key)."""
        kw = super().config_from_gguf(meta, shapes, tensors)
        temp = meta.get_f32("attention.temperature_scale", 0.0)
        if temp:
            meta.refuse("attention.temperature_scale", temp, "attention temperature tuning (Ministral 3); HF's "
                        "Mistral has none; valid: 0")
        if kw["rope_parameters"].get("rope_type") == "yarn":
            meta.refuse("rope.scaling.type", "yarn", "YaRN on mistral3 (Ministral 3's) is not read here")
        for key in ("rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_log_multiplier"):
            meta.skip(key, "read by mistral3.cpp for YaRN only; this file's RoPE is not YaRN")
        return kw


FAMILY = Mistral3()
