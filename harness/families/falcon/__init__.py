"""falcon: a fused QKV in KV groups (MQA by default), LayerNorm with bias, neox
RoPE and a parallel attention / FFN block (HF ``FalconForCausalLM``; llama.cpp
``src/models/falcon.cpp``, converter ``conversion/falcon.py`` ``FalconModel``).

HF (``modeling_falcon.py``):
- ``FalconAttention.__init__``: the fused ``query_key_value`` has ``(n_head + 2 *
  n_kv) * head_dim`` rows -- ``n_kv`` is ``config.num_kv_heads`` with
  ``new_decoder_architecture`` (Falcon-40B), 1 under ``multi_query`` (Falcon-7B,
  the default), else ``n_head``; ``bias`` (default False) on it and on ``dense``.
- ``FalconAttention._split_heads``: the rows run in KV groups, ``n_head / n_kv``
  queries then one key then one value per group (``view(..., n_kv, n_head / n_kv +
  2, head_dim)``); the MQA form is the one-group case, the old MHA form
  (``view(..., n_head, 3, head_dim)``) the ``n_kv = n_head`` one.
- ``FalconAttention.forward`` (no ALiBi): ``apply_rotary_pos_emb`` (rotate-half,
  whole head), ``softmax(q.k^T / sqrt(head_dim) + mask)`` inline -- no
  ``eager_attention_forward``: ``hf_taps`` records the rotated Q / K
  (``apply_rotary_pos_emb``'s outputs), the probabilities (the module's second
  output) and the merged heads (``dense``'s input).
- ``FalconDecoderLayer``: ``parallel_attn`` (default True): the FFN reads the same
  normed input -- ``input_layernorm``, or ``ln_attn`` / ``ln_mlp`` with
  ``num_ln_in_parallel_attn == 2`` (new_decoder_architecture) -- and ``x + attn +
  mlp``.
- ``FalconConfig.__post_init__``: ``num_kv_heads = num_attention_heads`` when unset
  -- also under ``multi_query``, where the attention uses ONE: a saved
  ``config.json`` says ``num_kv_heads = n_head`` for a multi-query model.

llama.cpp (``falcon.cpp``): ``LLM_NORM`` ``attn_norm`` (the FFN's) and the optional
``attn_norm_2`` (the attention's: ``ln_attn``), ``build_qkv`` views of ``wqkv``
(no bias slot, no ``wo_b``), NEOX RoPE over the whole head, ``kq_scale =
1/sqrt(head_dim)``, ``l_out = ffn(attn_norm) + attn + inpL`` always (no name for
``wo``'s product, no residual between).

Converter (``FalconModel``): ``context_length`` 2048 always ("not in config.json"),
``feed_forward_length = 4 * hidden``, ``head_count_kv`` = ``config.num_kv_heads``
(else 1) -- read from the saved config, that is ``n_head`` for a multi-query
model, which gives a file llama.cpp refuses (``wqkv`` is smaller than
``n_embd + 2 * n_embd_gqa``): the export writes the heads the attention uses
(``kv_heads_from_saved_config`` False; a test shows the other side); the QKV
rows reordered from KV groups to ``[Q; K; V]``; no ``rope.freq_base`` (llama.cpp
rotates at 10000: a finding for any other ``rope_theta``).
"""

from __future__ import annotations

import contextlib

import numpy as np

from contract.layers import LayerConfig, NormSpec, ConfigError

from .._gguf_import import read_hparams, refuse_experts, special_tokens, vocab_of
from ..base import Family, LcCapture, LcPoint, Point, rope_from_config, tensor
from harness.lazy import lazy
from harness.references.hf.capture import _to_np

modeling_falcon = lazy("transformers.models.falcon.modeling_falcon")

# conversion/falcon.py FalconModel.set_gguf_parameters: add_context_length(2048), "not in config.json"
CONVERTER_CONTEXT = 2048


def kv_heads(config) -> int:
    """The KV heads HF's FalconAttention uses (``self.num_kv_heads``)."""
    if config.new_decoder_architecture or not config.multi_query:
        return int(config.num_kv_heads)
    return 1


