"""minimax: lightning attention interleaved with softmax attention, MoE in every
layer (HF ``MiniMaxForCausalLM``, transformers/models/minimax/modeling_minimax.py;
llama.cpp arch ``minimax-01``, src/models/minimax-01.cpp; converter
conversion/minimax.py ``MiniMaxText01Model``).

The ``linear_attention`` layers (HF ``MiniMaxLightningAttention``; minimax-01.cpp's
"lightning attention layer" arm) are described to impl as
``contract.recurrent.RecurrentConfig`` kind ``lightning``: ``silu(qkv_proj(x))``
read per head as ``[q (D) | k (D) | v (D)]`` (HF ``reshape(..., H, 3 * D)`` then
``torch.split(..., D, dim=3)``; minimax-01.cpp ``ggml_view_4d`` at offsets 0, D,
2D of each head's 3D block -- the same order, so the converter permutes nothing),
the state ``S = exp(-slope_h) S + k^T v``, ``y = q S`` (no q scale), an RMS norm
over the whole ``H * D`` row, times ``sigmoid(output_gate(x))``, ``out_proj``. The
slopes ``2 ** (-8 (h + 1) / H) * factor(il)`` are computed by each reference from
the layer index (HF ``get_slope_rate``; minimax-01.cpp ``llm_graph_input_la`` and
``slope_scale``): the two factors differ by HF's 1e-5 in the denominator (see
``slope_rule`` and the findings).

Every layer, both kinds, adds its branch to the NORMED input times alpha (HF
``MiniMaxDecoderLayer.forward``: ``hidden_states = input_layernorm(x); residual =
hidden_states; ... residual * attn_alpha_factor + attn * attn_beta_factor``, and
the same around the MoE with ``mlp_alpha_factor`` / ``mlp_beta_factor``;
minimax-01.cpp ``residual = cur`` after ``attn_norm``, ``ggml_scale(residual,
f_residual_scale)``). llama.cpp has ONE scale and no beta: the converter asserts
the three alphas equal and every beta 1.0 and writes the alpha as
``residual_scale`` (``MiniMaxText01Model.set_gguf_parameters``), so a config
outside that is HF-only (``reference_refusal``).

The converter is written for the original checkpoints' config.json
(``layernorm_full_attention_alpha``, ``rotary_dim``, ...; architectures
``MiniMaxText01ForCausalLM``), which transformers renames
(``full_attn_alpha_factor``, ...; ``MiniMaxForCausalLM``): the export reads the
HF names for the keys the converter writes from the original ones
(``gguf_params``). It writes no layer layout: llama.cpp then takes every 8th
layer as softmax attention (minimax-01.cpp ``load_arch_hparams``:
``full_attn_interval = 8``, ``(i + 1) % 8 != 0`` recurrent), so the tiny model has
8 layers in that layout -- which is also the real checkpoints' (MiniMax-Text-01's
``attn_type_list``: full attention every 8th layer, layer 0 lightning), and a
``layer_types`` the file cannot carry is refused for llama.cpp.

Probes. HF computes the lightning recurrence inline, so its probes are module
hooks: ``act_fn``'s output (q, k, v), ``output_gate``'s (z), ``norm``'s input
(y), ``out_proj``'s input (the branch), and the log-decay ``-slope_rate`` from
the module's own buffer; the state after each call is ``MiniMaxCache.linear_cache``.
llama.cpp names ``QKVcur_silu``, ``g``, ``qkv_permuted`` (y), ``attn_out``,
``ffn_inp`` and the state through ``llama_state_seq_get_data``; it names no
tensor for the gated branch (``ggml_mul(g, qkv_norm)`` is unnamed) and keeps the
slope per layer, not per row (``slope_rate`` is ``[n_head]``).

Tiny config: 8 layers (7 lightning, layer 7 softmax attention), hidden 64, 4
heads (4 KV heads on the attention layer) of 16, full neox RoPE (HF's
``MiniMaxRotaryEmbedding`` rotates the whole head), 4 experts (2 used), alpha 1.5
on every residual, betas 1.0, ``rms_norm_eps`` 1e-6: HF's lightning ``norm`` keeps
``MiniMaxRMSNorm``'s default eps 1e-6 whatever the config says, llama.cpp's
``qkv_norm`` uses ``rms_norm_eps`` (a finding where they differ).
"""

