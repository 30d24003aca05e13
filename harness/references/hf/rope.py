"""HF's RoPE tables with a GGUF's ``rope_freqs`` divided in (``--gguf`` files
whose per-pair factors no HF RoPE type computes from the config)."""

from __future__ import annotations

from harness.lazy import lazy

torch = lazy("torch")


def apply_freq_factors(model, config) -> None:
    """HF's RoPE table divided, pair by pair, by the file's ``rope_freqs``
    (``config.rope_parameters["freq_factors"]``, set where no HF RoPE type
    reproduces them): llama.cpp's ``ggml_rope_ext`` rotates pair i by
    ``pos * theta_i / ff_i``; HF's rotary embedding reads its ``inv_freq`` buffer."""

    factors = (getattr(config, "rope_parameters", None) or {}).get("freq_factors")
    if factors is None:
        return
    ff = torch.tensor([float(f) for f in factors], dtype=torch.float32)
    for mod in model.modules():
        inv = getattr(mod, "inv_freq", None)
        if isinstance(inv, torch.Tensor) and inv.shape == ff.shape:
            mod.inv_freq = inv / ff.to(inv.dtype)
            if hasattr(mod, "original_inv_freq"):
                mod.original_inv_freq = mod.inv_freq.clone()
