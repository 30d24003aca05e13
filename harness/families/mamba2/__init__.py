"""mamba2: a pure Mamba-2 stack (HF ``Mamba2ForCausalLM``, modeling_mamba2.py; llama.cpp
arch ``mamba2``, src/models/mamba2.cpp + mamba.cpp's graph with mamba-base.cpp
``build_mamba2_layer``; converter conversion/mamba.py ``Mamba2Model``).

Every layer is ``Mamba2Block``: ``norm`` (RMS) -> ``Mamba2Mixer`` -> + residual (no
FFN). The mixer is ``contract.recurrent.RecurrentConfig`` kind ``mamba2``: ``in_proj``
-> z | xBC | dt (``projected_states.split([intermediate, conv_dim, num_heads])``), a
SiLU causal conv with bias over xBC, split x | B | C (v = x, k = B, q = C over
``n_groups`` groups, head ``h`` reading group ``h // (H / G)``), ``dt = softplus(dt +
dt_bias)`` (clamped to ``time_step_limit`` in HF's chunked scan only), the per-head
decay ``exp(dt * A)``, ``A = -exp(A_log)``, the write ``dt * x (x) B``, the read ``C``,
the D skip, then ``MambaRMSNormGated``: ``y * silu(z)``, RMS over ``n_groups`` groups,
``* w``, and ``out_proj``.

llama.cpp names (cb()): ``attn_norm`` (the normed input), ``mamba2_y_add_d`` (y after
the D skip: ``rec_out``), ``mamba_out`` (out_proj's output: ``attn_out``), ``l_out``
(the residual; no FFN, so also ``resid_mid``). Everything else inside the layer --
the in-projection, the conv's input and output, x / B / C, dt, z, the gated norm --
is unnamed in build_mamba2_layer (not exposed); the conv state and the SSM state
after each call come from ``llama_state_seq_get_data`` (llama-memory-recurrent.cpp
``state_write_data``: the ``r_l`` row [C, K-1] channel-major, the ``s_l`` row
``{d_state, head_dim, n_head}`` = HF's ``[H, head_dim, N]``).

Tiny config: 2 layers, hidden 64, expand 2 (d_inner 128 = 8 heads of 16), 2 groups,
state 16, conv 4, HF ``chunk_size`` 16 (so a prefill of the default schedules crosses
HF's SSD chunk boundary; llama.cpp's ssm_scan is sequential whatever the chunk).
"""

from __future__ import annotations


from contract.recurrent import RecurrentConfig
from impl import NormSpec

from ...errors import UsageError
from .._gguf_export import NegExpALog
from .._mamba2 import Mamba2Mixer, Mamba2Sizes
from .._recurrent import RecurrentProbes
from ..base import Family, LcPoint, Point, tensor


