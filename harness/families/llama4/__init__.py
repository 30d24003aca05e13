"""llama4 (text): chunked attention, NoPE layers with attention temperature,
and an L2 QK norm AFTER RoPE (HF ``Llama4ForCausalLM``, model type
``llama4_text``; llama.cpp ``src/models/llama4.cpp``).

What a layer computes (HF ``Llama4TextAttention.forward``):

- RoPE layers (``config.no_rope_layers[i] == 1`` -- the name is inverted, 1
  means "uses RoPE"): interleaved-pair RoPE (``apply_rotary_emb`` views
  adjacent channels as one complex number), then ``Llama4TextL2Norm`` (a
  weightless RMS norm over head_dim) on Q and K when ``use_qk_norm``; the
  mask is chunked (``layer_types[i] == "chunked_attention"``,
  ``create_chunked_causal_mask``: a query reads keys of its own chunk of
  ``attention_chunk_size``).
- NoPE layers (every ``no_rope_layer_interval``-th): no rotation, no QK norm,
  full causal mask, and attention temperature on Q when
  ``attn_temperature_tuning``: ``q *= log1p(floor((pos + 1) / floor_scale)) *
  attn_scale + 1``.

HF takes the chunk index and the temperature position from the SEQUENCE /
CACHE INDEX (``chunked_overlay`` on ``kv_idx`` / ``q_idx``; ``torch.arange(S)
+ past_seen_tokens``), llama.cpp from the token POSITION (``is_masked_swa`` on
``p0`` / ``p1``; ``llm_graph_input_attn_temp::set_input`` on
``ubatch->pos``), impl from the position. In our runs positions start at 0
and count up with the index, so all three coincide; they would part for a
sequence whose positions do not start at 0.

llama.cpp hard-codes what HF reads from the config (``llama4.cpp``
``load_arch_hparams``): chunk size 8192, temperature floor 8192 and scale
0.1, a NoPE layer every 4th layer (``n_no_rope_layer_step`` is never read),
and the QK norm unless the model has 128 experts. The default tiny config
therefore uses exactly those values, so both references agree -- which leaves
the chunk window and the temperature INERT at 16 tokens (a chunk of 8192
never ends, and the temperature is exactly 1 below position 8191). They are
exercised against HF by two HF-only configs (see harness/families/llama4/test_llama4.py
and the llama4 ``[[finding]]`` entries in fixtures/tolerance.toml):

- chunked windows:  ``--set attention_chunk_size=6``
- temperature:      ``--set floor_scale=2 --set attn_scale=0.5``

(and ``--set no_rope_layer_interval=2`` documents that llama.cpp's NoPE step
stays 4). Other HF settings llama.cpp cannot carry and no finding covers:
``use_qk_norm=false`` (llama.cpp norms unless 128 experts), ``attention_bias``
(llama.cpp creates no ``attn_output.bias``: the load fails).

The converter (``conversion/llama.py`` ``Llama4Model``) writes none of these
hyper-parameters, and applies no Q/K permutation (``undo_permute = False``:
HF's complex layout already is ggml's NORM rope layout).
"""

from __future__ import annotations

import numpy as np

from contract.layers import LayerConfig, NormSpec, QkNormSpec, TemperatureSpec, WindowSpec

from .._gguf_import import experts, llama_like_config, one_per_layer, one_theta, read_hparams, swa_pattern
from ..base import LcPoint, LlamaLike

# llama.cpp's llama4 constants (src/models/llama4.cpp load_arch_hparams; llama-hparams.h
# n_no_rope_layer_step default 4).
LC_CHUNK, LC_TEMP_FLOOR, LC_TEMP_SCALE, LC_NOPE_STEP = 8192, 8192, 0.1, 4


class _MlpAsFfn:
    """The converter's own hparams swap (``Llama4Model.__init__``): llama.cpp's
    ``feed_forward_length`` is HF's ``intermediate_size_mlp`` (dense layers),
    HF's ``intermediate_size`` becomes ``expert_feed_forward_length``."""

    def __init__(self, config):
        self._c = config

    def __getattr__(self, key):
        return self._c.intermediate_size_mlp if key == "intermediate_size" else getattr(self._c, key)


