"""Writing a family's weights and hyper-parameters as llama.cpp's converter
(convert_hf_to_gguf.py, conversion/) would: the export hooks
(harness/pipeline/gguf/export.py drives them) and the converter steps several
families share (sizes, YaRN, MoE expert stacking, TextModel's generic keys)."""

from __future__ import annotations

import numpy as np

from harness.lazy import lazy
from . import _convert  # looked up at each call, as a test's patch of the module expects

gguf = lazy("gguf")
torch = lazy("torch")


class GGUFExport:
    """The GGUF-export half of ``Family`` (mixed in)."""
    # The llama.cpp architecture the GGUF export writes (None: no llama.cpp reference).
    gguf_arch: str | None = None
    # The converter writes llama3 RoPE scaling as a rope_freqs tensor: LlamaModel and its
    # subclasses do (conversion/llama.py LlamaModel.generate_extra_tensors), other
    # TextModels never (conversion/base.py: generate_extra_tensors returns nothing).
    # Written or not, as the converter does: an arch that reads no rope_freqs then
    # refuses the file (llama-model.cpp done_getting_tensors), as it refuses a user's.
    converter_rope_freqs = False

    def gguf_export_refusal(self, config) -> str | None:
        """Why ``config`` is no file of ``gguf_arch`` -- the converter writes it as another
        arch, or llama.cpp's graph for the arch cannot run it -- with the converter's or the
        loader's line; None (default) where it is. The llama.cpp reference then records a
        not-implemented row with these words (``LlamaCpp.refusal``), never a crash."""
        return None

    def gguf_params(self, w, config, variant: str | None = None) -> None:
        """The metadata llama.cpp reads for the arch: conversion/base.py
        ``TextModel.set_gguf_parameters`` plus the arch's own additions."""

        gguf_size_params(w, config)
        rp = dict(config.rope_parameters or {})
        rp = rp.get("full_attention", rp)
        if rp.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rp["factor"])
        elif rp.get("rope_type") == "yarn":
            gguf_yarn_params(w, rp, ("attention_factor", "beta_fast", "beta_slow"))
        if rp.get("rope_theta") is not None:
            w.add_rope_freq_base(rp["rope_theta"])
        eps = getattr(config, "rms_norm_eps", None)
        if eps is not None:
            w.add_layer_norm_rms_eps(eps)
        hd = getattr(config, "head_dim", None)
        if hd is not None:
            w.add_key_length(hd)
            w.add_value_length(hd)
        # conversion/llama.py LlamaModel.set_gguf_parameters
        w.add_vocab_size(config.vocab_size)
        w.add_rope_dimension_count(hd or config.hidden_size // config.num_attention_heads)

    def gguf_model_params(self, w, model, config, variant: str | None = None) -> None:
        """The metadata the converter takes from the WEIGHTS, not the config (default:
        none): apertus's per-layer xIELU parameters, which conversion/llama.py
        ``ApertusModel.modify_tensors`` writes as key arrays instead of tensors."""

    def gguf_transform(self, name: str, data: np.ndarray, config) -> np.ndarray:
        """A layout step the converter applies to one tensor (default: none). Only
        moves elements (permute, reshape, slice): the import runs it backwards by
        tracing element indices through it (``_gguf_import.trace_import``); a
        step that changes VALUES belongs in ``gguf_value_map``."""
        return data

    def gguf_value_map(self, name: str, data: np.ndarray, config) -> np.ndarray:
        """An elementwise value step the converter applies to HF tensor ``name``
        (gemma's ``w + 1``, ``-exp(A_log)``; default: none), with its inverse in
        ``gguf_value_unmap``. Elementwise, so it commutes with the layout steps."""
        return data

    def gguf_convert(self, name: str, data: np.ndarray, config, variant: str | None = None):
        """One HF tensor -> the ``(hf_style_name, array)`` pairs gguf's tensor map
        names: the converter's ``modify_tensors`` / ``filter_tensors`` for it
        (default: ``gguf_transform``'s one tensor, or none where it drops the
        tensor). A family whose converter renames, splits or stacks overrides.
        Layout only, as ``gguf_transform``: it also runs on integer index arrays."""
        data = self.gguf_transform(name, data, config)
        if data is not None:
            yield name, data

    # An arch of the installed gguf package whose tensor map names this family's HF
    # tensors as llama.cpp's ``gguf_arch`` does, used only where the installed gguf
    # predates ``gguf_arch`` (gguf 0.19 has no mellum, no hy_v3; llama.cpp's vendored
    # gguf-py does): the arch string written is still ``gguf_arch``, and llama.cpp's
    # loader checks every name against its own table (a wrong one fails to load).
    gguf_tensor_names_from: str | None = None

    def gguf_tensor_map(self, config):
        """gguf's own tensor-name map of the family's arch (``get_tensor_name_map``),
        or of ``gguf_tensor_names_from`` where the installed gguf lacks the arch."""

        archs = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
        name = self.gguf_arch if self.gguf_arch in archs else self.gguf_tensor_names_from
        if name not in archs:
            raise RuntimeError(f"{self.name}: the installed gguf {getattr(gguf, '__version__', '')} has no arch "
                               f"{self.gguf_arch!r} and the family names no gguf_tensor_names_from to map its "
                               "tensors with")
        return gguf.get_tensor_name_map(archs[name], config.num_hidden_layers)

    def gguf_tensors(self, model, config, variant: str | None = None):
        """``(gguf_name, array)`` for every HF tensor, converted (``gguf_convert``)
        and renamed with gguf's own tensor map, as ``modify_tensors`` does."""

        tmap = self.gguf_tensor_map(config)
        emb = getattr(model.get_input_embeddings(), "weight", None)
        sd = model.state_dict()
        emb_name = next((n for n, p in sd.items() if emb is not None and p.data_ptr() == emb.data_ptr()), None)
        for name, p in sd.items():
            if name != emb_name and emb is not None and p.data_ptr() == emb.data_ptr():
                # a tied head: save_pretrained drops the tied copy, so the converter never
                # sees it and llama.cpp falls back to token_embd (TENSOR_DUPLICATED)
                continue
            yield from self.gguf_hf_tensor(name, p.detach().to(dtype=torch.float32).cpu().numpy(), config, variant,
                                           tmap)
        yield from self.gguf_extra_tensors(config, variant)

    def gguf_hf_tensor(self, name: str, data: np.ndarray, config, variant: str | None, tmap):
        """``(gguf_name, array)`` for ONE HF tensor (``gguf_tensors``' step for each: a
        model written tensor by tensor as it is drawn, gguf/stream.py, takes the same)."""
        data = self.gguf_value_map(name, data, config)
        for hf_name, out in self.gguf_convert(name, data, config, variant):
            new = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise ValueError(f"{self.name}: no GGUF name for HF tensor {hf_name!r}")
            yield new, out

    def gguf_extra_tensors(self, config, variant: str | None = None):
        """The tensors the converter writes from the config alone (llama3's rope_freqs)."""
        if self.converter_rope_freqs:
            factors = _convert.llama3_rope_factors(config)
            if factors is not None:
                yield "rope_freqs.weight", factors


def tensor_name_map(tensors: tuple[str, ...], n_blocks: int):
    """gguf's ``TensorNameMap`` for an arch the installed gguf-py has no entry for
    (gguf 0.19 lacks cohere2moe): the installed ``mappings_cfg`` /
    ``block_mappings_cfg`` (tensor_mapping.py: HF module -> GGUF tensor) kept to
    ``tensors``, the ``MODEL_TENSOR`` names the arch's ``MODEL_TENSORS`` entry of the
    vendored gguf-py lists -- what ``TensorNameMap.__init__`` keeps for an arch it
    knows. Only ``get_name`` is used (export and ``--gguf``)."""

    keep = {getattr(gguf.MODEL_TENSOR, t) for t in tensors}
    tmap = gguf.TensorNameMap.__new__(gguf.TensorNameMap)
    tmap.mapping = {}
    for tensor, keys in gguf.TensorNameMap.mappings_cfg.items():
        if tensor in keep:
            for key in (gguf.TENSOR_NAMES[tensor], *keys):
                tmap.mapping[key] = (tensor, gguf.TENSOR_NAMES[tensor])
    for bid in range(n_blocks):
        for tensor, keys in gguf.TensorNameMap.block_mappings_cfg.items():
            if tensor in keep:
                name = gguf.TENSOR_NAMES[tensor].format(bid=bid)
                for key in (name, *(k.format(bid=bid) for k in keys)):
                    tmap.mapping[key] = (tensor, name)
    return tmap


def gguf_size_params(w, config, head_count_kv: bool = True) -> None:
    """The sizes conversion/base.py ``TextModel.set_gguf_parameters`` writes first
    (block count, context, embedding and feed-forward lengths, head counts), from
    the HF config's llama-style names; ``head_count_kv=False``: the caller writes
    its own (per-layer counts, MLA's MQA) or none."""
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    if getattr(config, "intermediate_size", None) is not None:  # an all-MoE config may have none
        w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    if head_count_kv:
        w.add_head_count_kv(config.num_key_value_heads)


YARN_KEYS = ("extrapolation_factor", "attention_factor", "beta_fast", "beta_slow")


def gguf_yarn_params(w, rp: dict, keys: tuple[str, ...] = YARN_KEYS) -> None:
    """conversion/base.py ``TextModel.set_gguf_parameters``, the YaRN arm: scaling
    type, factor, original context, then each of the optional ``keys`` of
    ``rope_parameters`` that is present -- written whether or not the arch reads
    it; HF's ``truncate`` has no GGUF key at all."""

    adders = {"extrapolation_factor": w.add_rope_scaling_yarn_ext_factor,
              "attention_factor": w.add_rope_scaling_yarn_attn_factor,
              "beta_fast": w.add_rope_scaling_yarn_beta_fast,
              "beta_slow": w.add_rope_scaling_yarn_beta_slow}
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rp["factor"])
    w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    for key in keys:
        if rp.get(key) is not None:
            adders[key](rp[key])