class Mamba2(Mamba2Mixer, RecurrentProbes, NegExpALog, Family):
    name = "mamba2"
    hf_model_type = "mamba2"
    description = "pure Mamba-2: SSD selective scan (per-head decay, grouped B/C, D skip, gated grouped RMS norm)"
    tiny = dict(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, expand=2, n_groups=2,
        state_size=16, conv_kernel=4, use_bias=False, use_conv_bias=True, chunk_size=16, layer_norm_epsilon=1e-5,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "mamba2"
    # HF Mamba2Config names its sizes otherwise (no attention heads)
    size_keys = {"hidden": "hidden_size", "heads": "num_heads", "layers": "num_hidden_layers", "head_dim": "head_dim"}
    layers_path = "backbone.layers"
    hf_model_points = {"embeddings": ("backbone.embeddings", "out"), "final_norm": ("backbone.norm_f", "out")}

    # the mixer, and its gated norm (MambaRMSNormGated.forward(hidden_states, gate): z is the gate)
    hf_rec_module = "mixer"
    hf_rec_gate_norm = "norm"
    # Mamba2Block.forward: norm -> mixer -> residual + mixer out (no FFN: the block's output
    # is the residual after the branch)
    hf_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("mixer", "in"),
        "attn_branch": Point("mixer.out_proj", "in"),
        "attn_out": Point("mixer", "out"),
        "resid_mid": Point("", "out"),
        "layer_out": Point("", "out"),
    }
    # mamba.cpp graph() + mamba-base.cpp build_mamba2_layer cb() names
    lc_points = {
        "attn_in": LcPoint("attn_norm"),
        "rec_out": LcPoint("mamba2_y_add_d", "last", "heads"),
        "attn_out": LcPoint("mamba_out"),
        "resid_mid": LcPoint("l_out"),
        "layer_out": LcPoint("l_out"),
    }
    lc_not_exposed = {p: "mamba-base.cpp build_mamba2_layer names no tensor inside the layer but mamba2_y_add_d and "
                         "mamba_out (the in-projection, conv, x / B / C, dt and the gated norm are unnamed views and "
                         "ops); the conv and SSM states are read from llama_state_seq_get_data instead"
                      for p in ("rec_conv_in", "rec_conv", "rec_z", "rec_q", "rec_k", "rec_v", "rec_decay",
                                "attn_branch")}

    def is_recurrent(self, config, i: int) -> bool:
        return True

    def norm_eps(self, config) -> float:
        return float(config.layer_norm_epsilon)

    def mamba2_sizes(self, config) -> Mamba2Sizes:
        """Mamba2Mixer.__init__'s sizes by Mamba2Config's names; ``time_step_limit`` as
        the config holds it."""
        return Mamba2Sizes(
            heads=config.num_heads, head_dim=config.head_dim, groups=config.n_groups, state=config.state_size,
            conv=config.conv_kernel, conv_bias=bool(config.use_conv_bias), bias=bool(config.use_bias),
            eps=float(config.layer_norm_epsilon), chunk=int(config.chunk_size),
            dt_limit=tuple(float(x) for x in config.time_step_limit))

    def validate(self, kw: dict) -> None:
        """The SSD shapes HF checks late or not at all, by their HF names."""
        super().validate(kw)
        g = {**self.tiny, **kw}
        self.mamba2_validate({k: g.get(k) for k in ("num_heads", "n_groups", "state_size", "conv_kernel",
                                                    "chunk_size", "expand")}, "num_heads", "n_groups")
        if g["hidden_size"] * g["expand"] != g["num_heads"] * g["head_dim"]:
            raise UsageError(f"hidden_size * expand = {g['hidden_size'] * g['expand']} != num_heads * head_dim = "
                             f"{g['num_heads'] * g['head_dim']}; valid: equal (HF Mamba2Config.validate_architecture)")

    def reference_refusal(self, config, reference: str) -> str | None:
        return self.mamba2_refusal(config, reference)

    def layer_config(self, config, i: int) -> RecurrentConfig:
        # Mamba2Block.norm: Mamba2RMSNorm(hidden_size, eps=layer_norm_epsilon)
        return self.mamba2_config(config, NormSpec("rms", float(config.layer_norm_epsilon)))

    def layer_weights(self, model, config, i: int) -> dict:
        layer = self.decoder_layers(model)[i]
        return {"attn_norm": tensor(layer, "norm.weight"), **self.mamba2_weights(layer, config)}

    # ------------------------------------------------------------------ llama.cpp
    def lc_canonical(self, probe, arr, lc, config):
        return self.lc_recurrent_canonical(probe, arr, lc, config)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """conversion/mamba.py ``Mamba2Model.set_gguf_parameters`` (its ``add_context_length(2**20)``,
        feed-forward length and head count 0), the vocabulary size as it pads it."""
        if config.use_bias:
            raise ValueError("mamba2 export: use_bias=true is not exported (build_mamba2_layer loads no "
                             "ssm_in / ssm_out bias); valid: false")
        w.add_context_length(2 ** 20)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        w.add_block_count(config.num_hidden_layers)
        w.add_ssm_conv_kernel(config.conv_kernel)
        w.add_ssm_inner_size(config.num_heads * config.head_dim)
        w.add_ssm_state_size(config.state_size)
        w.add_ssm_time_step_rank(config.num_heads * config.head_dim // config.head_dim)
        w.add_ssm_group_count(config.n_groups)
        w.add_layer_norm_rms_eps(config.layer_norm_epsilon)
        w.add_vocab_size(config.vocab_size)

    def config_from_gguf(self, meta, shapes, tensors):
        """mamba.cpp load_arch_hparams (LLM_ARCH_MAMBA2): ``ssm.conv_kernel``, ``ssm.inner_size``,
        ``ssm.state_size``, ``ssm.time_step_rank`` (the heads), ``ssm.group_count``, the RMS eps;
        head_dim = inner_size / time_step_rank, expand = inner_size / embedding_length (HF
        Mamba2Config's own sizes). The conv bias is the file's ``ssm_conv1d.bias``."""
        from .._gguf_import import read_hparams, refuse_experts, special_tokens, vocab_of

        hp = read_hparams(meta)
        refuse_experts(meta, hp, self.name)
        vocab = vocab_of(meta, shapes)
        inner, heads = int(meta.get("ssm.inner_size")), int(meta.get("ssm.time_step_rank"))
        if heads < 1 or inner % heads:
            meta.refuse("ssm.inner_size", inner, f"not a multiple of ssm.time_step_rank {heads} (the heads)")
        if inner % hp.n_embd:
            meta.refuse("ssm.inner_size", inner, f"not a multiple of embedding_length {hp.n_embd} (HF's expand)")
        return {"vocab_size": vocab, "hidden_size": hp.n_embd, "num_hidden_layers": hp.n_layer,
                "num_heads": heads, "head_dim": inner // heads, "expand": inner // hp.n_embd,
                "n_groups": int(meta.get("ssm.group_count")), "state_size": int(meta.get("ssm.state_size")),
                "conv_kernel": int(meta.get("ssm.conv_kernel")), "use_bias": False,
                "use_conv_bias": "blk.0.ssm_conv1d.bias" in shapes,
                # no key holds HF's SSD chunk (llama.cpp's ssm_scan is sequential whatever the
                # chunk): the family's own, as its export was built
                "chunk_size": self.tiny["chunk_size"],
                "layer_norm_epsilon": meta.get_f32("attention.layer_norm_rms_epsilon"),
                "tie_word_embeddings": "output.weight" not in shapes, **special_tokens(meta, vocab)}

    def gguf_convert(self, name, data, config, variant=None):
        """Mamba2Model.filter_tensors and modify_tensors (Mamba2Mixer.mamba2_convert)."""
        yield from self.mamba2_convert(name, data, config) or [(name, data)]


FAMILY = Mamba2()
