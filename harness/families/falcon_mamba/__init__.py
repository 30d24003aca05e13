"""falcon_mamba: Mamba-1 with RMS norms on dt / B / C (HF ``FalconMambaForCausalLM``,
modeling_falcon_mamba.py; llama.cpp arch ``mamba`` with ``ssm.dt_b_c_rms`` = true,
mamba-base.cpp ``build_mamba_layer``; converter conversion/mamba.py ``MambaModel``, which
writes the key for model_type falcon_mamba).

The layer is family mamba's (harness/families/mamba) plus, right after ``x_proj``'s
split, HF ``FalconMambaMixer``'s ``dt_layernorm`` / ``b_layernorm`` / ``c_layernorm``
(``FalconMambaWeightlessRMSNorm``: ``x * rsqrt(mean(x^2) + mixer_rms_eps)``, no
weight); build_mamba_layer's ``ssm_dt_b_c_rms`` branch: ``build_norm(dt / B / C,
NULL, ..., LLM_NORM_RMS)`` at the file's ``attention.layer_norm_rms_epsilon`` (no key
holds HF's ``mixer_rms_eps``). The contract's ``bc_norm`` (a weightless RMS spec).

Tiny config: family mamba's, ``mixer_rms_eps`` HF's default 1e-6 (the file's eps is
``layer_norm_epsilon``, 1e-5: findings.toml). A file read back (``--gguf``) keeps HF's
default too, as transformers' GGUF loader does: no key holds it, and the checkpoints'
own is that default.
"""

from __future__ import annotations

from contract.layers import NormSpec

from ..mamba import Mamba


class FalconMamba(Mamba):
    name = "falcon_mamba"
    hf_model_type = "falcon_mamba"
    description = "Mamba-1 with weightless RMS norms on dt / B / C (FalconMambaMixer, ssm.dt_b_c_rms)"
    tiny = {**Mamba.tiny, "mixer_rms_eps": 1e-6}
    _bc_norm = True

    def _bc_norm_spec(self, config) -> NormSpec:
        """FalconMambaMixer.__init__: ``FalconMambaWeightlessRMSNorm(..., eps=config.mixer_rms_eps)``."""
        return NormSpec("rms", float(config.mixer_rms_eps))


FAMILY = FalconMamba()