def gguf_moe_convert(name: str, data: np.ndarray):
    """The converter's steps for transformers 5's MoE tensors, as ``(hf_style_name,
    array)`` pairs (None: not such a tensor):
    - conversion/base.py ``ModelBase.filter_tensors`` / ``modify_tensors``:
      ``e_score_correction_bias`` -> ``e_score_correction.bias`` (-> blk.N.exp_probs_b.bias);
    - ``mlp.experts.gate_up_proj``: transformers 5 fuses the experts into
      [E, 2F, H] (gate rows first); the converter reads the per-expert
      gate/up/down of a saved checkpoint and stacks them (``torch.stack(datas,
      dim=0)``) into ffn_{gate,up}_exps [E, F, H];
    - ``mlp.experts.down_proj`` [E, H, F] -> ffn_down_exps."""
    if name.endswith("e_score_correction_bias"):
        return [(name.replace("e_score_correction_bias", "e_score_correction.bias"), data)]
    if name.endswith("mlp.experts.gate_up_proj"):
        f = data.shape[-2] // 2
        base = name.removesuffix(".gate_up_proj")
        return [(base + ".gate_proj.weight", np.ascontiguousarray(data[..., :f, :])),
                (base + ".up_proj.weight", np.ascontiguousarray(data[..., f:, :]))]
    if name.endswith("mlp.experts.down_proj"):
        return [(name + ".weight", data)]
    return None


