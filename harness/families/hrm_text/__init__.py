"""hrm_text: two stacks of decoder layers -- L (fast) and H (slow) -- re-run
several times per forward (cycles), each invocation its own KV-cache slot;
weightless RMS norms, a per-channel sigmoid output gate, MHA (HF
``HrmTextForCausalLM``, transformers/models/hrm_text/modeling_hrm_text.py;
llama.cpp arch ``hrm_text``, src/models/hrm-text.cpp; converter
conversion/hrm_text.py ``HrmTextModel``).

HF (``modeling_hrm_text.py``):
- ``HrmTextConfig.__post_init__``: the ``num_hidden_layers`` passed is the
  per-stack count (kept as ``num_layers_per_stack``) and is rewritten to
  ``num_layers_per_stack * H_cycles * (L_cycles + 1)`` -- one cache slot per
  attention invocation; ``embedding_scale`` defaults to ``1 / initializer_range``.
- ``HrmTextModel.forward``: ``z_H = embed_tokens(ids) * embedding_scale``,
  ``z_L = z_L_init``; for each H cycle ``h``: ``L_cycles`` times ``z_L =
  L_module(z_L + z_H, cycle_offset=(h (L + 1) + l) n)``, then ``z_H =
  H_module(z_H + z_L, cycle_offset=(h (L + 1) + L) n)``; the logits read
  ``z_H`` (no model-level norm: the H stack's ``final_norm`` is the last).
- ``HrmTextStack``: ``n`` ``HrmTextDecoderLayer`` then ``final_norm``;
  ``HrmTextRMSNorm`` has NO weight (``x * rsqrt(mean(x^2) + eps)``: impl
  ``NormSpec("l2")``).
- ``HrmTextAttention``: q/k/v/``gate_proj`` of the same normed input, all
  ``num_attention_heads`` wide (``num_key_value_groups = 1``: MHA); rotate-half
  RoPE; ``cache.update(..., self.layer_idx + cycle_offset)``; ``attn_output =
  sigmoid(gate_states) * attn_output`` per channel BEFORE ``o_proj`` (impl
  ``LayerConfig.output_gate``, weight ``wg``).
- ``prefix_lm`` (default True) makes the ``token_type_ids == 1`` rows one
  bidirectional block -- only when ``token_type_ids`` are passed on the first
  call (``HrmTextModel.forward``: ``block_sequence_ids``). The harness passes
  none, so HF is causal, as llama.cpp always is (hrm-text.cpp
  ``load_arch_hparams``: "prefix-LM prefill is not implemented (causal attention
  only)"); test_hrm_text.py holds both sides.

The layers here are the INVOCATIONS, as llama.cpp's graph and both caches index
them (``invocation_order``): layer ``s = (h (L + 1) + l) n + il`` runs the L
stack's module ``il`` for ``l < L`` and the H stack's for ``l = L``; the HF
capture counts each module's calls within a forward
(references/hf/capture.py), and impl runs the same unrolled sequence of layer
descriptions, invocations of one module sharing its weights.

llama.cpp (hrm-text.cpp): ``build_stack`` names every tensor with the slot
``s``: ``attn_norm`` (weightless ``build_norm``), ``attn_gate_proj``,
``Qcur`` / ``Kcur`` (NEOX RoPE, llama-model.cpp ``llama_model_rope_type``),
``attn_pregate`` (the heads), ``attn_gate_sigmoid``, ``attn_gated`` (the
branch), ``attn_out`` (``wo``), ``attn_add``, ``ffn_norm``, ``ffn_out``,
``ffn_add``, ``l_out``; ``stack_norm`` under the stack's first slot. The stack
INPUT (``ggml_add(zH, zL)``) has no ``cb()``, so the first layer of every stack
invocation has no input in llama.cpp's capture: it is not teacher-forced
against llama.cpp (the references are still compared there), and every other
layer's input is the previous slot's ``l_out``. ``embd`` is the SCALED
embedding (``build_inp_embd``: ``f_embedding_scale``) where HF's
``embed_tokens`` output is not, so llama.cpp's is not read as ``embeddings``.
``load_arch_tensors``: blocks ``[0, n)`` hold the L stack, ``[n, 2n)`` the H
stack; the other slots alias them.

The converter: TextModel's keys (``block_count`` is the expanded slot count;
no ``head_count_kv``: the config has no ``num_key_value_heads``, llama.cpp
defaults it to ``head_count``), ``rope.dimension_count`` = head_dim,
``embedding_scale``, ``hrm.layers_per_stack``, ``hrm.h_cycles``,
``hrm.l_cycles``, ``hrm.prefix_lm``; ``modify_tensors``: ``model.L_module.
layers.i.*`` -> blk.i, ``model.H_module.layers.i.*`` -> blk.(n + i),
``model.z_L_init`` -> ``hrm.z_l_init``, the rest through the tensor map
(``self_attn.gate_proj`` -> ``attn_gate``). The installed gguf 0.19 has no
HRM_TEXT arch: its tensors are named with ``tensor_name_map`` over the vendored
gguf-py's ``MODEL_TENSORS[HRM_TEXT]`` (less ``HRM_Z_L_INIT``, which 0.19 lacks
and ``gguf_tensor_map`` names itself), its keys written by name.

Tiny config: 2 layers per stack, H_cycles 2, L_cycles 2 (12 invocations: L L H
L L H, each of 2 layers), 4 heads of 16, ``embedding_scale`` 4 (HF's default
``1 / 0.02 = 50`` would drown ``z_L`` in ``z_H``; ``--set embedding_scale=...``).
"""