def group_qkv_to_blocks(data: np.ndarray, n_head: int, n_kv: int) -> np.ndarray:
    """conversion/falcon.py ``FalconModel.modify_tensors``: fused rows in ``n_kv`` groups
    of ``n_head / n_kv`` queries, a key and a value -> ``[Q; K; V]``. Layout only."""
    d = data.shape[0] // (n_head + 2 * n_kv)
    g = data.reshape(n_kv, n_head // n_kv + 2, d, *data.shape[1:])
    q = g[:, :-2].reshape(n_head * d, *data.shape[1:])
    k = g[:, -2].reshape(n_kv * d, *data.shape[1:])
    v = g[:, -1].reshape(n_kv * d, *data.shape[1:])
    return np.concatenate([q, k, v], axis=0)


class Falcon(Family):
    name = "falcon"
    hf_model_type = "falcon"
    description = "fused QKV in KV groups (MQA), LayerNorm, neox RoPE, parallel block"
    tiny = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=256, layer_norm_epsilon=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    gguf_arch = "falcon"
    fuzz_space = {"knobs": ("heads_hidden",)}
    layers_path = "transformer.h"
    size_keys = {"hidden": "hidden_size", "heads": "num_attention_heads", "layers": "num_hidden_layers"}
    hf_model_points = {"embeddings": ("transformer.word_embeddings", "out"), "final_norm": ("transformer.ln_f", "out")}
    _reorder_qkv = True  # what the converter does; a test switches it off
    _kv_heads_from_saved_config = False  # True: the converter's reading of a saved config (module docstring)
    eager_name = "-"  # FalconAttention has no eager function: hf_taps reads the probes
    _qkv = Point("self_attention.query_key_value", "out")
    hf_points = {
        "layer_in": Point("", "in"),
        "attn_in": Point("self_attention", "in"),
        "q": _qkv, "k": _qkv, "v": _qkv,
        "attn_branch": Point("self_attention.dense", "in"),
        "attn_out": Point("self_attention.dense", "out"),
        "layer_out": Point("", "out"),
    }
    switch_params = {"qkv_bias": ("query_key_value.bias",), "o_bias": ("self_attention.dense.bias",)}

    def _two_norms(self, config) -> bool:
        # FalconDecoderLayer.__init__: num_ln_in_parallel_attn defaults to 2 with the new architecture
        n = config.num_ln_in_parallel_attn
        return bool(config.new_decoder_architecture) and (n is None or n == 2)

    def lc_points_for(self, config, i: int):
        pts = {k: v for k, v in LcCapture.lc_points.items() if k not in ("attn_out", "resid_mid")}
        if self._two_norms(config):  # falcon.cpp: the attention reads attn_norm_2 (ln_attn)
            pts["attn_in"] = LcPoint("attn_norm_2")
        return pts

    def layer_config(self, config, i: int) -> LayerConfig:
        if config.alibi:
            # FalconAttention.forward: (q.k^T + alibi) * inv_norm_factor -- the bias scaled with the
            # scores, which impl's ALiBi (added after the scale) is not; falcon.cpp has no ALiBi
            raise ConfigError("falcon with alibi=true is not expressible in impl (HF scales the ALiBi bias by "
                              "1/sqrt(head_dim) with the scores) nor in llama.cpp's falcon graph; valid: alibi=false")
        if not config.parallel_attn:
            pass  # sequential: HF's post_attention_layernorm; llama.cpp's falcon graph is always parallel
        h, nh = config.hidden_size, config.num_attention_heads
        d = h // nh
        return LayerConfig(
            hidden_size=h, n_heads=nh, n_kv_heads=kv_heads(config), head_dim=d,
            input_norm=NormSpec("layer", config.layer_norm_epsilon),  # input_layernorm / ln_attn
            rope=rope_from_config(config, layout="neox", head_dim=d),
            residual="parallel" if config.parallel_attn else "sequential",
        )

    def hf_points_for(self, config, i: int):
        if config.parallel_attn:
            return self.hf_points
        return {**self.hf_points, "resid_mid": Point("post_attention_layernorm", "in")}

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        layer = self.decoder_layers(model)[i]
        nh, nkv = config.num_attention_heads, kv_heads(config)
        norm = "ln_attn" if self._two_norms(config) else "input_layernorm"
        w = {"attn_norm": tensor(layer, f"{norm}.weight"), "attn_norm_b": tensor(layer, f"{norm}.bias"),
             "wo": tensor(layer, "self_attention.dense.weight")}
        blocks = group_qkv_to_blocks(tensor(layer, "self_attention.query_key_value.weight"), nh, nkv)
        d = config.hidden_size // nh
        w["wq"], w["wk"], w["wv"] = np.split(blocks, [nh * d, (nh + nkv) * d])
        b = tensor(layer, "self_attention.query_key_value.bias")
        if b is not None:
            w["bq"], w["bk"], w["bv"] = np.split(group_qkv_to_blocks(b, nh, nkv), [nh * d, (nh + nkv) * d])
        bo = tensor(layer, "self_attention.dense.bias")
        if bo is not None:
            w["bo"] = bo
        return w

    # ------------------------------------------------------------------ HF probes
    def hf_taps(self, model, config, sink: dict):
        """FalconAttention computes inline: the rotated Q / K are what
        ``apply_rotary_pos_emb`` returns (patched for the forward, the layer named
        by a pre-hook on the attention module), the probabilities its second output,
        the merged heads ``dense``'s input."""

        @contextlib.contextmanager
        def taps():
            current = {}
            orig = modeling_falcon.apply_rotary_pos_emb

            def rope(q, k, cos, sin, *a, **kw):
                qe, ke = orig(q, k, cos, sin, *a, **kw)
                rec = sink.setdefault(current["i"], {})
                rec["q_rope"], rec["k_rope"] = _to_np(qe), _to_np(ke)
                return qe, ke

            handles = []
            for i, layer in enumerate(self.decoder_layers(model)):
                def pre(mod, args, i=i):
                    current["i"] = i

                def post(mod, args, out, i=i):
                    if out[1] is not None:
                        sink.setdefault(i, {})["attn_probs"] = _to_np(out[1])

                def heads(mod, args, i=i):
                    sink.setdefault(i, {})["attn_heads"] = _to_np(args[0])

                handles += [layer.self_attention.register_forward_pre_hook(pre),
                            layer.self_attention.register_forward_hook(post),
                            layer.self_attention.dense.register_forward_pre_hook(heads)]
            modeling_falcon.apply_rotary_pos_emb = rope
            try:
                yield
            finally:
                modeling_falcon.apply_rotary_pos_emb = orig
                for hd in handles:
                    hd.remove()

        return taps()

    def hf_canonical(self, probe, arr, lc):
        s, t = arr.shape[0], arr.shape[1] if arr.ndim > 1 else None
        h, hkv, d = lc.n_heads, lc.n_kv_heads, lc.head_dim
        if probe in ("q", "k", "v") and arr.ndim == 3:
            # FalconAttention._split_heads: view(..., n_kv, n_head / n_kv + 2, head_dim)
            g = arr.reshape(s, t, hkv, h // hkv + 2, d)
            if probe == "q":
                return g[:, :, :, :-2].reshape(s, t, h, d)
            return g[:, :, :, -2 if probe == "k" else -1]
        if probe == "k_rope" and arr.shape[1] == h and hkv != h:
            # the new architecture broadcasts each group's key to its queries before RoPE
            # (_split_heads: torch.broadcast_to(key, query.shape)): one per group
            arr = arr.reshape(s, hkv, h // hkv, arr.shape[2], d)[:, :, 0]
        if probe in ("q_rope", "k_rope"):  # [S, heads, T, D]
            return arr.transpose(0, 2, 1, 3)
        if probe == "attn_heads":  # dense's input: (B, T, n_head * head_dim)
            return arr.reshape(s, t, h, d)
        return arr

    # ------------------------------------------------------------------ GGUF
    def _gguf_head_count_kv(self, config) -> int:
        # FalconModel.set_gguf_parameters: hparams.get("num_kv_heads") or n_head_kv or 1
        return int(config.num_kv_heads) if self._kv_heads_from_saved_config else kv_heads(config)

    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/falcon.py FalconModel.set_gguf_parameters (no TextModel super call)
        w.add_context_length(CONVERTER_CONTEXT)  # "not in config.json"
        w.add_tensor_data_layout("jploski")  # qkv tensor transform
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(4 * config.hidden_size)
        w.add_block_count(config.num_hidden_layers)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(self._gguf_head_count_kv(config))
        w.add_layer_norm_eps(config.layer_norm_epsilon)

    def gguf_convert(self, name, data, config, variant=None):
        if self._reorder_qkv and "query_key_value" in name:
            data = group_qkv_to_blocks(data, config.num_attention_heads, self._gguf_head_count_kv(config))
        yield name, np.ascontiguousarray(data)

    def config_from_gguf(self, meta, shapes, tensors):
        """falcon.cpp load_arch_hparams: the LayerNorm eps; the sizes and KV heads from
        load_hparams. HF's config for the file: the new architecture where there are
        KV groups other than one (or attn_norm_2, ln_attn), multi-query for one,
        the old MHA form for n_head."""
        hp = read_hparams(meta)
        refuse_experts(meta, hp, self.name)
        meta.get("general.tensor_data_layout", None)
        d = hp.n_embd // hp.head
        if hp.n_embd_head_k != d or hp.n_rot != d:
            meta.refuse("rope.dimension_count", hp.n_rot, f"HF Falcon rotates the whole head of hidden / heads = {d}")
        if hp.rope_scaling_type not in ("none", "linear") or hp.rope_freq_scale != 1.0 or hp.rope_attn_factor != 1.0:
            meta.refuse("rope.scaling.type", hp.rope_scaling_type, "RoPE scaling; the falcon converter writes none")
        two = "blk.0.attn_norm_2.weight" in shapes
        kw = {"hidden_size": hp.n_embd, "num_hidden_layers": hp.n_layer, "num_attention_heads": hp.head,
              "num_kv_heads": hp.head_kv, "max_position_embeddings": hp.n_ctx_train,
              "layer_norm_epsilon": meta.get_f32("attention.layer_norm_epsilon"),
              "rope_parameters": {"rope_type": "default", "rope_theta": hp.rope_freq_base},
              "bias": False, "parallel_attn": True, "alibi": False,
              # falcon.cpp sizes ffn_up / ffn_down from feed_forward_length; HF FalconMLP's
              # width is ffn_hidden_size (default 4 * hidden, all the converter writes)
              "ffn_hidden_size": hp.ff}
        if two or hp.head_kv not in (1, hp.head):
            kw.update(new_decoder_architecture=True, multi_query=True, num_ln_in_parallel_attn=2 if two else 1)
        else:
            kw.update(new_decoder_architecture=False, multi_query=hp.head_kv == 1)
        vocab = vocab_of(meta, shapes)
        kw.update(vocab_size=vocab, tie_word_embeddings="output.weight" not in shapes, **special_tokens(meta, vocab))
        return kw


FAMILY = Falcon()
