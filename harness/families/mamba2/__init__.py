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
from .._recurrent import RecurrentProbes
from ..base import Family, LcPoint, Point, tensor


class Mamba2(RecurrentProbes, NegExpALog, Family):
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

    def reference_refusal(self, config, reference: str) -> str | None:
        """build_mamba2_layer: ``ssm_conv`` needs ``d_conv - 1 >= 1`` rows of state
        (mamba-base.cpp ``ggml_reshape_3d(conv, d_conv - 1, ...)`` of a zero-sized state)."""
        if reference == "llamacpp" and config.conv_kernel < 2:
            return (f"conv_kernel={config.conv_kernel}: llama.cpp's Mamba-2 keeps conv_kernel - 1 rows of conv state "
                    f"and asserts at least one; valid for --ref llamacpp: >= 2 (HF computes 1: --ref hf or hf_cached)")
        return None

    def layer_config(self, config, i: int) -> RecurrentConfig:
        """Mamba2Mixer.__init__: heads = ``num_heads`` of ``head_dim``, B / C over
        ``n_groups`` groups of ``state_size``; ``MambaRMSNormGated(intermediate,
        group_size=intermediate // n_groups)``: gate then norm over n_groups groups."""
        b = bool(config.use_bias)
        lim = tuple(float(x) for x in config.time_step_limit)
        return RecurrentConfig.of(
            "mamba2", hidden_size=config.hidden_size, n_k_heads=config.n_groups, n_v_heads=config.num_heads,
            k_dim=config.state_size, v_dim=config.head_dim, conv_kernel=config.conv_kernel,
            conv_bias=bool(config.use_conv_bias), in_bias=b, out_bias=b, out_norm_groups=config.n_groups,
            out_norm_eps=float(config.layer_norm_epsilon),
            dt_limit=None if lim == (0.0, float("inf")) else lim, chunk_size=int(config.chunk_size),
            input_norm=NormSpec("rms", float(config.layer_norm_epsilon)))

    def layer_weights(self, model, config, i: int) -> dict:
        layer = self.decoder_layers(model)[i]
        di = config.num_heads * config.head_dim
        cd = di + 2 * config.n_groups * config.state_size
        w_in = tensor(layer, "mixer.in_proj.weight")  # `projected_states.split([intermediate, conv_dim, num_heads])`
        w = {"attn_norm": tensor(layer, "norm.weight"), "w_z": w_in[:di], "w_in": w_in[di:di + cd],
             "w_decay": w_in[di + cd:], "conv": tensor(layer, "mixer.conv1d.weight")[:, 0],
             "dt_bias": tensor(layer, "mixer.dt_bias"), "A_log": tensor(layer, "mixer.A_log"),
             "D": tensor(layer, "mixer.D"), "out_norm": tensor(layer, "mixer.norm.weight"),
             "wo": tensor(layer, "mixer.out_proj.weight")}
        if config.use_conv_bias:
            w["conv_b"] = tensor(layer, "mixer.conv1d.bias")
        if config.use_bias:
            b = tensor(layer, "mixer.in_proj.bias")
            w.update(b_z=b[:di], b_in=b[di:di + cd], b_decay=b[di + cd:], bo=tensor(layer, "mixer.out_proj.bias"))
        return w

    # ------------------------------------------------------------------ llama.cpp
    def lc_canonical(self, probe, arr, lc, config):
        return self.lc_recurrent_canonical(probe, arr, lc, config)

    def lc_state_canonical(self, r_row, s_row, lc, config) -> dict:
        """build_mamba2_layer's states: the conv row as the delta nets' ([C, K-1],
        channel-major), the SSM row ``{d_state, head_dim, n_head}`` (ggml ssm_scan's
        ``ggml_reshape_4d(states, d_state, head_dim, n_head, ...)``), which read
        row-major is HF's ``[H, head_dim, N]`` as it stands (no transpose)."""
        out = {}
        if r_row.size:
            out["state_conv"] = r_row.reshape(lc.conv_channels, lc.conv_kernel - 1)
        if s_row.size:
            out["state_rec"] = s_row.reshape(lc.n_v_heads, lc.v_dim, lc.k_dim)
        return out

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
        """Mamba2Model.filter_tensors (``dt_bias`` -> ``dt_proj.bias``) and modify_tensors:
        the conv squeezed, A and D ``(H,)`` -> ``(H, 1)``, the gated norm ``(d_inner,)`` ->
        ``(n_groups, d_inner / n_groups)``; A_log's ``-exp`` is the value step (NegExpALog)."""
        if name.endswith(".dt_bias"):
            yield name.rpartition(".dt_bias")[0] + ".dt_proj.bias", data
            return
        if "conv1d.weight" in name:
            yield name, data.squeeze()
            return
        if name.endswith((".A_log", ".D")):
            yield name, data.reshape(*data.shape, 1)
            return
        if name.endswith("mixer.norm.weight"):
            di = config.num_heads * config.head_dim
            yield name, data.reshape(config.n_groups, di // config.n_groups)
            return
        yield name, data


FAMILY = Mamba2()
