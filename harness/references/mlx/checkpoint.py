"""The checkpoint mlx-lm reads: config.json as the model hub holds it.

transformers 5 writes a config's RoPE as ``rope_parameters`` (one dict, or one per
layer type); the checkpoints on the hub, written by transformers 4 or by their
authors, carry ``rope_theta`` and ``rope_scaling`` at the top level, and mlx-lm's
``ModelArgs`` read those (``mlx_lm/models/<type>.py``: ``rope_theta: float``, a
required field in most). The saved config.json is given the hub's keys beside
transformers 5's own -- values taken from the config itself, nothing invented:
what a user's download of such a model holds. A model whose ``ModelArgs`` still
lacks a required field is refused by mlx-lm itself (its error row says which).
"""

from __future__ import annotations

import json
from pathlib import Path


def _legacy_rope(rp: dict) -> tuple[float | None, dict | None]:
    theta = rp.get("rope_theta")
    kind = rp.get("rope_type", "default")
    if kind in (None, "default"):
        return theta, None
    scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    scaling.update(type=kind, rope_type=kind)
    return theta, scaling


# a field mlx-lm's ModelArgs requires, under the name the hub's checkpoints of that model
# use, and the transformers 5 config key (or rule) it has the same value as
ALIASES = {
    "num_layers": ("num_hidden_layers",),
    "layer_norm_epsilon": ("layer_norm_eps", "rms_norm_eps"),
    "n_ctx": ("n_positions", "max_position_embeddings"),
    # GPT-NeoX's hub names for its RoPE base and rotated fraction (mlx_lm/models/gpt_neox.py)
    "rotary_emb_base": ("rope_theta",),
    "rotary_pct": ("partial_rotary_factor",),
    # transformers 5 renamed the MoE families' expert count (Qwen3MoeConfig: num_local_experts)
    "num_experts": ("num_local_experts",),
    # Mamba-2's inner width, which its hub configs spell out (expand x hidden_size)
    "intermediate_size": (lambda c: c["expand"] * c["hidden_size"] if c.get("expand") and c.get("hidden_size")
                          else None,),
    "head_dim": (lambda c: c.get("head_dim") or (c["hidden_size"] // c["num_attention_heads"]
                                                  if c.get("hidden_size") and c.get("num_attention_heads") else None),),
}


def bridged(cfg: dict) -> dict:
    """``cfg`` (a config.json's dict, as transformers 5 writes it) with the hub's keys beside."""
    cfg = json.loads(json.dumps(cfg))
    for c in [cfg, cfg.get("text_config") or {}]:
        rp = c.get("rope_parameters")
        if not isinstance(rp, dict):
            continue
        full = rp  # the dict that holds the global layers' RoPE
        if "rope_theta" in rp or "rope_type" in rp:
            theta, scaling = _legacy_rope(rp)
        else:  # one per layer type (gemma3, ...): the global layers' at the top, the local base beside
            full = rp.get("full_attention") or next(iter(rp.values()), {})
            theta, scaling = _legacy_rope(full)
            local = rp.get("sliding_attention")
            if isinstance(local, dict) and "rope_theta" in local:
                c.setdefault("rope_local_base_freq", local["rope_theta"])
        if theta is not None and c.get("rope_theta") is None:
            c["rope_theta"] = theta
        if c.get("rope_scaling") is None:
            c["rope_scaling"] = scaling
        # the scaled RoPEs' own settings sit beside rope_scaling on the hub (Phi-3's
        # original_max_position_embeddings, the partial rotary factor)
        for key in ("partial_rotary_factor", "original_max_position_embeddings"):
            src = rp if key in rp else (full if isinstance(full, dict) else {})
            if key in src and c.get(key) is None:
                c[key] = src[key]
    # the hub's period of sliding and global layers (Cohere2, Gemma3: `sliding_window_pattern`,
    # the global layer last in each period), where transformers 5 writes the list `layer_types`
    lt = cfg.get("layer_types")
    if isinstance(lt, list) and lt and "sliding_window_pattern" not in cfg and "full_attention" in lt:
        p = lt.index("full_attention") + 1
        if all(t == ("full_attention" if (i + 1) % p == 0 else "sliding_attention") for i, t in enumerate(lt)):
            cfg["sliding_window_pattern"] = p
    for field, sources in ALIASES.items():
        if field in cfg:
            continue
        for src in sources:
            v = src(cfg) if callable(src) else cfg.get(src)
            if v is not None:
                cfg[field] = v
                break
    return cfg


def hub_config(path: Path) -> dict:
    """Rewrite ``path`` (a config.json transformers 5 saved) with the hub's keys beside
    its own (``bridged``); returns the config."""
    cfg = bridged(json.loads(path.read_text()))
    path.write_text(json.dumps(cfg, indent=2))
    return cfg


def missing_fields(cfg: dict, model_type: str) -> list[str]:
    """The fields mlx-lm's ModelArgs of ``model_type`` requires (no default) that the
    bridged config does not hold: mlx-lm cannot build the model from it."""
    import dataclasses
    import importlib

    args = getattr(importlib.import_module(f"mlx_lm.models.{model_type}"), "ModelArgs", None)
    if args is None or not dataclasses.is_dataclass(args):
        return []
    b = bridged(cfg)
    need = [f.name for f in dataclasses.fields(args)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    return [n for n in need if n not in b and n not in (b.get("text_config") or {})]
