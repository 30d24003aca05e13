"""stablelm: LayerNorm with bias, partial neox RoPE, optional QKV biases, optional
per-head QK LayerNorms (one ``nn.LayerNorm`` per head), sequential or parallel
block (HF ``StableLmForCausalLM``; llama.cpp ``src/models/stablelm.cpp``,
converter ``conversion/stablelm.py`` ``StableLMModel``).

HF (``modeling_stablelm.py``):
- ``StableLmAttention``: ``q_proj`` / ``k_proj`` / ``v_proj`` with bias iff
  ``use_qkv_bias``, ``o_proj`` without; ``qk_layernorm`` (default False):
  ``StableLmLayerNormPerHead`` -- a ``ModuleList`` of ``nn.LayerNorm(head_dim,
  bias=False)``, head ``h`` normalised by norm ``h`` (``torch.split(x, 1, dim=1)``)
  --, before RoPE; RoPE rotates the leading ``head_dim * partial_rotary_factor``
  channels (default 0.25) rotate-half.
- ``StableLmDecoderLayer``: ``input_layernorm`` (LayerNorm, bias); sequential with
  ``post_attention_layernorm`` unless ``use_parallel_residual`` (default False):
  then ``x + attn(ln(x)) + mlp(ln(x))`` and no ``post_attention_layernorm`` at all.

llama.cpp (``stablelm.cpp``): ``LLM_NORM`` with bias, ``attn_q_norm {n_embd_head_k,
n_head}`` / ``attn_k_norm`` optional (LLM_NORM, no bias, before NEOX RoPE over
``n_rot``), no ``wo_b``; the block is parallel iff the file has no ``ffn_norm``
(``cur = inpSA``) -- ``use_parallel_residual``, which the converter writes, is read
by nothing (not in stablelm.cpp's keys). ``ffn_inp = attn + inpL`` is named in both
forms; HF has no such residual in the parallel one. The QK-normed Q / K are named
``Qcur`` / ``Kcur`` too: ``q`` / ``k`` are read at ``build_qkv``'s reshape.

Converter (``StableLMModel``): ``rope.dimension_count = int(partial_rotary_factor *
head_size)``, ``use_parallel_residual``, the LayerNorm eps; ``_stack_qk_norm``
stacks the per-head norm weights into ``[n_head, head_dim]`` (mirrored here with
per-head pieces named ``<tensor>#<head>``, stacked in ``gguf_tensors`` and split
again for ``--gguf``).
"""

from __future__ import annotations

import re

import numpy as np

from contract.layers import NormSpec, QkNormSpec

from .._gguf_import import llama_like_config, read_hparams
from ..base import LlamaLike, LcCapture, LcPoint, tensor

_PER_HEAD = re.compile(r"(model\.layers\.\d+\.self_attn\.[qk]_layernorm)\.norms\.(\d+)\.weight$")
_PIECE = re.compile(r"(.+)#(\d+)$")


class _PieceMap:
    """gguf's tensor-name map, with ``name#h`` (one head's piece of a stacked tensor)
    named as ``name``'s GGUF tensor plus ``#h``."""

    def __init__(self, tmap):
        self.tmap = tmap

    def get_name(self, name, try_suffixes=()):
        m = _PIECE.match(name)
        if m is None:
            return self.tmap.get_name(name, try_suffixes=try_suffixes)
        base = self.tmap.get_name(m.group(1), try_suffixes=try_suffixes)
        return None if base is None else f"{base}#{m.group(2)}"


