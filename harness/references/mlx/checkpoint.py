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

import inspect
import json
import re
from pathlib import Path
import dataclasses
import importlib
import numpy as np

from harness.lazy import lazy

safetensors_numpy = lazy("safetensors.numpy")


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


def periodic_layer_types(period: int, n_layers: int) -> list[str]:
    """The hub's layer pattern as transformers 5's ``layer_types``: every ``period``-th layer
    global, the rest sliding (Cohere2, Gemma3: ``sliding_window_pattern``) -- what mlx-lm's
    modules that read a period compute (mlx_lm/models/gemma3_text.py, cohere2.py)."""
    return ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n_layers)]


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
        if lt == periodic_layer_types(p, len(lt)):
            cfg["sliding_window_pattern"] = p
    # Gemma 4's global layers: transformers 5 saves their widths per layer (`per_layer_config`,
    # Gemma4TextConfig.__post_init__ pops `global_head_dim` / `num_global_key_value_heads` into
    # it); the hub's config.json and mlx-lm's ModelArgs (mlx_lm/models/gemma4_text.py) keep the
    # two keys
    for c in [cfg, cfg.get("text_config") or {}]:
        plc, types = c.get("per_layer_config"), c.get("layer_types")
        if isinstance(plc, dict) and isinstance(types, list):
            full = next((plc.get(str(i)) or plc.get(i) for i, t in enumerate(types)
                         if t == "full_attention" and (str(i) in plc or i in plc)), None) or {}
            for src, hub in (("head_dim", "global_head_dim"), ("num_key_value_heads", "num_global_key_value_heads")):
                if src in full and c.get(hub) is None:
                    c[hub] = full[src]
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

    args = getattr(importlib.import_module(f"mlx_lm.models.{model_type}"), "ModelArgs", None)
    if args is None or not dataclasses.is_dataclass(args):
        return []
    b = bridged(cfg)
    need = [f.name for f in dataclasses.fields(args)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    return [n for n in need if n not in b and n not in (b.get("text_config") or {})]


# -- the weights' layout ------------------------------------------------------------------
# Two families whose transformers 5 checkpoint mlx-lm's sanitize() does not read, though a
# user's download of the model does load: each rewrite gives the checkpoint the layout of
# such a download -- nothing computed, tensors moved, split and transposed only.

def _gpt_oss(cfg: dict, w: dict) -> tuple[dict, dict]:
    """GPT-OSS in the layout mlx-lm's own conversion writes (mlx_lm.convert saves the
    sanitized weights: the mlx-community checkpoints): the fused experts split into
    SwitchGLU's gate / up / down, each [experts, out, in]. mlx_lm/models/gpt_oss.py
    Model.sanitize reads only the hub's MXFP4 ``*_blocks`` (or these names, "already
    sanitized"); transformers 5 saves ``experts.gate_up_proj`` [E, hidden, 2 x inter] with
    gate and up interleaved on the last axis (GptOssExperts.forward: ``gate_up[..., ::2]``,
    ``gate_up[..., 1::2]``) and ``experts.down_proj`` [E, inter, hidden]."""

    out = {}
    for k, v in w.items():
        if k.endswith("experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            out[base + "gate_proj.weight"] = np.ascontiguousarray(v[..., ::2].transpose(0, 2, 1))
            out[base + "up_proj.weight"] = np.ascontiguousarray(v[..., 1::2].transpose(0, 2, 1))
        elif k.endswith("experts.gate_up_proj_bias"):
            base = k[: -len("gate_up_proj_bias")]
            out[base + "gate_proj.bias"] = np.ascontiguousarray(v[..., ::2])
            out[base + "up_proj.bias"] = np.ascontiguousarray(v[..., 1::2])
        elif k.endswith("experts.down_proj"):
            out[k + ".weight"] = np.ascontiguousarray(v.transpose(0, 2, 1))
        elif k.endswith("experts.down_proj_bias"):
            out[k[: -len("_bias")] + ".bias"] = v
        else:
            out[k] = v
    return cfg, out


def _llama4(cfg: dict, w: dict) -> tuple[dict, dict]:
    """Llama 4 as the hub holds it: Llama4ForConditionalGeneration, the text model under
    ``language_model.`` and its config as ``text_config`` (model_type ``llama4``). mlx-lm's
    ``llama4_text`` module (the text-only model type transformers' Llama4ForCausalLM saves)
    is a dense model with neither experts nor chunked windows; its ``llama4`` module
    (mlx_lm/models/llama4.py) is the one a download of Llama 4 runs, and its sanitize()
    splits the experts' ``gate_up_proj`` [E, hidden, 2 x inter] itself."""
    text = {**cfg, "model_type": cfg.get("model_type", "llama4_text")}
    wrapped = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "text_config": text}
    for key in ("tie_word_embeddings", "transformers_version", "dtype"):
        if key in cfg:
            wrapped[key] = cfg[key]
    return wrapped, {f"language_model.{k}": v for k, v in w.items()}


def _youtu(cfg: dict, w: dict) -> tuple[dict, dict]:
    """Youtu-LLM as the hub holds it: its remote code's model type ``youtu_llm``
    (mlx_lm/models/youtu_llm.py), which transformers 5 names ``youtu``; the weights keep
    their names."""
    return {**cfg, "model_type": "youtu_llm"}, w


# family -> (the mlx-lm model type its rewritten checkpoint loads as, the rewrite)
LAYOUTS = {"gpt_oss": ("gpt_oss", _gpt_oss), "llama4": ("llama4", _llama4), "youtu": ("youtu_llm", _youtu)}


def model_type(family: str) -> str | None:
    """The mlx-lm model type ``family``'s rewritten checkpoint declares, or None (its own)."""
    got = LAYOUTS.get(family)
    return got[0] if got else None


def config_for(family: str, cfg: dict) -> dict:
    """``cfg`` (transformers 5's config.json dict) as the checkpoint mlx-lm reads holds it."""
    cfg = bridged(cfg)
    got = LAYOUTS.get(family)
    return got[1](cfg, {})[0] if got else cfg


def rewrite(family: str, folder: Path) -> None:
    """The checkpoint ``save_pretrained`` wrote to ``folder``, given the hub's config keys
    (``bridged``) and, for the families of ``LAYOUTS``, the layout mlx-lm reads."""
    cfg = hub_config(folder / "config.json")
    got = LAYOUTS.get(family)
    if got is None:
        return

    files = sorted(folder.glob("*.safetensors"))
    weights = {}
    for f in files:
        weights.update(safetensors_numpy.load_file(str(f)))
        f.unlink()
    for f in folder.glob("*.safetensors.index.json"):
        f.unlink()
    cfg, weights = got[1](cfg, weights)
    safetensors_numpy.save_file(weights, str(folder / "model.safetensors"), metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


def layer_pattern_refusal(cfg: dict, model_type: str) -> str | None:
    """Why mlx-lm's ``model_type`` cannot run ``cfg``'s layer pattern, or None. A module that
    looks up the first layer of a kind (``layer_types.index(...)``) needs one. Its gemma3_text
    and cohere2 modules read the pattern as one period (``sliding_window_pattern``: every
    p-th layer global, the rest sliding) and index the cache of layer p - 1 for the global
    mask (mlx_lm/models/gemma3_text.py Gemma3Model.__call__ ``cache[self.sliding_window_pattern
    - 1]``). A ``layer_types`` list that is no such period would be run as another model
    without a word; one with fewer layers than the period raises IndexError there."""

    mod = importlib.import_module(f"mlx_lm.models.{model_type}")
    b = bridged(cfg)
    c = b.get("text_config") or b
    lt = c.get("layer_types") or b.get("layer_types")
    # a module that looks up the first layer of a kind (mlx_lm/models/olmo3.py, afmoe.py, gpt_oss.py,
    # llama.py, ...: `self.fa_idx = self.layer_types.index("full_attention")`, the layer whose cache
    # gives the global mask) raises ValueError on a pattern without that kind
    if isinstance(lt, list) and lt:
        try:
            src = inspect.getsource(mod)
        except (OSError, TypeError):
            src = ""
        for m in re.finditer(r"layer_types\.index\(\s*[\"'](\w+)[\"']\s*\)", src):
            if m.group(1) not in lt:
                line = src.count("\n", 0, m.start()) + 1
                return (f"mlx_lm/models/{model_type}.py:{line} looks up the first {m.group(1)!r} layer "
                        f"(layer_types.index); this config's layer_types {lt} has none")
    args = getattr(mod, "ModelArgs", None)
    field = {f.name: f for f in dataclasses.fields(args)}.get("sliding_window_pattern") \
        if args is not None and dataclasses.is_dataclass(args) else None
    if field is None or not isinstance(field.default, int):
        return None
    if not isinstance(lt, list) or not lt:
        return None
    p = int(b.get("sliding_window_pattern") or c.get("sliding_window_pattern") or field.default)
    where = f"mlx_lm/models/{model_type}.py"
    if list(lt) != periodic_layer_types(p, len(lt)):
        return (f"{where} reads the layer pattern as one period (sliding_window_pattern = {p}: every {p}-th layer "
                f"global); this config's layer_types {lt} is not that")
    if p > len(lt):
        return (f"{where} takes the global mask from the cache of layer {p - 1} (sliding_window_pattern = {p}); "
                f"this model has {len(lt)} layers, none global")
    return None
