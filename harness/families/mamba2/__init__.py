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
from contract.layers import NormSpec

from ...errors import UsageError
from .._gguf_export import NegExpALog
from .._mamba2 import (HF_BLOCK_POINTS, LC_NOT_EXPOSED, Mamba2Sizes, mamba2_config, mamba2_convert, mamba2_state_canonical,
                       mamba2_weights, refuse_short_conv)
from .._recurrent import RecurrentProbes
from ..base import Family, LcPoint
from .._gguf_import import read_hparams, refuse_experts, special_tokens, vocab_of


class Mamba2(RecurrentProbes, NegExpALog, Family):
    name = "mamba2"
    # the fuzz: no knob of its own -- the norm eps, layer count and context length every
    # family gets (harness/fuzz.py case_strategy)
    fuzz_space = {"knobs": ()}
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
    hf_points = HF_BLOCK_POINTS
    # mamba.cpp graph() + mamba-base.cpp build_mamba2_layer cb() names
    lc_points = {
        "attn_in": LcPoint("attn_norm"),
        "rec_out": LcPoint("mamba2_y_add_d", "last", "heads"),
        "attn_out": LcPoint("mamba_out"),
        "resid_mid": LcPoint("l_out"),
        "layer_out": LcPoint("l_out"),
    }
    lc_not_exposed = LC_NOT_EXPOSED

    def is_recurrent(self, config, i: int) -> bool:
        return True

    def norm_eps(self, config) -> float:
        return float(config.layer_norm_epsilon)

    def validate(self, kw: dict) -> None:
        """The SSD shapes HF checks late or not at all, by their HF names."""
        super().validate(kw)
        g = {**self.tiny, **kw}
        for key in ("n_groups", "state_size", "conv_kernel", "chunk_size", "expand"):
            v = g.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UsageError(f"{key}={v!r}: must be a positive integer")
        if g["num_heads"] % g["n_groups"]:
            raise UsageError(f"n_groups={g['n_groups']} does not divide num_heads={g['num_heads']}; valid: a divisor "
                             f"of {g['num_heads']}")
        if g["hidden_size"] * g["expand"] != g["num_heads"] * g["head_dim"]:
            raise UsageError(f"hidden_size * expand = {g['hidden_size'] * g['expand']} != num_heads * head_dim = "
                             f"{g['num_heads'] * g['head_dim']}; valid: equal (HF Mamba2Config.validate_architecture)")

    def _ssm_sizes(self, config) -> Mamba2Sizes:
        """Mamba2Config's names for the mixer's sizes (Mamba2Mixer.__init__)."""
        return Mamba2Sizes(heads=config.num_heads, head_dim=config.head_dim, groups=config.n_groups,
                           state=config.state_size, conv=config.conv_kernel, conv_bias=bool(config.use_conv_bias),
                           proj_bias=bool(config.use_bias), eps=float(config.layer_norm_epsilon),
                           chunk=int(config.chunk_size), limit=tuple(config.time_step_limit))

    def lc_refusal(self, config) -> str | None:
        return refuse_short_conv(self._ssm_sizes(config), "conv_kernel")

    def layer_config(self, config, i: int) -> RecurrentConfig:
        """Mamba2Mixer.__init__ (harness/families/_mamba2.py mamba2_config)."""
        return mamba2_config(self._ssm_sizes(config), config.hidden_size,
                             NormSpec("rms", float(config.layer_norm_epsilon)))

    def layer_weights(self, model, config, i: int) -> dict:
        return mamba2_weights(self.decoder_layers(model)[i], "mixer", "norm", self._ssm_sizes(config))

    # ------------------------------------------------------------------ llama.cpp
    def lc_canonical(self, probe, arr, lc, config):
        return self.lc_recurrent_canonical(probe, arr, lc, config)

    def lc_state_canonical(self, r_row, s_row, lc, config) -> dict:
        return mamba2_state_canonical(r_row, s_row, lc)

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
        """Mamba2Model's tensor steps (harness/families/_mamba2.py mamba2_convert)."""
        yield from mamba2_convert(name, data, self._ssm_sizes(config)) or [(name, data)]


FAMILY = Mamba2()