from __future__ import annotations

import re

from contract.layers import LayerConfig, NormSpec

from .._gguf_export import tensor_name_map
from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike, LcPoint, text_model_gguf_params
from ...errors import UsageError

# the vendored gguf-py's MODEL_TENSORS[HRM_TEXT] (constants.py), less HRM_Z_L_INIT
_TENSORS = ("TOKEN_EMBD", "OUTPUT", "ATTN_Q", "ATTN_K", "ATTN_V", "ATTN_GATE", "ATTN_OUT", "FFN_GATE",
            "FFN_DOWN", "FFN_UP")
_STACK = re.compile(r"model\.([LH])_module\.layers\.(\d+)\.(.+)")


class HrmText(LlamaLike):
    name = "hrm_text"
    hf_model_type = "hrm_text"
    description = ("L and H stacks re-run in cycles (one cache slot per invocation), weightless RMS norms, "
                   "sigmoid output gate, MHA")
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, H_cycles=2, L_cycles=2,
        embedding_scale=4.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "hrm_text"
    extra_settable = ("head_dim", "H_cycles", "L_cycles", "embedding_scale", "prefix_lm")
    # The fuzzer's space (harness/fuzz.py), each knob a key hrm-text.cpp reads:
    # - heads: attention.head_count (MHA: the converter writes no head_count_kv, llama.cpp
    #   takes head_count; HF's num_key_value_groups is 1); head_dim: attention.key_length,
    #   rope.dimension_count; theta: rope.freq_base (build_stack's ggml_rope_ext);
    # - values: the stack shape -- layers per stack (num_hidden_layers before __post_init__
    #   expands it), hrm.h_cycles, hrm.l_cycles, each from 1 (load_arch_hparams asserts > 0;
    #   the block count, the slot count n * H * (L + 1), follows from them) -- so the
    #   invocation order (invocation_order, llama.cpp's slot_base and aliasing) is judged
    #   over 2 to 36 invocations; and embedding_scale (LLM_KV_EMBEDDING_SCALE, build_inp_embd):
    #   1 (no scaling), the tiny's 4, and 50, HF's default 1 / initializer_range;
    # - bias: attention_bias biases gate_proj and o_proj too (modeling_hrm_text.py:165-184) and
    #   hrm-text.cpp loads no attn_gate / attn_output bias (reference_refusal): HF alone.
    # prefix_lm is not drawn: without token_type_ids HF is causal either way (test_hrm_text.py).
    fuzz_space = {"knobs": ("heads", "head_dim", "theta", "values", "bias"), "hf_only": ("bias",),
                  "values": {"num_hidden_layers": (1, 2, 3), "H_cycles": (1, 2, 3), "L_cycles": (1, 2, 3),
                             "embedding_scale": (4.0, 1.0, 50.0)}}

    # HrmTextRMSNorm: no weight (impl "l2": rms without a weight)
    input_norm_kind = "l2"
    # HrmTextAttention: gate_proj (and q/k/v/o_proj) biased when config.attention_bias
    weight_map = {**LlamaLike.weight_map, "self_attn.gate_proj.weight": "wg", "self_attn.gate_proj.bias": "bg"}

    hf_model_points = {"embeddings": ("model.embed_tokens", "out"),
                       # the H stack's final_norm, last called by the last H cycle: what lm_head reads
                       "final_norm": ("model.H_module.final_norm", "out")}
    lc_points = {
        **LlamaLike.lc_points,
        # hrm-text.cpp build_stack: build_attn without wo, renamed attn_pregate (the heads);
        # the gated heads attn_gated; wo's product attn_out; the residual sum attn_add
        "attn_heads": LcPoint("attn_pregate"),
        "attn_branch": LcPoint("attn_gated"),
        "attn_out": LcPoint("attn_out"),
        "resid_mid": LcPoint("attn_add"),
    }
    lc_not_exposed = {"layer_in": "hrm-text.cpp hands the first L invocation embd + hrm.z_l_init, a weight, in "
                                  "an unnamed ggml_add(zH, zL); the other stack inputs are derived from the "
                                  "named zH and zL (lc_input_sum)"}
    # `embd` is the scaled embedding (build_inp_embd), HF's embed_tokens output is not
    lc_model_points = {k: v for k, v in LlamaLike.lc_model_points.items() if k != "embeddings"}

    # ------------------------------------------------------------------ invocations
    def decoder_layers(self, model):
        # the physical modules: the L stack's, then the H stack's (the GGUF's blocks)
        return list(model.model.L_module.layers) + list(model.model.H_module.layers)

    def module_path(self, config, m: int) -> str:
        n = config.num_layers_per_stack
        return f"model.L_module.layers.{m}" if m < n else f"model.H_module.layers.{m - n}"

    def invocation_order(self, config) -> list[int]:
        # HrmTextModel.forward's slot layout (its comment, "Cache-slot layout"):
        # slot (h (L + 1) + l) n + il runs L module il for l < L, H module il for l = L
        n, big_l = config.num_layers_per_stack, config.L_cycles
        return [il if l < big_l else n + il
                for _h in range(config.H_cycles) for l in range(big_l + 1) for il in range(n)]

    def lc_layer_input(self, config, i: int):
        # hrm-text.cpp graph(): build_stack(..., ggml_add(ctx0, zH, zL), slot_base) -- the stack's
        # input carries no name; inside a stack layer i reads l_out of slot i - 1
        if i % config.num_layers_per_stack == 0:
            return None
        return super().lc_layer_input(config, i)

    def lc_input_sum(self, config, i: int):
        # hrm-text.cpp graph(): an L invocation reads ggml_add(zH, zL), an H one ggml_add(zH, zL)
        # after the L cycles; zH is `embd` before the first H invocation, then the last H
        # invocation's `stack_norm` (cb'd under its first slot), zL the last L invocation's.
        # The very first L invocation adds the z_l_init WEIGHT (no graph tensor): not derived.
        n, big_l = config.num_layers_per_stack, config.L_cycles
        if i % n:
            return None
        k = i // n  # the stack invocation: h (L + 1) + l
        h, l = divmod(k, big_l + 1)
        z_h = "embd" if h == 0 else f"stack_norm-{((h - 1) * (big_l + 1) + big_l) * n}"
        last_l = k - 1 if l > 0 else k - 2  # the previous L invocation (past the previous H one)
        if last_l < 0:
            return None
        return (LcPoint(z_h), LcPoint(f"stack_norm-{last_l * n}"))

    def lc_refusal(self, config) -> str | None:
        if config.attention_bias:
            # hrm-text.cpp load_arch_tensors: wqkv_gate and wo without bias tensors
            return ("attention_bias=true: HF biases gate_proj and o_proj too, and hrm-text.cpp loads no "
                    "attn_gate / attn_output bias; run it against --ref hf")
        return super().lc_refusal(config)

    # ------------------------------------------------------------------ impl
    def layer_config(self, config, i: int) -> LayerConfig:
        hd = self.head_dim(config)
        return LayerConfig(
            hidden_size=config.hidden_size,
            # HrmTextAttention: num_key_value_groups = 1, k/v_proj num_attention_heads wide
            n_heads=config.num_attention_heads, n_kv_heads=config.num_attention_heads, head_dim=hd,
            input_norm=NormSpec(self.input_norm_kind, config.rms_norm_eps),
            rope=self.rope(config, i, hd),
            # HrmTextAttention.forward: sigmoid(gate_proj(hidden_states)) * attn_output, before o_proj
            output_gate=True,
        )

    # ------------------------------------------------------------------ GGUF
    def gguf_tensor_map(self, config):
        tmap = tensor_name_map(_TENSORS, 2 * config.num_layers_per_stack)
        # gguf-py constants.py MODEL_TENSOR.HRM_Z_L_INIT: "hrm.z_l_init" (0.19 has no such tensor)
        tmap.mapping["model.z_L_init"] = (None, "hrm.z_l_init")
        return tmap

    def gguf_params(self, w, config, variant=None):
        # conversion/hrm_text.py HrmTextModel.set_gguf_parameters: TextModel's keys (block_count
        # the expanded slot count: config.num_hidden_layers is it), then its own, by name
        text_model_gguf_params(w, config)
        w.add_rope_dimension_count(self.head_dim(config))
        w.add_embedding_scale(float(config.embedding_scale))
        arch = self.gguf_arch
        w.add_uint32(f"{arch}.hrm.layers_per_stack", int(config.num_layers_per_stack))
        w.add_uint32(f"{arch}.hrm.h_cycles", int(config.H_cycles))
        w.add_uint32(f"{arch}.hrm.l_cycles", int(config.L_cycles))
        w.add_bool(f"{arch}.hrm.prefix_lm", bool(config.prefix_lm))

    def gguf_convert(self, name, data, config, variant=None):
        # HrmTextModel.modify_tensors: the L stack's layer i is blk.i, the H stack's blk.(n + i)
        m = _STACK.fullmatch(name)
        if m is None:
            yield name, data
            return
        stack, i, rest = m.groups()
        bid = int(i) + (config.num_layers_per_stack if stack == "H" else 0)
        yield f"model.layers.{bid}.{rest}", data

    def config_from_gguf(self, meta, shapes, tensors):
        """hrm-text.cpp load_arch_hparams: the RMS eps, ``embedding_scale`` (absent: no
        scaling, HF 1.0), ``hrm.layers_per_stack`` / ``h_cycles`` / ``l_cycles`` (the
        block count must be the expanded slot count: GGML_ASSERT there, a refusal
        here), ``hrm.prefix_lm`` (read and not used: causal only). HF's attention is
        MHA (``num_key_value_groups = 1``): a file with fewer KV heads is refused."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp)
        n, big_h, big_l = (int(meta.get(f"hrm.{k}")) for k in ("layers_per_stack", "h_cycles", "l_cycles"))
        if hp.n_layer != n * big_h * (big_l + 1):
            meta.refuse("block_count", hp.n_layer, f"hrm-text.cpp asserts n_layer == layers_per_stack x h_cycles x "
                                                   f"(l_cycles + 1) = {n * big_h * (big_l + 1)}")
        if kw.pop("num_key_value_heads") != kw["num_attention_heads"]:
            meta.refuse("attention.head_count_kv", hp.head_kv, "HF HrmTextAttention is MHA (num_key_value_groups = 1)")
        kw.update(num_hidden_layers=n, H_cycles=big_h, L_cycles=big_l,
                  rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"),
                  embedding_scale=meta.get_f32("embedding_scale", 0.0) or 1.0,
                  prefix_lm=bool(meta.get("hrm.prefix_lm", False)))
        return kw

    def gguf_import_prepare(self, tensors, config):
        # llama-model.cpp's generic pass loads an optional X.scale for EVERY slot (n_layer_all),
        # after hrm-text.cpp's load_arch_tensors aliased the slots' weights (the copied layer
        # has no wq_s yet): a scale under an aliased slot scales that invocation alone, which
        # HF's shared modules cannot hold
        first = 2 * config.num_layers_per_stack
        alias = sorted(k for k in tensors if k.startswith("blk.") and k.endswith(".scale")
                       and int(k.split(".")[1]) >= first)
        if alias:
            raise UsageError(f"--gguf: {alias[0]}: a weight scale on an aliased cache slot (llama-model.cpp's "
                             f"generic .scale pass loads one per slot): HF HrmText's invocations share one "
                             f"weight; valid: scales on blk.0-{first - 1} only")
        return super().gguf_import_prepare(tensors, config)


FAMILY = HrmText()
