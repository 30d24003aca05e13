"""A local HF checkpoint (``--hf-model PATH``) as the source of weights.

For users with real models: a directory holding ``config.json`` and
``*.safetensors`` (one file or shards with their index), loaded by the
family's HF class and then run through the same comparison as a tiny model --
HF captured with hooks, the same weights exported to GGUF for llama.cpp,
impl's weights taken with the family's ``layer_weights``.

Real checkpoints come in more shapes than ``save_pretrained`` of a text model
makes, and each is read as it is (issue 13):

- sharded safetensors with ``model.safetensors.index.json``, and weights
  stored in bfloat16 / float16 (loaded as float32: every value exact);
- a multimodal checkpoint whose ``config.json`` nests the text model's config
  under ``text_config`` (Gemma 3 4B+ ``gemma3``, Llama 4 ``llama4``, Qwen3.5
  ``qwen3_5``): the family is the text config's model type, the text model is
  built from ``get_text_config()``, and its weights are found under whatever
  prefix the checkpoint keeps them (``language_model.model.`` as
  ``save_pretrained`` writes them, ``model.language_model.`` as the modeling
  code names them: ``text_key_mapping`` reads the prefix from the file's own
  tensor names); the vision tower's tensors are not read;
- tied input and output embeddings (``tie_word_embeddings``): the checkpoint
  holds one matrix, HF ties the head to it, and the GGUF export writes what
  the converter writes for a tied model.

Safety: local files only (``HF_HUB_OFFLINE=1``, ``local_files_only=True``),
``use_safetensors=True`` and ``trust_remote_code=False`` -- no download, no
pickle, no code from the checkpoint. A directory with only pickle weights
(``.bin`` / ``.pt`` / ...) is refused, not converted.

``--set`` with ``--hf-model``: allowed for fields that change no parameter
shape (``rope_parameters.rope_theta``, ``sliding_window``, ``rms_norm_eps``,
...), so a real model's decorations can be made active at a few tokens (a
4096-token window set to 4); refused for any field that changes a parameter's
name or shape (heads, sizes, biases, layer count), which the checkpoint's
weights could not fill. The check builds the model skeleton on the meta
device with and without the overrides and compares the state dicts. The
overrides are applied to the loaded config's dict and the config is rebuilt,
as editing config.json would do (a field HF derives at construction, e.g.
``layer_types``, is re-derived only if config.json does not store it).
Loading also refuses a checkpoint whose tensors leave any parameter of the HF
model missing or mis-shaped (HF would fill it with random values).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from harness.errors import UsageError, suggest
from harness.lazy import lazy
from harness import families
from harness.config_values import hf_refusals, refusal

torch = lazy("torch")
transformers = lazy("transformers")
safetensors = lazy("safetensors")

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def _offline() -> None:
    # before transformers / huggingface_hub read them; local_files_only is passed as well
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def check_dir(path) -> Path:
    """The checkpoint directory, or a one-line UsageError saying what is wrong."""
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"--hf-model {str(path)!r} is not a directory (expected config.json + *.safetensors)")
    if not (p / "config.json").is_file():
        raise UsageError(f"--hf-model {path}: no config.json in the directory")
    if not any(p.glob("*.safetensors")):
        pickles = sorted(f.name for f in p.iterdir() if f.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise UsageError(f"--hf-model {path}: only pickle weights ({', '.join(pickles[:3])}); this harness loads "
                             f"*.safetensors only (no pickle) -- save the model with safe_serialization first")
        raise UsageError(f"--hf-model {path}: no *.safetensors weights in the directory")
    return p


def _config_json(p: Path) -> dict:
    try:
        d = json.loads((p / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"--hf-model {p}: config.json is not readable JSON ({' '.join(str(e).split())})") from None
    if not isinstance(d, dict):
        raise UsageError(f"--hf-model {p}: config.json is not a JSON object")
    return d


def model_type(d: dict):
    """The text model's type: config.json's ``model_type``, or its ``text_config``'s
    for a multimodal checkpoint."""
    tc = d.get("text_config")
    if isinstance(tc, dict) and tc.get("model_type"):
        return tc["model_type"]
    return d.get("model_type")


def family_of(path) -> str:
    """The family whose ``hf_model_type`` is the checkpoint's text model type."""
    p = check_dir(path)
    mt = model_type(_config_json(p))
    reg = families.registry()
    cands = [f for f in reg.values() if f.hf_model_type == mt]
    if not cands:
        valid = sorted({f.hf_model_type for f in reg.values() if f.hf_model_type})
        raise UsageError(f"--hf-model {path}: model_type {mt!r} belongs to no family; {suggest(str(mt), valid)}")
    named = [f for f in cands if f.name == mt]
    if named:
        return named[0].name
    if len(cands) == 1:
        return cands[0].name
    raise UsageError(f"--hf-model {path}: model_type {mt!r} is read by families "
                     f"{', '.join(f.name for f in cands)}; choose one with --family")


def _param_shapes(config) -> dict[str, tuple]:
    with torch.device("meta"):
        m = transformers.AutoModelForCausalLM.from_config(config)
    return {k: tuple(v.shape) for k, v in m.state_dict().items()}