class StableLm(LlamaLike):
    name = "stablelm"
    hf_model_type = "stablelm"
    description = "LayerNorm, partial neox RoPE, per-head QK LayerNorm (one norm per head), parallel or sequential"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, layer_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        qk_layernorm=True, use_qkv_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )
    gguf_arch = "stablelm"
    fuzz_space = {"knobs": ("heads",)}
    input_norm_kind = "layer"  # StableLmDecoderLayer.input_layernorm: nn.LayerNorm (weight and bias)
    extra_settable = ()
    lc_points = {**{k: v for k, v in LlamaLike.lc_points.items() if k != "attn_out"},
                 # stablelm.cpp: the QK-normed Q / K are named "Qcur" / "Kcur" too: q / k are build_qkv's
                 # reshape (after the bias, before the norm)
                 "q": LcPoint("Qcur", "op:RESHAPE", "heads"), "k": LcPoint("Kcur", "op:RESHAPE", "heads")}
    weight_map = {**LlamaLike.weight_map, "input_layernorm.bias": "attn_norm_b"}
    switch_modules = {**LlamaLike.switch_modules, "qk_norm": ("self_attn.q_layernorm", "self_attn.k_layernorm")}
    qk_norm_names = LlamaLike.qk_norm_names + ("q_layernorm.norms", "k_layernorm.norms")
    # a test writes the use_parallel_residual key inverted, to show llama.cpp never reads it
    _invert_parallel_residual_key = False

    def norm_eps(self, config) -> float:
        return config.layer_norm_eps

    def head_dim(self, config) -> int:
        return config.hidden_size // config.num_attention_heads

    def _parallel(self, config) -> bool:
        return bool(config.use_parallel_residual)

    def hf_points_for(self, config, i: int):
        if self._parallel(config):
            return {k: v for k, v in self.hf_points.items() if k != "resid_mid"}
        return self.hf_points

    def lc_points_for(self, config, i: int):
        if self._parallel(config):  # HF has no residual between: ffn_inp is llama.cpp's alone
            return {k: v for k, v in self.lc_points.items() if k != "resid_mid"}
        return {**self.lc_points, "resid_mid": LcCapture.lc_points["resid_mid"]}

    def layer_config(self, config, i: int):
        lc = super().layer_config(config, i).replace(residual="parallel" if self._parallel(config) else "sequential")
        if config.qk_layernorm:
            # StableLmLayerNormPerHead: nn.LayerNorm(head_dim, bias=False) per head
            lc = lc.replace(qk_norm=QkNormSpec(NormSpec("layer", config.layer_norm_eps), "head", "pre_rope",
                                               per_head=True))
        return lc

    def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
        w = super().layer_weights(model, config, i)
        if config.qk_layernorm:
            attn = self.decoder_layers(model)[i].self_attn
            for ours, mod in (("q_norm", attn.q_layernorm), ("k_norm", attn.k_layernorm)):
                norms = getattr(mod, "norms", None)  # None: switched off (feature bisection's identity)
                if norms is not None:
                    w[ours] = np.stack([tensor(n, "weight") for n in norms])  # [heads, head_dim]
        return w

    # ------------------------------------------------------------------ GGUF
    def gguf_params(self, w, config, variant=None) -> None:
        # conversion/stablelm.py StableLMModel.set_gguf_parameters (no TextModel super call)
        h, nh = config.hidden_size, config.num_attention_heads
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(h)
        w.add_block_count(config.num_hidden_layers)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_rope_dimension_count(int(config.rope_parameters["partial_rotary_factor"] * (h // nh)))
        w.add_head_count(nh)
        w.add_head_count_kv(config.num_key_value_heads)
        w.add_parallel_residual(bool(config.use_parallel_residual) != self._invert_parallel_residual_key)
        w.add_layer_norm_eps(config.layer_norm_eps)

    def gguf_tensor_map(self, config):
        return _PieceMap(super().gguf_tensor_map(config))

    def gguf_convert(self, name, data, config, variant=None):
        m = _PER_HEAD.search(name)
        if m:  # one head's norm: a piece of StableLMModel._stack_qk_norm's [n_head, head_dim]
            yield f"{m.group(1)}.weight#{m.group(2)}", data[None]
            return
        yield from super().gguf_convert(name, data, config, variant)

    def gguf_tensors(self, model, config, variant=None):
        pieces: dict[str, dict[int, np.ndarray]] = {}
        for name, data in super().gguf_tensors(model, config, variant):
            m = _PIECE.match(name)
            if m is None:
                yield name, data
                continue
            pieces.setdefault(m.group(1), {})[int(m.group(2))] = data
        for name, heads in pieces.items():  # StableLMModel._stack_qk_norm: torch.stack(heads, dim=0)
            yield name, np.concatenate([heads[h] for h in range(len(heads))], axis=0)

    def gguf_import_prepare(self, tensors, config):
        tensors = dict(super().gguf_import_prepare(tensors, config))
        for name in [n for n in tensors if re.search(r"\.attn_[qk]_norm\.weight$", n)]:
            get = tensors.pop(name)
            n_heads = (config.num_attention_heads if ".attn_q_norm" in name else config.num_key_value_heads)
            for h in range(n_heads):
                tensors[f"{name}#{h}"] = (lambda get=get, h=h: np.asarray(get())[h:h + 1])
        return tensors

    def config_from_gguf(self, meta, shapes, tensors):
        """stablelm.cpp load_arch_hparams: the LayerNorm eps; the QK norms, the biases
        and the block form are what the file carries (no ffn_norm: parallel)."""
        hp = read_hparams(meta)
        d = hp.n_embd // hp.head
        rp = {"rope_type": "default", "rope_theta": hp.rope_freq_base, "partial_rotary_factor": hp.n_rot / d}
        kw = llama_like_config(self, meta, shapes, hp, rotary=False, rope=rp)
        # use_parallel_residual: stablelm.cpp never reads it (listed as ignored); the block is
        # parallel iff the file has no ffn_norm
        kw.update(layer_norm_eps=meta.get_f32("attention.layer_norm_epsilon"),
                  qk_layernorm="blk.0.attn_q_norm.weight" in shapes,
                  use_qkv_bias="blk.0.attn_q.bias" in shapes,
                  use_parallel_residual="blk.0.ffn_norm.weight" not in shapes)
        return kw


FAMILY = StableLm()
