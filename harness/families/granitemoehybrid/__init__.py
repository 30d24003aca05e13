"""granitemoehybrid: Granite 4.0's hybrid -- Mamba-2 layers and attention layers per
``layer_types``, granite's multipliers, a mixture of experts with a shared MLP (HF
``GraniteMoeHybridForCausalLM``, transformers/models/granitemoehybrid/
modeling_granitemoehybrid.py; llama.cpp arch ``granitehybrid``,
src/models/granite-hybrid.cpp; converter conversion/granite.py
``GraniteHybridModel``, shared with bamba: harness/families/bamba ``GraniteHybrid``).

Every layer (``GraniteMoeHybridDecoderLayer.forward``): ``input_layernorm`` ->
``GraniteMoeHybridMambaLayer`` (the Mamba-2 mixer, harness/families/_mamba2.py) or
``GraniteMoeHybridAttention`` -> ``residual + branch * residual_multiplier`` ->
``post_attention_layernorm`` -> MoE (``block_sparse_moe``: top-k of the router's
logits, softmax over the k) + ``shared_mlp`` -> ``residual + ffn * residual_multiplier``.
The attention's softmax scale IS ``attention_multiplier`` (``self.scaling``), the
embedding is multiplied by ``embedding_multiplier`` (``GraniteMoeHybridModel.forward``,
after ``embed_tokens``: the ``embeddings`` probe is the first layer's input, what
llama.cpp's ``embd`` holds), the logits divided by ``logits_scaling``.

Positions: ``position_embedding_type`` None (the Granite 4.0-H checkpoints) -- no RoPE
at all (``rotary_emb = None``); the converter writes ``rope.scaling.finetuned =
false`` for a hybrid that is not Bamba (``use_rope``), which granite-hybrid.cpp
reads as no RoPE on any layer (``rope_pattern``). ``--set
position_embedding_type=rope`` is HF-only: the converter still writes RoPE off, so
llama.cpp would compute another model (refused for --ref llamacpp).

Tiny config: 3 layers ``[mamba, attention, mamba]``, hidden 64, 4 heads / 2 KV heads
of 16, Mamba-2 of 8 heads x 16, 2 groups, state 16, conv 4, HF chunk 16; 4 experts
(2 used) of 32, a shared MLP of 48; multipliers 0.15 / 12 / 0.22 / 8.
"""

from __future__ import annotations

from contract.recurrent import RecurrentConfig

from ..bamba import GraniteHybrid
from .._gguf_import import experts, one_per_layer