def text_model_gguf_params(w, config) -> None:
    """conversion/base.py ``TextModel.set_gguf_parameters``, key for key (the
    generic metadata most converters start from with ``super()``); a family adds
    its own keys after calling it. Reads the HF config object, as the converter
    reads config.json (``find_hparam``: the first of several names present)."""

    def find(*names):
        for n in names:
            v = getattr(config, n, None)
            if v is not None:
                return v
        return None

    w.add_block_count(config.num_hidden_layers)
    for value, add in ((find("max_position_embeddings", "n_ctx", "n_positions"), w.add_context_length),
                       (find("hidden_size", "n_embd", "dim"), w.add_embedding_length),
                       (find("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner",
                             "hidden_dim"), w.add_feed_forward_length),
                       (find("num_attention_heads", "n_head", "n_heads"), w.add_head_count),
                       (find("num_key_value_heads", "n_kv_heads"), w.add_head_count_kv)):
        if value is not None:
            add(value)
    rp_all = dict(getattr(config, "rope_parameters", None) or {})
    rp = rp_all.get("full_attention", rp_all)
    if rp.get("factor") is not None and rp.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rp["factor"])
    elif rp.get("factor") is not None and rp.get("rope_type") == "yarn":
        gguf_yarn_params(w, rp)
    if rp.get("rope_theta") is not None:
        w.add_rope_freq_base(rp["rope_theta"])
    swa_theta = (rp_all.get("sliding_attention") or {}).get("rope_theta")
    if swa_theta is not None:
        w.add_rope_freq_base_swa(swa_theta)
    if (eps := find("rms_norm_eps", "norm_eps")) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (eps := find("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")) is not None:
        w.add_layer_norm_eps(eps)
    if (n := find("num_local_experts", "num_experts", "n_routed_experts")) is not None:
        w.add_expert_count(n)
    if (n := find("num_experts_per_tok", "num_experts_per_token", "top_k_experts")) is not None:
        w.add_expert_used_count(n)
    if (hd := getattr(config, "head_dim", None)) is not None:
        w.add_key_length(hd)
        w.add_value_length(hd)