def _apply_overrides(family, config, overrides: dict, path):
    d = family.apply_overrides(config.to_dict(), overrides)

    try:
        new = type(config).from_dict(d)
    except hf_refusals() as e:
        raise refusal(e, family, d, f"family {family.name}: the HF config refused these settings") from None
    before, after = _param_shapes(config), _param_shapes(new)
    if before != after:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        raise UsageError(f"--set {', '.join(overrides)} changes the parameters of the --hf-model checkpoint "
                         f"({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}); with --hf-model only "
                         f"fields that change no weight shape may be set")
    return new


def load_config(path, family, overrides: dict | None = None):
    """The checkpoint's HF config (with ``overrides`` that change no weight shape),
    validated through the family's layer configs."""
    p = check_dir(path)
    mt = model_type(_config_json(p))
    if mt != family.hf_model_type:
        raise UsageError(f"--hf-model {path} holds model_type {mt!r}; family {family.name} reads "
                         f"{family.hf_model_type!r}")
    _offline()

    try:
        config = transformers.AutoConfig.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
        if config.model_type != family.hf_model_type:  # a multimodal checkpoint: its text model
            config = config.get_text_config(decoder=True)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise UsageError(f"--hf-model {path}: config.json refused by HF: {' '.join(str(e).split())[:300]}") from None
    if overrides:
        config = _apply_overrides(family, config, dict(overrides), path)
    family.validate(config.to_dict())
    family.validate_config(config)  # the family's layer_configs: impossible shapes are a UsageError
    return config


def load_model(path, family, config):
    """The checkpoint as a float32 eager HF model (hooks wrap the eager attention)."""
    p = check_dir(path)
    _offline()
    kw = {} if family.experts_implementation is None else {"experts_implementation": family.experts_implementation}
    mapping = text_key_mapping(list(_param_shapes(config)), checkpoint_keys(p))
    if mapping:
        kw["key_mapping"] = mapping
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(p), config=config, dtype=torch.float32, attn_implementation="eager", use_safetensors=True,
            local_files_only=True, trust_remote_code=False, output_loading_info=True, **kw)
    except (OSError, ValueError, RuntimeError) as e:
        raise UsageError(f"--hf-model {path}: HF could not load the weights: {' '.join(str(e).split())[:300]}") from None
    # a parameter the checkpoint does not hold would be filled with random values
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or [])
    if missing or mismatched:
        what = (f"missing {', '.join(missing[:3])}" if missing else "") + \
               (f"{'; ' if missing else ''}mis-shaped {', '.join(mismatched[:3])}" if mismatched else "")
        raise UsageError(f"--hf-model {path}: the checkpoint does not fill family {family.name}'s HF model ({what})")
    return model.eval()


def checkpoint_stamp(path: str | None):
    """The files of a checkpoint directory as (name, size, mtime ns): part of
    every cache key a checkpoint's weights shape (a directory saved over with
    other weights is not served the old captures)."""
    if not path:
        return None
    p = Path(path)
    return sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in p.iterdir() if f.is_file())


def checkpoint_keys(p: Path) -> list[str]:
    """Every tensor name of the checkpoint: the index's ``weight_map`` of a sharded
    one, else each safetensors file's header (no tensor is read)."""
    index = sorted(p.glob("*.safetensors.index.json"))
    if index:
        try:
            return sorted(json.loads(index[0].read_text())["weight_map"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"--hf-model {p}: {index[0].name} is not a safetensors index "
                             f"({' '.join(str(e).split())[:200]})") from None

    keys = []
    for f in sorted(p.glob("*.safetensors")):
        with safetensors.safe_open(str(f), "pt") as st:
            keys += list(st.keys())
    return sorted(keys)


def text_key_mapping(expected: list[str], found: list[str]) -> dict[str, str]:
    """``from_pretrained``'s ``key_mapping`` (regex -> replacement) that finds the
    text model's tensors in a checkpoint storing them under another prefix, read
    from the names themselves: for each top-level part of the text model
    (``model``, ``lm_head``) the one prefix under which the checkpoint holds ALL
    of its tensors -- ``language_model.model.layers.0...`` for
    ``model.layers.0...`` (the checkpoint keeps the part's own name after a
    prefix) or ``model.language_model.layers.0...`` (it replaces the name). A
    vision tower's ``encoder.layers.0...`` matches some names, never all. Empty
    when the names already match; a part found under no single prefix is left
    to the loader, which reports it missing."""
    have = set(found)
    mapping: dict[str, str] = {}
    for root in sorted({e.split(".", 1)[0] for e in expected if "." in e}):
        mine = [e for e in expected if e.startswith(root + ".")]
        if all(e in have for e in mine):
            continue
        for whole in (True, False):  # the part's name kept behind a prefix, or replaced by one
            common = None
            for e in mine:
                tail = e if whole else e[len(root) + 1:]
                cands = {f[: len(f) - len(tail)] for f in _ends(found, tail)}
                if not cands:
                    continue  # a tied head, or a tensor the loader will report missing
                common = cands if common is None else common & cands
            if common and len(common) == 1:
                prefix = common.pop()
                if whole and prefix:
                    mapping["^" + re.escape(prefix) + re.escape(root + ".")] = root + "."
                elif not whole and prefix != root + ".":
                    mapping["^" + re.escape(prefix)] = root + "."
                break
    return mapping


def _ends(found: list[str], tail: str) -> list[str]:
    return [f for f in found if f == tail or f.endswith("." + tail)]
