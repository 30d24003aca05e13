"""nemotron_h: a hybrid stack of Mamba-2, attention and MLP-only layers (HF
``NemotronHForCausalLM``, modeling_nemotron_h.py; llama.cpp arch ``nemotron_h``,
src/models/nemotron-h.cpp; converter conversion/nemotron.py ``NemotronHModel`` over
conversion/granite.py ``GraniteHybridModel``).

Every layer is ``NemotronHBlock``: ``norm`` (RMS) -> ONE mixer -> + residual, the mixer
chosen per layer by ``layers_block_type`` (the checkpoints' ``hybrid_override_pattern``
``M`` / ``*`` / ``-``):
- ``linear_attention``: ``NemotronHMamba2Mixer``, the Mamba-2 mixer of mamba2's family
  (``harness/families/_mamba2.py``; its chunked scan clamps dt at
  ``(time_step_min, inf)``, the cached one-row update clamps nothing -- see findings);
- ``full_attention``: ``NemotronHAttention``, plain GQA without RoPE (no position
  embedding is ever applied; scale ``head_dim ** -0.5``), no biases;
- ``mlp``: ``NemotronHMLP`` (up -> relu2 -> down): a layer whose attention half is
  ABSENT (impl ``LayerConfig(shape="absent")``: the residual passes through to the
  FFN half, which only the reference-vs-reference rows see). ``moe`` layers are the
  ``nemotron_h_moe`` arch's and are refused here.

llama.cpp (nemotron-h.cpp ``graph``): ``attn_norm`` on every layer, then
``build_mamba2_layer`` (``mamba2_y_add_d``, ``mamba_out``), ``build_attention_layer``
(build_qkv's ``Qcur`` / ``Kcur`` / ``Vcur``, ``kq_soft_max``, ``kqv_out``, then its own
``attn_out``) or ``build_ffn_layer`` (relu2 ``ffn_out`` -- also named ``l_out`` there,
BEFORE the residual), and the residual add ``nemotron_h_block_out``, which is every
layer's output. The loader tells the kinds apart by the per-layer arrays the converter
writes (``load_arch_hparams``: recurrent iff ``n_head_kv(i) == 0 && n_ff(i) == 0``;
attention iff ``n_ff(i) == 0``): ``attention.head_count_kv`` is ``num_key_value_heads``
on attention layers and 0 elsewhere (GraniteHybridModel.set_gguf_parameters),
``feed_forward_length`` is ``intermediate_size`` on MLP layers and 0 elsewhere
(NemotronHModel.set_gguf_parameters). The attention layers' Q/K rows are permuted per
head as llama's (GraniteHybridModel -> GraniteMoeModel -> LlamaModel.modify_tensors,
``undo_permute = True``): without RoPE the scores do not change, but the capture
undoes it on Q and K.

Converter note (conversion/nemotron.py ``NemotronHModel.__init__``): with a list
pattern (HF 5's config saves ``layers_block_type``, not the string) its
``_MLP_LAYER_TYPES = {"moe"}`` misses the non-MoE ``"mlp"`` layers, so their
``feed_forward_length`` is written 0 and llama.cpp's loader takes them for recurrent
layers (no ``ssm_in``: the file is refused). The published checkpoints carry the string
``hybrid_override_pattern``, whose ``"-"`` the converter reads right; the export here
writes what that string path writes.

Tiny config: 4 layers ``[M, *, -, M]``, hidden 64, Mamba-2 8 heads of 16 over 2 groups,
state 16, conv 4, HF's chunk 128 (the model's own: the breadth matrix's
``nemotron-h-long`` group runs past it), attention 4 heads / 2 KV heads of 16, MLP 96.
"""

from __future__ import annotations

from contract.recurrent import RecurrentConfig
from contract.layers import LayerConfig, NormSpec

from ...errors import UsageError
from .._gguf_export import NegExpALog
from .._lc_capture import lc_nope_points
from .._mamba2 import HF_BLOCK_POINTS, Mamba2Mixer, Mamba2Sizes
from .._recurrent import RecurrentProbes
from ..base import LcPoint, Point, tensor
from ..llama import PermutedQK
from .._gguf_import import read_hparams, refuse_experts, special_tokens, vocab_of

# NemotronHConfig.validate_layer_type's kinds: the ones this arch's graph builds
LAYER_TYPES = ("linear_attention", "full_attention", "mlp")
# the residual add every layer ends in (nemotron-h.cpp graph: `cb(cur, "nemotron_h_block_out", il)`)
BLOCK_OUT = LcPoint("nemotron_h_block_out")