from __future__ import annotations

import re
import contextlib

import numpy as np

from contract.recurrent import RecurrentConfig
from contract.layers import NormSpec
from impl import lightning_slopes

from .._recurrent import RecurrentProbes, _np
from ...errors import UsageError
from ..base import LcPoint, LlamaLike, Point, gguf_moe_convert, tensor
from harness.lazy import lazy
from .._gguf_export import text_model_gguf_params
from .._gguf_import import experts, llama_like_config, read_hparams

torch = lazy("torch")

# HF MiniMaxLightningAttention.__init__: `self.norm = MiniMaxRMSNorm(head_dim * num_heads)`,
# no eps argument -- MiniMaxRMSNorm's default
HF_LIGHTNING_NORM_EPS = 1e-6
# minimax-01.cpp load_arch_hparams: `full_attn_interval = 8` when the file has neither
# attention.recurrent_layers nor full_attention_interval (the converter writes neither)
LC_FULL_ATTN_INTERVAL = 8


class MiniMax(RecurrentProbes, LlamaLike):
    name = "minimax"
    hf_model_type = "minimax"
    description = ("hybrid: lightning attention (silu QKV, per-head slope decay, row RMS norm, sigmoid gate) + "
                   "softmax attention every 8th layer, residual from the normed input times alpha, MoE")
    # heads and head_dim: the lightning state is [H, D, D] and the slopes follow the head
    # count (HF get_slope_rate base = 2 ** (-8 / H)). Fuzzed again since impl's float32
    # lightning decays follow HF's block form and carry the state's decay without drift
    # (impl.recurrent_scan; docs/measurements/2026-12-01-minimax.md "impl's float32 scan at
    # length": the false alarm past ~16 tokens and the one 8-wide head of fuzz seed 0)
    # Every schedule: where HF's cached path crashes (a multi-row call after the first with a
    # lightning layer 0), schedule_refusal leaves it out of the case in a skipped row
    fuzz_space = {"knobs": ("heads", "head_dim")}
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        layer_types=["linear_attention"] * 7 + ["full_attention"], block_size=256,
        num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0,
        full_attn_alpha_factor=1.5, linear_attn_alpha_factor=1.5, mlp_alpha_factor=1.5,
        full_attn_beta_factor=1.0, linear_attn_beta_factor=1.0, mlp_beta_factor=1.0,
        tie_word_embeddings=False,
    )
    gguf_arch = "minimax-01"
    # MiniMaxExperts.forward's own loop; the default grouped_mm kernel refuses float64
    experts_implementation = "eager"

    hf_rec_module = "self_attn"
    hf_rec_gate_norm = None  # the gate is a projection of x (output_gate), read by a hook
    # the lightning layers: module hooks (HF computes the recurrence inline)
    _hf_linear_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("self_attn", "in"),
        "rec_z": Point("self_attn.output_gate", "out"),
        "rec_q": Point("self_attn.act_fn", "out"),
        "rec_k": Point("self_attn.act_fn", "out"),
        "rec_v": Point("self_attn.act_fn", "out"),
        "rec_out": Point("self_attn.norm", "in"),
        "attn_branch": Point("self_attn.out_proj", "in"),
        "attn_out": Point("self_attn", "out"),
        "resid_mid": Point("post_attention_layernorm", "in"),
        "layer_out": Point("", "out"),
    }
    # minimax-01.cpp, the lightning arm: `QKVcur_silu` (q | k | v per head), `g` (the gate
    # before its sigmoid), `qkv_permuted` (y, [D, H, T]), `attn_out` (out_proj's output,
    # named twice: the last is the 2-D reshape), `ffn_inp` (the scaled residual + branch)
    _lc_linear_points = {
        "attn_in": LcPoint("attn_norm"),
        "rec_z": LcPoint("g"),
        "rec_q": LcPoint("QKVcur_silu"),
        "rec_k": LcPoint("QKVcur_silu"),
        "rec_v": LcPoint("QKVcur_silu"),
        "rec_out": LcPoint("qkv_permuted", "last", "heads"),
        "attn_out": LcPoint("attn_out"),
        "resid_mid": LcPoint("ffn_inp"),
        "layer_out": LcPoint("l_out"),
    }
    lc_not_exposed = {
        "rec_decay": "minimax-01.cpp keeps the decay per layer, not per row: slope_rate is an [n_head] tensor "
                     "(slopes x slope_scale), applied through q_decay / k_decay / diag_decay",
        "attn_branch": "minimax-01.cpp's gated row `ggml_mul(ctx0, g, qkv_norm)` carries no cb() name "
                       "(the attention layer's is kqv_out)",
    }

    def _is_linear(self, config, i: int) -> bool:
        return config.layer_types[i] == "linear_attention"

    def is_recurrent(self, config, i: int) -> bool:
        return self._is_linear(config, i)

    # ------------------------------------------------------------------ config checks
    def validate(self, kw: dict) -> None:
        """HF's sizes, by their HF names, before HF builds a model on them: one layer
        type per layer, each ``linear_attention`` or ``full_attention``."""
        super().validate(kw)
        n = kw.get("num_hidden_layers", self.tiny["num_hidden_layers"])
        types = kw.get("layer_types", self.tiny["layer_types"] if n == self.tiny["num_hidden_layers"] else None)
        if types is not None:
            if not isinstance(types, (list, tuple)) or len(types) != n:
                raise UsageError(f"layer_types has {len(types) if isinstance(types, (list, tuple)) else '?'} "
                                 f"entries for num_hidden_layers={n}; valid: one per layer")
            bad = sorted({t for t in types if t not in ("linear_attention", "full_attention")})
            if bad:
                raise UsageError(f"layer_types {bad}: unknown; valid: linear_attention, full_attention")

    def lc_refusal(self, config) -> str | None:
        """What the converter cannot write and llama.cpp's minimax-01 cannot run:
        unequal alphas or a beta other than 1 (MiniMaxText01Model.set_gguf_parameters
        asserts both, then writes one residual_scale); a layer layout other than
        every 8th layer softmax attention (the converter writes no layout, and
        minimax-01.cpp load_arch_hparams defaults to full_attn_interval = 8); a
        1-layer model (minimax-01.cpp ``slope_scale`` divides by n_layer - 1)."""
        a = (config.full_attn_alpha_factor, config.linear_attn_alpha_factor, config.mlp_alpha_factor)
        b = (config.full_attn_beta_factor, config.linear_attn_beta_factor, config.mlp_beta_factor)
        if len(set(a)) != 1 or set(b) != {1}:
            return (f"alphas {a} / betas {b}: the converter asserts the three alphas equal and every beta 1.0 "
                    f"(conversion/minimax.py MiniMaxText01Model.set_gguf_parameters) and llama.cpp has one "
                    f"f_residual_scale; valid for --ref llamacpp: equal alphas, betas 1 (HF computes any: --ref hf)")
        want = ["linear_attention" if (i + 1) % LC_FULL_ATTN_INTERVAL else "full_attention"
                for i in range(config.num_hidden_layers)]
        if list(config.layer_types) != want:
            return (f"layer_types {list(config.layer_types)}: the converter writes no layer layout and "
                    f"minimax-01.cpp load_arch_hparams then makes every {LC_FULL_ATTN_INTERVAL}th layer softmax "
                    f"attention; valid for --ref llamacpp: that layout (HF computes any: --ref hf)")
        if config.num_hidden_layers < 2:
            return ("num_hidden_layers=1: minimax-01.cpp's slope_scale = 1 - il / (n_layer - 1) divides by zero; "
                    "valid for --ref llamacpp: >= 2 layers")
        return None

    def hf_cached_schedule_refusal(self, config, chunks: tuple[int, ...]) -> str | None:
        """HF's cached path crashes on a call after the first with more than one row when
        layer 0 is a lightning layer and some layer is softmax attention: MiniMaxCache
        keeps the lightning state outside ``self.layers`` (modeling_minimax.py:73), so
        ``past_seen_tokens = cache.get_seq_length()`` (:663) is 0, the causal mask (:679)
        is built for the call's rows alone, and eager_attention_forward (:382) adds it to
        scores over every cached key: ``RuntimeError: The size of tensor a (16) must match
        the size of tensor b (9)`` at 5,1,1,9. A later call of one row builds no mask and
        runs (its positions are finding minimax#1's); with layer 0 softmax attention, or
        no softmax layer, every schedule runs (tests/test_minimax.py)."""
        if not any(n > 1 for n in chunks[1:]):
            return None
        types = list(config.layer_types)
        if types[0] != "linear_attention" or "full_attention" not in types:
            return None
        return ("HF's cached path crashes on a call after the first with more than one row when layer 0 is a "
                "lightning layer: MiniMaxCache's length stays 0 (modeling_minimax.py:663 past_seen_tokens), the "
                "causal mask is built for the call's rows alone (:679) and added to scores over every cached key "
                "(:382); valid for hf_cached: prefill, decode, mixed, or chunks of one row after the first")

    # ------------------------------------------------------------------ descriptions
    # the rule impl's slopes follow: HF's (impl computes HF's model; llama.cpp's differs by
    # the 1e-5 term, a finding)
    _slope_rule = "hf"

    def _slopes(self, h: int, i: int, n_layers: int) -> tuple[float, ...]:
        """Layer ``i``'s slopes as HF's model holds them: HF ``get_slope_rate`` computes
        ``base ** (arange(H) + 1) * factor`` in torch's default float32 (a python float
        to the power of an int64 tensor), so even a float64 HF model carries float32
        slopes (``slope_rate`` is a buffer, cast after); computed here with the same
        torch ops, then rounded as HF rounds them. The rule (HF's factor; llama.cpp's
        differs by the 1e-5 term) is impl's ``lightning_slopes``, checked against these."""

        if self._slope_rule != "hf":
            return lightning_slopes(h, i, n_layers, self._slope_rule)
        base = 1 / (2 ** (8 / h))
        factor = 1 - i / (n_layers - 1 + 1e-5) + 1e-5
        rate = (base ** (torch.arange(h) + 1)) * factor  # float32, as HF's buffer
        return tuple(float(v) for v in rate)

    def _recurrent_config(self, config, i: int) -> RecurrentConfig:
        """Layer ``i``'s lightning attention (HF MiniMaxLightningAttention.__init__ /
        forward, MiniMaxDecoderLayer's linear_attn alpha / beta)."""
        h, d = config.num_attention_heads, self.head_dim(config)
        return RecurrentConfig.of(
            "lightning", hidden_size=config.hidden_size, n_k_heads=h, n_v_heads=h, k_dim=d, v_dim=d,
            decay_slopes=self._slopes(h, i, config.num_hidden_layers),
            out_norm_eps=HF_LIGHTNING_NORM_EPS, input_norm=NormSpec("rms", float(config.rms_norm_eps)),
            residual="normed", residual_alpha=float(config.linear_attn_alpha_factor),
            residual_beta=float(config.linear_attn_beta_factor),
            # HF's block form (MiniMaxLightningAttention.forward: block_size rows at a time,
            # intra q k^T * diagonal_decay, inter q * query_decay @ kv); impl.recurrent_scan
            # takes the decays as HF's decay_factors products and carries the state's decay
            # across calls without the drift of a fixed rounded exp(-slope)
            scan="chunked", chunk_size=int(config.block_size))

    def layer_config(self, config, i: int):
        if self._is_linear(config, i):
            return self._recurrent_config(config, i)
        # MiniMaxAttention is llama's (full neox RoPE over head_dim: MiniMaxRotaryEmbedding's
        # default parameters read no partial factor); the residual is the normed input x alpha
        return super().layer_config(config, i).replace(
            residual_base="normed", residual_alpha=float(config.full_attn_alpha_factor),
            residual_multiplier=float(config.full_attn_beta_factor))

    def layer_weights(self, model, config, i: int):
        if not self._is_linear(config, i):
            return super().layer_weights(model, config, i)
        layer = self.decoder_layers(model)[i]
        h, d, hid = config.num_attention_heads, self.head_dim(config), config.hidden_size
        # HF `qkv_states.reshape(B, T, H, 3 * D)` then split per head: rows per head [q | k | v]
        qkv = tensor(layer, "self_attn.qkv_proj.weight").reshape(h, 3, d, hid)
        return {"attn_norm": tensor(layer, "input_layernorm.weight"),
                "w_in": np.concatenate([qkv[:, r].reshape(h * d, hid) for r in range(3)]),
                "w_z": tensor(layer, "self_attn.output_gate.weight"),
                "out_norm": tensor(layer, "self_attn.norm.weight"),
                "wo": tensor(layer, "self_attn.out_proj.weight")}

    # ------------------------------------------------------------------ HF probes
    def hf_points_for(self, config, i: int):
        return self._hf_linear_points if self._is_linear(config, i) else self.hf_points

    def hf_canonical(self, probe, arr, lc):
        if isinstance(lc, RecurrentConfig):
            s, t = arr.shape[:2]
            h, d = lc.n_v_heads, lc.v_dim
            if probe in ("rec_q", "rec_k", "rec_v"):
                # act_fn(qkv_proj(x)): [S, T, H * 3D], per head [q | k | v]
                r = ("rec_q", "rec_k", "rec_v").index(probe)
                return arr.reshape(s, t, h, 3, d)[:, :, :, r]
            if probe in ("rec_z", "rec_out"):
                return arr.reshape(s, t, h, d)
            return arr
        return super().hf_canonical(probe, arr, lc)

    def hf_taps(self, model, config, sink):
        """The lightning layers' log-decay per row, ``-slope_rate`` from each module's
        own buffer (HF ``ratio = torch.exp(-self.slope_rate)`` / ``query_decay``), recorded
        as the module runs (the rows of the call it is handed)."""

        @contextlib.contextmanager
        def taps():
            handles = []
            for i, layer in enumerate(self.decoder_layers(model)):
                if not self._is_linear(config, i):
                    continue

                def pre(mod, args, kwargs, i=i):
                    x = kwargs.get("hidden_states", args[0] if args else None)
                    b, n = int(x.shape[0]), int(x.shape[1])
                    g = -_np(mod.slope_rate).reshape(-1)
                    sink.setdefault(i, {})["rec_decay"] = np.broadcast_to(g, (b, n, g.size)).copy()
                handles.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
            try:
                yield
            finally:
                for hd in handles:
                    hd.remove()

        @contextlib.contextmanager
        def both():
            with super(MiniMax, self).hf_taps(model, config, sink), taps():
                yield
        return both()

    def hf_cache_states(self, cache, config, i: int, lc) -> dict:
        """The lightning state after a call: ``MiniMaxCache.linear_cache[i]``
        (``[S, H, D, D]``, K^T V: HF's ``attn_weights_inter``)."""
        lin = getattr(cache, "linear_cache", [])
        if i < len(lin) and hasattr(lin[i], "shape"):
            return {"state_rec": _np(lin[i])}
        return {}

    # ------------------------------------------------------------------ llama.cpp probes
    def lc_points_for(self, config, i: int):
        return self._lc_linear_points if self._is_linear(config, i) else self.lc_points

    def lc_canonical(self, probe, arr, lc, config):
        if isinstance(lc, RecurrentConfig):
            s, t = arr.shape[:2]
            h, d = lc.n_v_heads, lc.v_dim
            if probe in ("rec_q", "rec_k", "rec_v"):
                # QKVcur_silu [3 * D * H] per row, per head [q | k | v] (the views at 0, D, 2D)
                r = ("rec_q", "rec_k", "rec_v").index(probe)
                return arr.reshape(s, t, h, 3, d)[:, :, :, r]
            if probe == "rec_z":
                return arr.reshape(s, t, h, d)
            return self.lc_recurrent_canonical(probe, arr, lc, config)
        return super().lc_canonical(probe, arr, lc, config)

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None):
        """conversion/base.py TextModel.set_gguf_parameters (sizes, RoPE theta, RMS eps,
        expert counts, head_dim as key / value length) then
        MiniMaxText01Model.set_gguf_parameters: the one ``residual_scale`` (the
        original config's ``layernorm_full_attention_alpha``, HF's
        ``full_attn_alpha_factor``; reference_refusal holds the converter's asserts)
        and ``rope.dimension_count`` from the original ``rotary_dim`` -- here the
        width HF rotates, the whole head (MiniMaxRotaryEmbedding)."""

        text_model_gguf_params(w, config)
        w.add_residual_scale(float(config.full_attn_alpha_factor))
        w.add_rope_dimension_count(self.head_dim(config))

    def gguf_tensor_map(self, config):
        """The vendored gguf-py's MODEL_TENSORS[MINIMAX01] names (the installed gguf
        0.19 has no minimax-01 arch): tensor_mapping.py maps the same HF modules --
        ``self_attn.qkv_proj`` -> attn_qkv, ``output_gate`` -> attn_gate, ``norm`` ->
        attn_norm_2, ``out_proj`` / ``o_proj`` -> attn_output, the router and the
        stacked experts -> ffn_gate_inp / ffn_{gate,up,down}_exps."""
        return _MiniMaxNames()

    def gguf_convert(self, name, data, config, variant=None):
        """MiniMaxText01Model.modify_tensors on transformers 5's in-memory names: the
        experts are stacked per role (HF holds them fused, gate rows first); the
        lightning modules' decay buffers (slope_rate, query / key / diagonal decay)
        are not weights -- minimax-01.cpp computes them (llm_graph_input_la::set_input)."""
        if name.rsplit(".", 1)[-1] in ("slope_rate", "query_decay", "key_decay", "diagonal_decay"):
            return
        yield from gguf_moe_convert(name, data) or [(name, data)]

    def config_from_gguf(self, meta, shapes, tensors):
        """minimax-01.cpp load_arch_hparams: the RMS eps, ``residual_scale`` (every alpha;
        betas 1), the recurrent layers (the per-layer array, else every layer but each
        ``full_attention_interval``-th, default 8); the experts route by softmax,
        renormalised (build_moe_ffn norm_w = true), width n_ff."""

        hp = read_hparams(meta)
        n = hp.n_layer
        recr = meta.get_per_layer("attention.recurrent_layers", n, None)
        if recr[0] is None:
            interval = int(meta.get("full_attention_interval", LC_FULL_ATTN_INTERVAL))
            recr = [(i + 1) % interval != 0 for i in range(n)]
        kw = llama_like_config(self, meta, shapes, hp, moe=True)
        n_exp, n_used = experts(meta, hp, self.name)
        alpha = meta.get_f32("residual_scale")
        kw.update(rms_norm_eps=meta.get_f32("attention.layer_norm_rms_epsilon"), num_local_experts=n_exp,
                  num_experts_per_tok=n_used, router_jitter_noise=0.0, block_size=256,
                  layer_types=["linear_attention" if r else "full_attention" for r in recr],
                  full_attn_alpha_factor=alpha, linear_attn_alpha_factor=alpha, mlp_alpha_factor=alpha,
                  full_attn_beta_factor=1.0, linear_attn_beta_factor=1.0, mlp_beta_factor=1.0)
        return kw


class _MiniMaxNames:
    """HF (transformers 5) name -> GGUF name for minimax-01 (``get_name`` as gguf's
    TensorNameMap answers it)."""

    _MODEL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    _LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
              "self_attn.output_gate": "attn_gate", "self_attn.norm": "attn_norm_2",
              "self_attn.out_proj": "attn_output", "mlp.gate": "ffn_gate_inp",
              "mlp.experts.gate_proj": "ffn_gate_exps", "mlp.experts.up_proj": "ffn_up_exps",
              "mlp.experts.down_proj": "ffn_down_exps"}
    _RE = re.compile(r"model\.layers\.(\d+)\.(.+)")

    def get_name(self, name: str, try_suffixes=(".weight", ".bias")):
        for suf in try_suffixes:
            if name.endswith(suf):
                base = name[: -len(suf)]
                m = self._RE.fullmatch(base)
                if m and m.group(2) in self._LAYER:
                    return f"blk.{m.group(1)}.{self._LAYER[m.group(2)]}{suf}"
                if base in self._MODEL:
                    return self._MODEL[base] + suf
        return None


FAMILY = MiniMax()