class NormPlusOne:
    """The converter's ``*norm.weight + 1`` (conversion/gemma.py
    ``Gemma2Model`` / ``Gemma3Model.modify_tensors``, conversion/qwen.py
    ``Qwen3NextModel.modify_tensors``): HF's norms multiply by ``1 + w``,
    llama.cpp's by the stored weight. An elementwise value step (mixed in
    before the family's base class), with its inverse for ``--gguf``."""

    norm_plus_one = True  # what the converter does; a test switches it off
    norm_plus_one_skip: tuple[str, ...] = ()  # norms the converter leaves alone

    def _shifted(self, name: str) -> bool:
        return self.norm_plus_one and name.endswith("norm.weight") and not name.endswith(self.norm_plus_one_skip)

    def gguf_value_map(self, name, data, config):
        return data + np.float32(1) if self._shifted(name) else super().gguf_value_map(name, data, config)

    def gguf_value_unmap(self, name, data, config):
        return data - np.float32(1) if self._shifted(name) else super().gguf_value_unmap(name, data, config)


class NegExpALog:
    """The converter's ``A_log -> -exp(A_log)`` (conversion/qwen.py
    ``Qwen3NextModel.modify_tensors``, conversion/kimi_linear.py: ``data_torch =
    -torch.exp(data_torch)``; the graphs multiply by ``ssm_a`` directly), with
    its inverse for ``--gguf``. Mixed in before the family's base class."""

    def gguf_value_map(self, name, data, config):
        if name.endswith(".A_log"):
            return (-torch.exp(torch.from_numpy(np.ascontiguousarray(data)))).numpy()
        return super().gguf_value_map(name, data, config)

    def gguf_value_unmap(self, name, data, config):
        if name.endswith(".A_log"):
            return np.log(-data.astype(np.float64)).astype(np.float32)  # A_log = log(-ssm_a)
        return super().gguf_value_unmap(name, data, config)