class Llama4(LlamaLike):
    name = "llama4"
    # llama4.cpp hard-codes the chunk size (n_swa = 8192, no GGUF key): a chunk size HF honours is HF-only
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "head_dim", "chunk", "nope_interval"), "hf_only": ("chunk", "nope_interval")}
    hf_model_type = "llama4_text"
    description = "chunked windows, NoPE layers with temperature, L2 QK norm after RoPE, MoE"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, intermediate_size_mlp=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        # one MoE layer (llama.cpp refuses zero experts: "model cannot have zero experts")
        num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=4,
        # = llama.cpp's hard-coded values (module docstring)
        no_rope_layer_interval=LC_NOPE_STEP, attention_chunk_size=LC_CHUNK,
        attn_temperature_tuning=True, floor_scale=LC_TEMP_FLOOR, attn_scale=LC_TEMP_SCALE,
        use_qk_norm=True, rms_norm_eps=1e-5, max_position_embeddings=16384,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "llama4"
    converter_rope_freqs = True  # conversion/llama.py Llama4Model(LlamaModel); llama4.cpp reads it
    extra_settable = ()

    def init_value(self, name, p, r):
        if p.ndim == 3:
            # experts.gate_up_proj (E, H, 2I) and experts.down_proj (E, I, H) are
            # x @ W: the fan-in is the middle axis.
            return r / np.sqrt(p.shape[-2])
        return super().init_value(name, p, r)

    # HF Llama4TextAttention.__init__ / forward (the input norm: Llama4TextRMSNorm).
    # apply_rotary_emb: view_as_complex over adjacent pairs = the interleaved layout
    rope_layout = "interleaved"

    def uses_rope(self, config, i: int) -> bool:
        return bool(config.no_rope_layers[i])  # the name is inverted: 1 means "uses RoPE"

    def window(self, config, i: int):
        if config.layer_types[i] == "chunked_attention":
            # HF create_chunked_causal_mask (masking_utils.chunked_overlay)
            return WindowSpec("chunked", int(config.attention_chunk_size))
        return None

    def layer_config(self, config, i: int) -> LayerConfig:
        eps = config.rms_norm_eps
        use_rope = self.uses_rope(config, i)
        return super().layer_config(config, i).replace(
            # Llama4TextL2Norm(rms_norm_eps), created only `if use_qk_norm and use_rope`,
            # applied after RoPE on q and k per head
            qk_norm=QkNormSpec(NormSpec("l2", eps), over="head", where="post_rope")
            if config.use_qk_norm and use_rope else None,
            # `if self.attn_temperature_tuning and not self.use_rope`
            temperature=TemperatureSpec(float(config.floor_scale), float(config.attn_scale))
            if config.attn_temperature_tuning and not use_rope else None,
        )

    def feature_switches(self, config, features: set[str]) -> dict[str, dict]:
        # settings HF itself honours (Llama4TextConfig.__post_init__ / Llama4TextAttention)
        sw = super().feature_switches(config, features)
        if "chunked_window" in features:
            sw["chunked_window"] = {"attention_chunk_size": None}  # layer_types: all full_attention
        if "temperature" in features:
            sw["temperature"] = {"attn_temperature_tuning": False}
        if "qk_norm_post_rope" in features:
            sw["qk_norm_post_rope"] = {"use_qk_norm": False}
        if "nope_layers" in features:
            sw["nope_layers"] = {"no_rope_layers": [1] * config.num_hidden_layers}
        return sw

    # ------------------------------------------------------------------ llama.cpp
    def lc_points_for(self, config, i: int):
        # llama4.cpp: use_rope = (il + 1) % n_no_rope_layer_step != 0 with the step fixed
        # at 4 -- llama.cpp's own layer kinds, whatever the HF config says.
        pts = dict(self.lc_points)
        if (i + 1) % LC_NOPE_STEP != 0:
            # Qcur: MUL_MAT, RESHAPE, ROPE; then Qcur_normed = ggml_rms_norm (the L2 norm),
            # which is what enters the score product (use_kq_norm: n_expert != 128)
            normed = int(config.num_local_experts) != 128
            pts["q_rope"] = LcPoint("Qcur_normed" if normed else "Qcur", "last" if normed else "rope", "heads")
            pts["k_rope"] = LcPoint("Kcur_normed" if normed else "Kcur", "last" if normed else "rope", "heads")
        else:
            # NoPE layer: Qcur MUL_MAT, RESHAPE, then MUL by inp_attn_scale (temperature)
            pts["q"] = LcPoint("Qcur", "op:RESHAPE", "heads")
            pts["k"] = LcPoint("Kcur", "op:RESHAPE", "heads")
            pts["q_rope"] = LcPoint("Qcur", "op:MUL", "heads")
            pts["k_rope"] = LcPoint("Kcur", "op:RESHAPE", "heads")
        return pts

    def lc_refusal(self, config) -> str | None:
        # llama4.cpp:121 builds the temperature input (build_inp_attn_scale) for every graph and
        # multiplies it into the NoPE layers' queries only (the else of use_rope, lines 143-167);
        # a chunked model with fewer layers than the NoPE step has none, so the input is never
        # allocated and llm_graph_input_attn_temp::set_input aborts on it (llama-graph.cpp:172,
        # ggml-backend.cpp:338 GGML_ASSERT(buf != NULL && "tensor buffer not set"))
        chunked = not all(t == "full_attention" for t in config.layer_types)
        if chunked and config.num_hidden_layers < LC_NOPE_STEP:
            return (f"num_hidden_layers={config.num_hidden_layers} < {LC_NOPE_STEP}: llama.cpp's llama4 then has no "
                    "NoPE layer, and its unused temperature input aborts the run (llama4.cpp:121, llama-graph.cpp:172 "
                    f"GGML_ASSERT 'tensor buffer not set'); valid: at least {LC_NOPE_STEP} layers, or run it against "
                    "--ref hf")
        return super().lc_refusal(config)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/base.py TextModel + conversion/llama.py LlamaModel, on the
        # converter's swapped hparams, then Llama4Model.set_gguf_parameters
        super().gguf_params(w, _MlpAsFfn(config), variant)
        w.add_expert_count(config.num_local_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_interleave_moe_layer_step(config.interleave_moe_layer_step)
        w.add_expert_feed_forward_length(config.intermediate_size)
        if all(t == "full_attention" for t in config.layer_types):
            w.add_sliding_window(0)  # "all layers are full attention (for MobileLLM), disable swa"

    def gguf_convert(self, name, data, config, variant=None):
        if name.endswith("experts.gate_up_proj"):
            # Llama4Model.modify_tensors: transpose(-1, -2), split in half along -2,
            # gate first
            t = np.swapaxes(data, -1, -2)
            half = t.shape[-2] // 2
            pieces = [(name.replace("gate_up_proj", "gate_proj.weight"), t[..., :half, :]),
                      (name.replace("gate_up_proj", "up_proj.weight"), t[..., half:, :])]
        elif name.endswith("experts.down_proj"):
            pieces = [(name + ".weight", np.swapaxes(data, -1, -2))]  # down_proj: transpose(-1, -2)
        else:
            pieces = [(name, data)]
        for n, d in pieces:
            yield n, np.ascontiguousarray(d)


    def config_from_gguf(self, meta, shapes, tensors):
        """llama4.cpp load_arch_hparams: the RMS eps, the experts' width, the MoE
        step; then a window key of 0 turns chunking, the temperature and NoPE off
        (``n_no_rope_layer_step = n_layer``), any other value (or none) fixes
        chunk 8192, temperature floor 8192 / scale 0.1, ``load_swa_pattern(ml, 4)``
        and ``rope.freq_base_swa``; the QK norm is on unless 128 experts. HF
        chunks exactly its RoPE layers (``layer_types`` from ``no_rope_layers``):
        a chunk pattern other than the NoPE step's is refused."""
        hp = read_hparams(meta)
        n_swa = meta.get("attention.sliding_window", None)
        if n_swa is not None and int(n_swa) == 0:
            chunked, step, chunk = [False] * hp.n_layer, hp.n_layer, None
            for key in ("attention.sliding_window_pattern", "rope.freq_base_swa"):
                meta.skip(key, "llama4.cpp reads it only when attention.sliding_window != 0")
        else:
            chunked, step, chunk = swa_pattern(meta, hp, 4), LC_NOPE_STEP, LC_CHUNK
            one_theta(meta, hp, chunked)
            if chunked != [(il + 1) % step != 0 for il in range(hp.n_layer)]:
                meta.refuse("attention.sliding_window_pattern", chunked, "HF Llama4 chunks exactly its RoPE layers "
                            f"(llama.cpp's NoPE step is {step})")
        kw = llama_like_config(self, meta, shapes, hp, swa=any(chunked), moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_local_experts=n_exp,
                  num_experts_per_tok=n_used,
                  intermediate_size=one_per_layer(meta, "expert_feed_forward_length", hp.n_layer),
                  intermediate_size_mlp=hp.ff, interleave_moe_layer_step=int(meta.get("interleave_moe_layer_step")),
                  no_rope_layer_interval=step, attention_chunk_size=chunk, attn_temperature_tuning=chunk is not None,
                  floor_scale=LC_TEMP_FLOOR, attn_scale=LC_TEMP_SCALE, use_qk_norm=n_exp != 128)
        return kw


FAMILY = Llama4()
