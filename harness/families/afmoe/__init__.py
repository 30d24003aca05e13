"""afmoe (Arcee's Trinity): the OUTPUT GATE from a separate projection of the
normed input, on top of per-head QK norms, sliding layers that rotate and full
layers that do not, a post-attention norm, muP input scaling and a sigmoid-
routed MoE with shared experts (HF ``AfmoeForCausalLM``; llama.cpp
``src/models/afmoe.cpp``; converter ``conversion/afmoe.py``).

HF (``modeling_afmoe.py``):
- ``AfmoeAttention.forward``: ``gate_states = gate_proj(hidden_states)`` -- the
  SAME normed input q/k/v_proj read -- and, after the attention,
  ``output = output * torch.sigmoid(gate_states)`` BEFORE ``o_proj`` (impl
  ``LayerConfig.output_gate``, weight ``wg``; spec ``attn_branch_rows``:
  ``layer.attn.output_gate``).
- ``q_norm`` / ``k_norm``: ``AfmoeRMSNorm(head_dim)`` per head, before RoPE.
- RoPE only ``if self.is_local_attention`` (``layer_types[i] ==
  "sliding_attention"``); full layers are NoPE. ``AfmoeConfig.__post_init__``:
  ``layer_types[i] = "sliding_attention" if (i + 1) % global_attn_every_n_layers
  else "full_attention"``; sliding layers get ``sliding_window``.
- ``AfmoeDecoderLayer``: ``post_attention_layernorm`` on the attention output
  before the residual (impl ``post_norm``); ``pre_mlp_layernorm`` /
  ``post_mlp_layernorm`` around the FFN; layers ``>= num_dense_layers`` are MoE.
- ``AfmoeModel.forward``: ``if config.mup_enabled: hidden_states *=
  hidden_size ** 0.5`` after the embedding.

llama.cpp (``afmoe.cpp``): ``gate = build_lora_mm(wqkv_gate, attn_inp)`` on the
``attn_norm`` output (cb ``attn_gate_proj``), Q/K RMS norms (``Qcur_normed``),
``use_rope = (il + 1) % n_no_rope_layer_step != 0`` with
``n_no_rope_layer_step`` left at its default 4 (``llama-hparams.h``; no GGUF
key), ``build_attn`` WITHOUT ``wo`` (its output renamed ``attn_out`` -- the
heads), ``attn_gate_sig`` / ``attn_gated`` (the branch entering ``wo``),
``build_lora_mm(wo, cur, wo_s)`` (``attn_o_proj``), ``attn_post_norm``. The
sliding pattern is ``load_swa_pattern(ml, 4)`` (``il % 4 < 3``; the converter
writes no pattern key). The input is ALWAYS scaled by ``sqrt(n_embd)``
(``inp_embd_scaled``: no hyper-parameter reaches the graph), RoPE is NEOX
(``llama_model_rope_type``), and the converter does NOT permute Q/K: its
``AfmoeModel.modify_tensors`` calls ``ModelBase.modify_tensors`` directly,
skipping ``LlamaModel``'s permutation.

Configs:
- default (below): 4 layers, ``global_attn_every_n_layers = 4`` (layers 0-2
  sliding with RoPE and window 4, layer 3 full and NoPE -- the pattern both
  references share), ``mup_enabled = true`` (what llama.cpp always does; the
  released checkpoints set it), layer 0 dense and 1-3 MoE (4 experts, 2 used,
  1 shared, sigmoid routing with an expert bias, ``route_norm`` and
  ``route_scale`` written as the converter writes them).
- HF-only ``--set global_attn_every_n_layers=2``: HF makes layer 1 full and
  NoPE; llama.cpp keeps its fixed step of 4 (layer 1 sliding and rotated) -- a
  ``[[finding]]`` with the measured numbers.
- HF-only ``--set mup_enabled=false`` (HF's config default): HF feeds the raw
  embeddings to layer 0, llama.cpp scales them anyway -- a ``[[finding]]``
  between the references (impl, teacher-forced, agrees with each).
- ``attention_bias = true`` is not run against llama.cpp: afmoe.cpp creates no
  ``attn_output.bias``, so the converted file is refused by the loader.
"""

