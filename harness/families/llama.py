"""llama: the plain decoder (HF ``LlamaForCausalLM``; llama.cpp ``src/models/llama.cpp``).

GQA, neox RoPE, RMS input norm, no biases by default (``attention_bias`` turns
all four on, HF ``LlamaAttention.__init__``).

llama.cpp runs llama with ``LLAMA_ROPE_TYPE_NORM`` (interleaved pairs), so the
converter permutes the rows of ``q_proj`` / ``k_proj`` (and their biases) per
head (``conversion/llama.py``, ``LlamaModel.permute``, applied in
``modify_tensors`` when ``undo_permute``): HF channel ``j * D/2 + i`` becomes
llama.cpp channel ``2i + j``. The interleaved rotation of the permuted
channels is the neox rotation of the original ones. The capture undoes the
permutation on Q and K so they compare channel for channel.
"""

import math

import numpy as np

from .base import LlamaLike


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """conversion/llama.py LlamaModel.permute: rows (h, j, i) -> (h, i, j)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of ``permute_rows``: rows (h, i, j) -> (h, j, i), for reading a
    converted GGUF back (``--gguf``)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_heads(a: np.ndarray) -> np.ndarray:
    """The inverse on activations ``[..., heads, D]``: channel 2i+j -> j*D/2+i."""
    d = a.shape[-1]
    return a.reshape(*a.shape[:-1], d // 2, 2).swapaxes(-1, -2).reshape(a.shape)


def llama3_rope_factors(config) -> np.ndarray | None:
    """conversion/llama.py ``LlamaModel.generate_extra_tensors``: llama3 RoPE scaling
    reaches llama.cpp as a ``rope_freqs`` tensor of per-pair frequency divisors
    (llama.cpp: ``model.get_rope_factors`` -> ``ggml_rope_ext``'s freq_factors)."""
    rp = dict(config.rope_parameters or {})
    rp = rp.get("full_attention", rp)
    if str(rp.get("rope_type", "")).lower() != "llama3":
        return None
    base = rp.get("rope_theta", 10000.0)
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rp.get("factor", 8.0)
    low, high = rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


class Llama(LlamaLike):
    name = "llama"
    hf_model_type = "llama"
    description = "plain GQA decoder, neox RoPE"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    gguf_arch = "llama"
    permute_qk = True  # what the converter does; tests break it to show the capture notices

    def gguf_transform(self, name, data, config):
        if self.permute_qk:
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                return permute_rows(data, config.num_attention_heads)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                return permute_rows(data, config.num_key_value_heads)
        return data

    def gguf_untransform(self, name, data, config):
        # the inverse of gguf_transform: a GGUF from llama.cpp's converter carries
        # LlamaModel.permute'd Q/K rows (conversion/llama.py modify_tensors, undo_permute)
        if self.permute_qk:
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                return unpermute_rows(data, config.num_attention_heads)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                return unpermute_rows(data, config.num_key_value_heads)
        return data

    def gguf_tensors(self, model, config, variant=None):
        yield from super().gguf_tensors(model, config, variant)
        factors = llama3_rope_factors(config)
        if factors is not None:
            yield "rope_freqs.weight", factors

    def gguf_import_tensors(self, tensors, model, config):
        # the base refuses a GGUF tensor it cannot place, rope_freqs included: llama3
        # scaling keeps only these factors in the file, not the parameters HF needs
        return super().gguf_import_tensors(tensors, model, config)

    def lc_canonical(self, probe, arr, lc, config):
        if probe in ("q", "k", "q_rope", "k_rope"):
            return unpermute_heads(arr)
        return super().lc_canonical(probe, arr, lc, config)


FAMILY = Llama()