class NemotronH(Mamba2Mixer, RecurrentProbes, NegExpALog, PermutedQK):
    name = "nemotron_h"
    # the fuzz: the generic heads knob, then the norm eps, layer count and context length
    # every family gets (harness/fuzz.py case_strategy)
    fuzz_space = {"knobs": ("heads",)}
    hf_model_type = "nemotron_h"
    description = "hybrid: Mamba-2, RoPE-free GQA and MLP-only layers by pattern (one mixer per block)"
    tiny = dict(
        vocab_size=128, hidden_size=64, layers_block_type=["linear_attention", "full_attention", "mlp",
                                                           "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
        mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, use_conv_bias=True,
        use_bias=False, chunk_size=128, layer_norm_epsilon=1e-5, max_position_embeddings=256,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "nemotron_h"
    converter_rope_freqs = False  # no RoPE: LlamaModel.generate_extra_tensors writes nothing
    # the layer count is len(layers_block_type) (NemotronHConfig.num_hidden_layers is a property)
    size_keys = {"hidden": "hidden_size", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
                 "head_dim": "head_dim"}
    layers_path = "model.layers"
    hf_model_points = {"embeddings": ("model.embeddings", "out"), "final_norm": ("model.norm_f", "out")}

    # the Mamba-2 mixer, and its gated norm (NemotronHRMSNormGated.forward(hidden_states, gate))
    hf_rec_module = "mixer"
    hf_rec_gate_norm = "norm"

    # NemotronHBlock.forward: norm -> mixer -> residual + mixer out (one residual, no FFN
    # half: the block's output is the residual after the branch)
    _hf_mamba_points = HF_BLOCK_POINTS
    hf_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("mixer", "in"),
        "q": Point("mixer.q_proj", "out"),
        "k": Point("mixer.k_proj", "out"),
        "v": Point("mixer.v_proj", "out"),
        "attn_branch": Point("mixer.o_proj", "in"),
        "attn_out": Point("mixer", "out"),
        "resid_mid": Point("", "out"),
        "layer_out": Point("", "out"),
    }
    # an MLP layer: no attention, so the residual after the (absent) attention half is the
    # block's input; the block's output adds the MLP's
    _hf_mlp_points = {"layer_in": Point("", "in"), "resid_mid": Point("", "in"), "layer_out": Point("", "out")}

    _lc_mamba_points = {
        "attn_in": LcPoint("attn_norm"),
        "rec_out": LcPoint("mamba2_y_add_d", "last", "heads"),
        "attn_out": LcPoint("mamba_out"),
        "resid_mid": BLOCK_OUT,
        "layer_out": BLOCK_OUT,
    }
    # build_attention_layer: no ROPE node, so q_rope / k_rope are the Qcur / Kcur that enter kq
    lc_points = lc_nope_points(resid_mid=BLOCK_OUT, layer_out=BLOCK_OUT)
    # build_ffn_layer's input is attn_norm and the residual is the block's input (the
    # capture's layer_in: resid_mid of an absent layer is read there)
    _lc_mlp_points = {"layer_out": BLOCK_OUT}
    lc_not_exposed = {p: "mamba-base.cpp build_mamba2_layer names no tensor inside the layer but mamba2_y_add_d and "
                         "mamba_out (the in-projection, conv, x / B / C, dt and the gated norm are unnamed views and "
                         "ops); the conv and SSM states are read from llama_state_seq_get_data instead"
                      for p in ("rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay",
                                "attn_branch")}

    def _layer_type(self, config, i: int) -> str:
        return config.layers_block_type[i]

    def is_recurrent(self, config, i: int) -> bool:
        return self._layer_type(config, i) == "linear_attention"

    def norm_eps(self, config) -> float:
        return float(config.layer_norm_epsilon)

    def uses_rope(self, config, i: int) -> bool:
        return False  # NemotronHAttention.forward applies no position embedding

    def mamba2_sizes(self, config) -> Mamba2Sizes:
        """NemotronHMamba2Mixer.__init__: ``mamba_num_heads`` of ``mamba_head_dim``, and
        ``time_step_limit = (config.time_step_min, inf)`` -- the config's own
        ``time_step_limit`` is never read."""
        return Mamba2Sizes(
            heads=config.mamba_num_heads, head_dim=config.mamba_head_dim, groups=config.n_groups,
            state=config.ssm_state_size, conv=config.conv_kernel, conv_bias=bool(config.use_conv_bias),
            proj_bias=bool(config.use_bias), eps=float(config.layer_norm_epsilon), chunk=int(config.chunk_size),
            limit=(float(config.time_step_min), float("inf")))

    def validate(self, kw: dict) -> None:
        super().validate(kw)
        g = {**self.tiny, **kw}
        types = g.get("layers_block_type")
        if not isinstance(types, list) or not types or any(t not in LAYER_TYPES for t in types):
            raise UsageError(f"layers_block_type={types!r}: valid: a non-empty list of {', '.join(LAYER_TYPES)} (the "
                             f"'moe' layers are the nemotron_h_moe arch's, not compared here)")
        if all(t == "mlp" for t in types):
            # no layer with a cache: HF's DynamicCache.get_seq_length raises ("can only be called on
            # Attention layers"), llama.cpp's memory allocates no buffer (ggml-backend.cpp:205
            # GGML_ASSERT(buffer)) -- neither reference computes it
            raise UsageError(f"layers_block_type={types!r}: MLP layers only; valid: at least one "
                             f"linear_attention or full_attention layer (neither reference runs a stack without one)")
        self.mamba2_validate({k: g.get(k) for k in ("mamba_num_heads", "n_groups", "mamba_head_dim",
                                                    "ssm_state_size", "conv_kernel", "chunk_size")},
                             "mamba_num_heads", "n_groups")

    def lc_refusal(self, config) -> str | None:
        return self.mamba2_refusal(config)

    def layer_config(self, config, i: int):
        t = self._layer_type(config, i)
        if t == "linear_attention":
            # NemotronHBlock.norm: NemotronHRMSNorm(hidden_size, eps=layer_norm_epsilon)
            return self.mamba2_config(config, NormSpec("rms", self.norm_eps(config)))
        if t == "mlp":
            return LayerConfig(hidden_size=config.hidden_size, shape="absent")
        return super().layer_config(config, i)

    weight_map = {"norm.weight": "attn_norm", "mixer.q_proj.weight": "wq", "mixer.k_proj.weight": "wk",
                  "mixer.v_proj.weight": "wv", "mixer.o_proj.weight": "wo"}

    def layer_weights(self, model, config, i: int) -> dict:
        t = self._layer_type(config, i)
        if t == "mlp":
            return {}
        if t == "linear_attention":
            layer = self.decoder_layers(model)[i]
            return {"attn_norm": tensor(layer, "norm.weight"), **self.mamba2_weights(layer, config)}
        return super().layer_weights(model, config, i)

    # ------------------------------------------------------------------ probes
    def hf_points_for(self, config, i: int):
        t = self._layer_type(config, i)
        return {"linear_attention": self._hf_mamba_points, "mlp": self._hf_mlp_points}.get(t, self.hf_points)

    def lc_points_for(self, config, i: int):
        t = self._layer_type(config, i)
        return {"linear_attention": self._lc_mamba_points, "mlp": self._lc_mlp_points}.get(t, self.lc_points)

    def lc_layer_input(self, config, i: int):
        if i == 0:
            return "embeddings", self.lc_model_points["embeddings"]
        return f"L{i - 1}.layer_out", BLOCK_OUT

    def lc_canonical(self, probe, arr, lc, config):
        if isinstance(lc, RecurrentConfig):
            return self.lc_recurrent_canonical(probe, arr, lc, config)
        return super().lc_canonical(probe, arr, lc, config)  # PermutedQK: Q / K unpermuted

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """What GraniteHybridModel.set_gguf_parameters (GraniteMoeModel's -> LlamaModel's
        -> TextModel's, then the Mamba-2 keys and the per-layer head_count_kv) and
        NemotronHModel.set_gguf_parameters (key / value length, the per-layer
        feed_forward_length) write for a non-MoE NemotronH checkpoint: no RoPE
        (``use_rope`` is Bamba's), so ``rope.scaling.finetuned = false`` and the
        context length 2**20; TextModel's ``layer_norm_epsilon`` -> ``layer_norm_eps``
        (llama.cpp reads the RMS eps from it when ``layer_norm_rms_epsilon`` is absent)."""
        if config.use_bias:
            raise ValueError("nemotron_h export: use_bias=true is not exported (build_mamba2_layer loads no "
                             "ssm_in / ssm_out bias); valid: false")
        types = config.layers_block_type
        s = self.mamba2_sizes(config)
        w.add_block_count(len(types))
        w.add_context_length(2 ** 20)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length([config.intermediate_size if t == "mlp" else 0 for t in types])
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv([config.num_key_value_heads if t == "full_attention" else 0 for t in types])
        w.add_layer_norm_eps(config.layer_norm_epsilon)
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
        w.add_vocab_size(config.vocab_size)
        w.add_rope_dimension_count(config.head_dim)
        w.add_ssm_conv_kernel(s.conv)
        w.add_ssm_state_size(s.state)
        w.add_ssm_group_count(s.groups)
        w.add_ssm_inner_size(s.inner)
        w.add_ssm_time_step_rank(s.heads)
        w.add_rope_scaling_finetuned(False)

    def config_from_gguf(self, meta, shapes, tensors):
        """nemotron-h.cpp load_arch_hparams: the Mamba-2 keys (``ssm.inner_size`` =
        heads x head_dim, ``ssm.time_step_rank`` = heads), the layer kinds from the
        per-layer arrays (recurrent iff ``n_head_kv == 0 && n_ff == 0``, attention iff
        ``n_ff == 0``, else MLP), ``layer_norm_epsilon`` (the RMS eps falls back to it).
        HF holds one head count, one KV head count and one MLP width for all layers."""

        hp = read_hparams(meta)
        refuse_experts(meta, hp, self.name)
        for key in ("expert_feed_forward_length", "expert_shared_feed_forward_length", "expert_shared_count",
                    "expert_weights_norm", "expert_weights_scale", "moe_latent_size"):
            # load_arch_hparams reads them for every file; only an MoE layer's tensors use them
            meta.skip(key, "no experts (expert_count 0): build_ffn_layer builds the dense MLP, which reads none")
        vocab = vocab_of(meta, shapes)
        types = ["linear_attention" if kv == 0 and ff == 0 else "full_attention" if ff == 0 else "mlp"
                 for kv, ff in zip(hp.n_head_kv, hp.n_ff)]

        def one(field, key, kind, default):
            vals = {v for v, t in zip(getattr(hp, field), types) if t == kind}
            if len(vals) > 1:
                meta.refuse(key, getattr(hp, field), f"per-layer values on the {kind} layers; HF holds one")
            return vals.pop() if vals else default

        inner, heads = int(meta.get("ssm.inner_size")), int(meta.get("ssm.time_step_rank"))
        if heads < 1 or inner % heads:
            meta.refuse("ssm.inner_size", inner, f"not a multiple of ssm.time_step_rank {heads} (the heads)")
        eps = meta.get_f32("attention.layer_norm_epsilon")
        rms = meta.get_f32("attention.layer_norm_rms_epsilon", None)
        if rms is not None and rms != eps:
            meta.refuse("attention.layer_norm_rms_epsilon", rms, f"differs from attention.layer_norm_epsilon {eps}: "
                                                                  "HF's one layer_norm_epsilon cannot hold both")
        meta.get("rope.scaling.finetuned", None)  # no RoPE in the graph: nothing to read it into
        n_head = one("n_head", "attention.head_count", "full_attention", self.tiny["num_attention_heads"])
        return {"vocab_size": vocab, "hidden_size": hp.n_embd, "layers_block_type": types,
                "num_attention_heads": n_head,
                "num_key_value_heads": one("n_head_kv", "attention.head_count_kv", "full_attention", n_head),
                "head_dim": hp.n_embd_head_k or self.tiny["head_dim"],
                "intermediate_size": one("n_ff", "feed_forward_length", "mlp", self.tiny["intermediate_size"]),
                "mamba_num_heads": heads, "mamba_head_dim": inner // heads,
                "n_groups": int(meta.get("ssm.group_count")), "ssm_state_size": int(meta.get("ssm.state_size")),
                "conv_kernel": int(meta.get("ssm.conv_kernel")), "use_bias": False,
                # build_ffn_layer's ffn_up_b / ffn_down_b (TENSOR_NOT_REQUIRED): HF NemotronHMLP's mlp_bias
                "mlp_bias": any(n.endswith("ffn_up.bias") for n in shapes),
                "use_conv_bias": any(n.endswith("ssm_conv1d.bias") for n in shapes),
                # no key holds HF's SSD chunk or its dt floor (llama.cpp's ssm_scan is sequential
                # and clamps nothing): the family's own, as its export was built
                "chunk_size": self.tiny["chunk_size"], "layer_norm_epsilon": eps,
                "max_position_embeddings": self.tiny["max_position_embeddings"],
                "tie_word_embeddings": "output.weight" not in shapes, **special_tokens(meta, vocab)}

    def gguf_convert(self, name, data, config, variant=None):
        """NemotronHModel.filter_tensors (HF 5's ``model.layers.*`` are the checkpoint's
        ``backbone.layers.*``, the names gguf's tensor map knows), then
        GraniteHybridModel.modify_tensors per layer kind: the Mamba-2 layers'
        Mamba2Model steps, the attention layers' LlamaModel Q/K permutation, the MLP
        layers' tensors as they are."""
        if name.startswith("model.layers."):
            name = "backbone.layers." + name.removeprefix("model.layers.")
        out = self.mamba2_convert(name, data, config)
        if out is not None:
            yield from out
            return
        yield name, self.gguf_transform(name, data, config)


FAMILY = NemotronH()