class GraniteMoeHybrid(GraniteHybrid):
    name = "granitemoehybrid"
    # the fuzz: the generic heads knob, then the norm eps, layer count and context length
    # every family gets (harness/fuzz.py case_strategy)
    fuzz_space = {"knobs": ("heads",)}
    hf_model_type = "granitemoehybrid"
    description = "hybrid: Mamba-2 + NoPE attention layers, granite multipliers, MoE + shared MLP"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        layer_types=["mamba", "attention", "mamba"], mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=2,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True,
        mamba_proj_bias=False, position_embedding_type=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_multiplier=0.15, embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0,
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    extra_settable = ()
    experts_implementation = "eager"
    # granite-hybrid.cpp build_attention_layer: no ggml_rope_ext where has_rope(il) is false
    # (what the converter's rope.scaling.finetuned=false says for every layer of a hybrid)
    lc_not_exposed = {**GraniteHybrid.lc_not_exposed, **{
        p: "granite-hybrid.cpp build_attention_layer rotates nothing in a granitemoehybrid file (the converter writes "
           "rope.scaling.finetuned=false): no RoPE node, Q and K are compared unrotated as q and k"
        for p in ("q_rope", "k_rope")}}
    # GraniteMoeHybridModel.forward: inputs_embeds * embedding_multiplier, fed to layer 0
    hf_model_points = {"embeddings": ("model.layers.0", "in"), "final_norm": ("model.norm", "out")}

    def uses_rope(self, config, i: int) -> bool:
        # GraniteMoeHybridModel.__init__: rotary_emb only for position_embedding_type == "rope"
        return config.position_embedding_type == "rope"

    def _uses_rope_in_gguf(self, config) -> bool:
        return not any(self.is_recurrent(config, i) for i in range(config.num_hidden_layers))

    def _residual_multiplier(self, config) -> float:
        return float(config.residual_multiplier)

    def lc_refusal(self, config) -> str | None:
        if self.uses_rope(config, 0) and not self._uses_rope_in_gguf(config):
            return ("position_embedding_type='rope': the converter writes rope.scaling.finetuned=false for every "
                    "hybrid but Bamba (conversion/granite.py GraniteHybridModel.set_gguf_parameters use_rope), so "
                    "llama.cpp's granitehybrid rotates nothing; valid for --ref llamacpp: position_embedding_type "
                    "unset (HF computes RoPE: --ref hf or hf_cached)")
        return super().lc_refusal(config)

    def config_from_gguf(self, meta, shapes, tensors):
        """granite-hybrid.cpp load_arch_hparams, as HF GraniteMoeHybrid can hold it: the
        four multipliers (absent or 0: none -- kq_scale 1/sqrt(head_dim), no embedding,
        residual or logit scale), the experts (softmax routing, renormalised:
        build_moe_ffn norm_w = true) and the shared expert's width, RoPE off (a hybrid's
        file: the converter writes rope.scaling.finetuned=false; on, it is a Bamba file)."""

        kw, hp = self._hybrid_gguf_config(meta, shapes)
        if kw.pop("_rope"):
            meta.refuse("rope.scaling.finetuned", True, "RoPE on a hybrid's attention: the converter writes it only "
                                                        "for Bamba (family bamba)")
        kw.pop("_rope_parameters")
        recr = kw.pop("_recurrent")
        kw["layer_types"] = ["mamba" if r else "attention" for r in recr]
        kw["position_embedding_type"] = None
        hd = kw["hidden_size"] // kw["num_attention_heads"]
        kw.update(logits_scaling=meta.get_f32("logit_scale", 0.0) or 1.0,
                  residual_multiplier=meta.get_f32("residual_scale", 0.0) or 1.0,
                  embedding_multiplier=meta.get_f32("embedding_scale", 0.0) or 1.0,
                  attention_multiplier=meta.get_f32("attention.scale", 0.0) or float(hd) ** -0.5)
        if hp.n_expert:
            n_exp, n_used = experts(meta, hp, self.name)
            kw.update(num_local_experts=n_exp, num_experts_per_tok=n_used, intermediate_size=hp.ff,
                      shared_intermediate_size=one_per_layer(meta, "expert_shared_feed_forward_length",
                                                             hp.n_layer))
        else:
            # dense: the shared MLP is the layer's FFN (ffn_gate / ffn_up / ffn_down)
            meta.get("expert_shared_feed_forward_length", None)
            kw.update(num_local_experts=0, shared_intermediate_size=hp.ff, intermediate_size=hp.ff)
        return kw

    def gguf_export_refusal(self, config) -> str | None:
        # convert_hf_to_gguf.py: "There are some models in this family that are non-hybrid, but
        # keep the same parent class by setting all layers to attention" -- with no SSM layer
        # the converter writes arch granitemoe (granite without experts), conversion/granite.py
        # GraniteHybridModel.__init__ `if not self._ssm_layers`. As granitehybrid, llama.cpp's
        # hybrid memory holds a recurrent cache of no layer and the worker aborts
        # (ggml-backend.cpp:205 GGML_ASSERT(buffer), measured with --set layer_types=[...]).
        # (HF spells the types linear_attention / full_attention: the layer configs say which recur)
        if any(isinstance(lc, RecurrentConfig) for lc in self.layer_configs(config)):
            return None
        to = "granitemoe" if getattr(config, "num_local_experts", 0) else "granite"
        return (f"a GraniteMoeHybrid with no mamba layer (layer_types {list(config.layer_types)}) is no granitehybrid file: convert_hf_to_gguf writes it as "
                f"arch {to} (conversion/granite.py GraniteHybridModel.__init__, `if not self._ssm_layers`), and "
                "as granitehybrid llama.cpp's worker aborts (ggml-backend.cpp:205 GGML_ASSERT(buffer): a recurrent "
                f"cache of no layer); its {to} graph rotates Q and K, HF's position_embedding_type="
                f"{getattr(config, 'position_embedding_type', None)!r} decides here -- run --family "
                f"{'granitemoe' if to == 'granitemoe' else 'granite'} for that graph")

    def layer_config(self, config, i: int):
        lc = super().layer_config(config, i)
        if isinstance(lc, RecurrentConfig):
            return lc
        # GraniteMoeHybridAttention.scaling = attention_multiplier; the decoder layer's
        # residual + branch * residual_multiplier
        return lc.replace(scale=float(config.attention_multiplier),
                          residual_multiplier=float(config.residual_multiplier))


FAMILY = GraniteMoeHybrid()
