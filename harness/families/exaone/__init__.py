"""exaone: EXAONE 3 / 3.5 (HF ``ExaoneConfig``, transformers/models/exaone/
modular_exaone.py, built as ``LlamaForCausalLM``; llama.cpp
``src/models/exaone.cpp``; converter conversion/exaone.py ``ExaoneModel``).

HF: llama (GQA, neox RoPE, scale ``head_dim ** -0.5``) with EXAONE's defaults
(theta 5e5, ``attribute_map``: ``activation_function`` -> ``hidden_act``,
``layer_norm_epsilon`` -> ``rms_norm_eps``). Loading a hub checkpoint renames
its tensors (conversion_mapping.py ``"exaone"``: ``transformer.h.N.attn.
attention.q_proj`` -> ``model.layers.N.self_attn.q_proj``); saving renames
them back -- but writes ``architectures = ["LlamaForCausalLM"]``.

llama.cpp: ``exaone.cpp`` is llama's attention with ``LLAMA_ROPE_TYPE_NEOX``,
so ``ExaoneModel`` (a ``TextModel``) does NOT permute Q/K; it writes
TextModel's keys and ``rope.dimension_count = partial_rotary_factor *
(hidden_size // num_attention_heads)`` (not head_dim: the graph asserts
``n_embd_head == n_rot``, so a head_dim other than hidden / heads is refused
by llama.cpp), and a ``rope_freqs`` tensor for llama3 RoPE (exaone.cpp loads
it). exaone.cpp names no ``attn_out`` and creates no ``attn_output.bias``.

The trap (tests/test_gguf_files.py ``test_exaone_converter_needs_a_key_
transformers_5_drops``): ``ExaoneModel.set_gguf_parameters`` asserts
``hparams["activation_function"] == "silu"``, and the converter reads hparams
through transformers (conversion/base.py ``ModelBase.load_hparams``:
``AutoConfig.from_pretrained(...).to_dict()``). transformers 5's ExaoneConfig
maps ``activation_function`` onto ``hidden_act`` (``attribute_map``), so the
key is gone even where config.json has it: under transformers 5, llama.cpp's
converter refuses every EXAONE 3 checkpoint (KeyError). Files converted
under transformers 4 (which had no ``exaone`` type and read config.json as it
is) are arch exaone, and this family's export mirrors them. (A checkpoint
saved by transformers 5 names ``LlamaForCausalLM``; the converter's llama
path takes that one and writes a llama file -- the same model, permuted.)
"""

from __future__ import annotations

from ..base import LlamaLike, text_model_gguf_params


class Exaone(LlamaLike):
    name = "exaone"
    hf_model_type = "exaone"
    description = "llama on llama.cpp's exaone graph (neox, no Q/K permutation)"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2,  # the default eos 361 lies outside 128 tokens
        tie_word_embeddings=False,
    )
    gguf_arch = "exaone"
    converter_rope_freqs = True  # ExaoneModel.generate_extra_tensors: llama3's factors
    # exaone.cpp: build_attn's wo output carries no name
    lc_points = {k: v for k, v in LlamaLike.lc_points.items() if k != "attn_out"}

    def gguf_params(self, w, config, variant=None):
        # conversion/exaone.py ExaoneModel.set_gguf_parameters: TextModel's, then
        # rope.dimension_count from hidden_size // num_attention_heads (after asserting
        # activation_function == "silu": see the module docstring)
        text_model_gguf_params(w, config)
        rp = dict(config.rope_parameters or {})
        prf = rp.get("partial_rotary_factor")
        prf = prf if prf is not None else 1.0
        w.add_rope_dimension_count(int(prf * (config.hidden_size // config.num_attention_heads)))


FAMILY = Exaone()