from __future__ import annotations

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import experts, llama_like_config, one_per_layer, one_theta, read_hparams, swa_pattern
from ..base import (LcPoint, LlamaLike, gguf_moe_convert, lc_unrotated, post_norm_points,
                   text_model_gguf_params)


class Afmoe(LlamaLike):
    name = "afmoe"
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "window")}
    hf_model_type = "afmoe"
    description = "output gate from a separate projection, QK norm, RoPE on sliding layers only, post norm, muP, MoE"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
        num_dense_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_experts=4, num_experts_per_tok=2, num_shared_experts=1, route_scale=1.5,
        # not an AfmoeConfig field: the released config.json files carry it and the
        # converter writes it (expert_weights_norm); HF's router always normalises
        route_norm=True,
        global_attn_every_n_layers=4, sliding_window=4, mup_enabled=True,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "afmoe"
    converter_rope_freqs = True  # conversion/afmoe.py AfmoeModel(LlamaModel): afmoe.cpp then reads none
    extra_settable = ("route_norm",)
    # AfmoeExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    # AfmoeDecoderLayer.forward: post_attention_layernorm(self_attn(...)) is added
    # to the residual; pre_mlp_layernorm reads the residual after it
    hf_points = post_norm_points("pre_mlp_layernorm")
    lc_points = {
        **LlamaLike.lc_points,
        # build_qkv's last Qcur/Kcur is the [D, H, T] reshape; the ROPE output is
        # renamed Qcur_rope / Kcur_rope, and there is no ROPE node on a NoPE layer
        "q": LcPoint("Qcur", "last", "heads"),
        "k": LcPoint("Kcur", "last", "heads"),
        "q_rope": LcPoint("Qcur_rope", "last", "heads"),
        "k_rope": LcPoint("Kcur_rope", "last", "heads"),
        # build_attn is called without wo, and afmoe.cpp renames its result
        # (kqv_out) to "attn_out": the heads, before the gate
        "attn_heads": LcPoint("attn_out"),
        "attn_branch": LcPoint("attn_gated"),
        "attn_out": LcPoint("attn_post_norm"),
    }

    # ------------------------------------------------------------------ impl
    # AfmoeAttention: q_norm / k_norm = AfmoeRMSNorm(head_dim), before RoPE
    qk_norm = QkNormSpec(NormSpec("rms"), over="head", where="pre_rope")
    # AfmoeDecoderLayer.forward: post_attention_layernorm on the attention output
    post_norm_kind = "rms"
    weight_map = {**LlamaLike.weight_map, "self_attn.gate_proj.weight": "wg",
                  "post_attention_layernorm.weight": "post_norm"}

    def uses_rope(self, config, i: int) -> bool:
        # AfmoeAttention.forward: apply_rotary_pos_emb only `if self.is_local_attention`
        return config.layer_types[i] == "sliding_attention"

    def layer_config(self, config, i: int):
        # AfmoeAttention.forward: output * sigmoid(gate_proj(hidden_states)) before o_proj
        return super().layer_config(config, i).replace(output_gate=True)

    # ------------------------------------------------------------------ llama.cpp
    def lc_points_for(self, config, i: int):
        # afmoe.cpp: use_rope = (il + 1) % n_no_rope_layer_step != 0, step 4 (the
        # hparams default). Where llama.cpp does not rotate, what enters the attention
        # is the normed Qcur / Kcur.
        if (i + 1) % 4 != 0:
            return self.lc_points
        return lc_unrotated(self.lc_points, "Qcur_normed", "Kcur_normed")

    def lc_layer_input(self, config, i: int):
        # afmoe.cpp: inpL = ggml_scale(inp_embd, sqrtf(n_embd)), cb "inp_embd_scaled";
        # the model-level "embeddings" probe stays the unscaled `embd` (HF's
        # embed_tokens output, before AfmoeModel.forward's muP scaling)
        if i == 0:
            return "embeddings", LcPoint("inp_embd_scaled")
        return super().lc_layer_input(config, i)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        # conversion/afmoe.py AfmoeModel(LlamaModel).set_gguf_parameters:
        # TextModel.set_gguf_parameters, then LlamaModel's vocab size and rope
        # dimension count, then afmoe's MoE and window keys
        text_model_gguf_params(w, config)
        w.add_vocab_size(config.vocab_size)
        w.add_rope_dimension_count(self.head_dim(config))
        if (n := getattr(config, "num_shared_experts", None)) is not None:
            w.add_expert_shared_count(n)
        if (n := getattr(config, "moe_intermediate_size", None)) is not None:
            w.add_expert_feed_forward_length(n)
        if (n := getattr(config, "num_dense_layers", None)) is not None:
            w.add_leading_dense_block_count(n)
        if (v := getattr(config, "route_norm", None)) is not None:
            w.add_expert_weights_norm(v)
        if (v := getattr(config, "route_scale", None)) is not None:
            w.add_expert_weights_scale(v)
        if (v := getattr(config, "sliding_window", None)) is not None:
            w.add_sliding_window(v)

    def gguf_convert(self, name, data, config, variant=None):
        if name.endswith(".expert_bias"):
            # AfmoeModel.filter_tensors: ".expert_bias" -> ".expert_bias.bias" (-> exp_probs_b.bias)
            yield name.replace(".expert_bias", ".expert_bias.bias"), data
            return
        # the fused experts (AfmoeExperts.forward: gate_up .chunk(2, dim=-1), gate rows
        # first): AfmoeModel.modify_tensors stacks the checkpoint's per-expert
        # gate/up/down (torch.stack(datas, dim=0)) into ffn_{gate,up,down}_exps
        # ModelBase.modify_tensors otherwise: the plain rename, no Q/K permutation (NEOX RoPE)
        yield from gguf_moe_convert(name, data) or [(name, data)]


    def config_from_gguf(self, meta, shapes, tensors):
        """afmoe.cpp load_arch_hparams: the RMS eps, the leading dense layers, the
        experts' width and shared count (required), the gating function (default
        sigmoid), the routed weights' scale and norm, and -- when the window is
        > 0 -- ``load_swa_pattern(ml, 4)`` and ``rope.freq_base_swa``. The graph
        rotates every layer but each 4th (``n_no_rope_layer_step``, no key) and
        always scales the input by sqrt(n_embd); HF Afmoe rotates exactly its
        sliding layers, scales with ``mup_enabled``, and routes by sigmoid with
        renormalised top-k weights -- a file that says otherwise is refused."""
        hp = read_hparams(meta)
        n_swa = int(meta.get("attention.sliding_window", 0))
        if n_swa > 0:
            swa = swa_pattern(meta, hp, 4)
            one_theta(meta, hp, swa)
        else:
            swa = [False] * hp.n_layer
            for key in ("attention.sliding_window_pattern", "rope.freq_base_swa"):
                meta.skip(key, "afmoe.cpp reads it only when attention.sliding_window > 0")
        if swa != [(il + 1) % 4 != 0 for il in range(hp.n_layer)]:
            meta.refuse("attention.sliding_window_pattern", swa, "llama.cpp rotates every layer but each 4th "
                        "(n_no_rope_layer_step 4), HF Afmoe exactly its sliding layers: they must coincide")
        kw = llama_like_config(self, meta, shapes, hp, swa=True, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        if int(meta.get("expert_gating_func", 2)) != 2:
            meta.refuse("expert_gating_func", meta.get("expert_gating_func"), "HF Afmoe routes by sigmoid (2)")
        if not meta.get("expert_weights_norm", False):
            meta.refuse("expert_weights_norm", meta.get("expert_weights_norm", False),
                        "unnormalised top-k weights; HF AfmoeTokenChoiceRouter always renormalises them")
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_experts=n_exp,
                  num_experts_per_tok=n_used, moe_intermediate_size=one_per_layer(meta, "expert_feed_forward_length",
                                                                                  hp.n_layer),
                  num_shared_experts=int(meta.get("expert_shared_count")),
                  num_dense_layers=int(meta.get("leading_dense_block_count", 0)),
                  route_scale=meta.get_f32("expert_weights_scale", 0.0) or 1.0, route_norm=True,
                  sliding_window=n_swa, global_attn_every_n_layers=4, mup_enabled=True,
                  layer_types=["sliding_attention" if s else "full_attention" for s in swa])
        return kw


FAMILY = Afmoe()
