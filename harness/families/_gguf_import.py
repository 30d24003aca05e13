"""Reading a family's GGUF back (``--gguf``): the hyper-parameters as llama.cpp
reads them for the file's architecture, and the weights through the export's
steps run backwards (harness/pipeline/gguf/reader.py drives it).

Metadata. ``GGUFMeta`` knows which keys llama.cpp reads for the arch
(``harness/gguf/llamacpp_keys.py``, generated from llama.cpp's ``load_hparams`` and the
arch's ``load_arch_hparams``). A reverse reads keys through it, with
llama.cpp's defaults for absent ones, and may read ONLY those keys; after it:

- a key llama.cpp reads for the arch that the reverse neither read nor
  explicitly skipped (``GGUFMeta.skip``: not read for this file's values, as
  llama.cpp's own conditions say) is refused -- it may change what llama.cpp
  computes and nothing here would know;
- a key llama.cpp does not read for the arch is ignored, and listed
  (``GGUFMeta.ignored``) in the run's meta.json.

``read_hparams`` mirrors ``llama_model_base::load_hparams`` (the keys every
arch reads) into ``Hparams``; each family's ``config_from_gguf`` adds its
arch's keys (citing ``src/models/<arch>.cpp``) and builds the HF config.

Weights. The export (``GGUFExport``) is the converter's steps as layout
operations (``gguf_convert``: renames, splits, stacks, transposes, permutes)
plus elementwise value maps (``gguf_value_map``: gemma's ``w + 1``,
``-exp(A_log)``). ``trace_import`` runs each HF tensor's layout steps on its
own element INDICES, which tells where every element lands in the file; the
file's tensors are gathered back through that map and the value map is
inverted (``gguf_value_unmap``). One body for every family: a family's import
is its export, backwards, step for step -- each step cites the converter where
the export defines it.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import UsageError
from ..gguf.llamacpp_keys import RECURRENT_UNSCALED, ROPE_FACTORS, SCALES

# the metadata's reading is the format floor's (harness/gguf/meta.py); the families'
# reverses take it from here
from ..gguf.meta import _REQUIRED, GGUFMeta, Hparams, float32_value, get_mscale, read_hparams  # noqa: F401
from ._convert import llama3_from_factors
from ..references.hf.rope import apply_freq_factors
from harness.aligned import aligned_empty


def swa_pattern(meta: GGUFMeta, hp: Hparams, n_pattern: int, dense_first: bool = False) -> list[bool]:
    """``llama_model_base::load_swa_pattern``: the per-layer bool array when the
    file has one, else ``set_swa_pattern`` of the scalar (default ``n_pattern``):
    layer il slides iff ``il % n < n - 1`` (``dense_first``: ``il % n != 0``);
    n = 0 slides every layer."""
    v = meta.get("attention.sliding_window_pattern", None)
    if isinstance(v, (list, tuple)):
        if len(v) != hp.n_layer:
            meta.refuse("attention.sliding_window_pattern", v, f"{len(v)} values for {hp.n_layer} layers")
        return [bool(x) for x in v]
    n = int(v) if v is not None else n_pattern
    if dense_first:
        return [n == 0 or il % n != 0 for il in range(hp.n_layer)]
    return [n == 0 or il % n < n - 1 for il in range(hp.n_layer)]


def hf_rope(meta: GGUFMeta, hp: Hparams, theta: float | None = None, log_mul: float = 0.0,
            deepseek: bool = False) -> dict:
    """HF ``rope_parameters`` for what llama.cpp computes from ``hp``'s RoPE
    scaling (llama-context.cpp: ``freq_scale``, the YaRN ``attn_factor`` --
    ``get_mscale(factor)``, or the ``yarn_log_multiplier`` ratio, times
    ``rope.scaling.attn_factor`` --, ``ext_factor`` 1, ``beta_fast`` 32,
    ``beta_slow`` 1 (cparams defaults; no key of these archs sets them), and
    ggml_rope_yarn_corr_dims' floor / ceil = HF ``truncate``)."""
    theta = hp.rope_freq_base if theta is None else theta
    kind, scale = hp.rope_scaling_type, hp.rope_freq_scale
    if kind == "longrope":
        meta.refuse("rope.scaling.type", kind, "LongRoPE (per-position factor tables) is not expressible here")
    if kind == "yarn" and scale != 1.0:
        factor = float32_value(1.0 / scale)
        if log_mul:
            # llama-context.cpp: mscale = log_mul for deepseek2 (else 1), over mscale_all_dim = log_mul
            mscale = log_mul if deepseek and log_mul != 1.0 else 1.0
            attn = get_mscale(factor, mscale) / get_mscale(factor, log_mul)
        else:
            attn = get_mscale(factor)
        return {"rope_type": "yarn", "rope_theta": theta, "factor": factor,
                "original_max_position_embeddings": hp.n_ctx_orig_yarn, "beta_fast": 32.0, "beta_slow": 1.0,
                "attention_factor": attn * hp.rope_attn_factor, "truncate": True}
    if hp.rope_attn_factor != 1.0:
        meta.refuse("rope.scaling.attn_factor", hp.rope_attn_factor,
                    f"scales every rotated Q/K channel outside YaRN ({kind} RoPE); HF's {kind} RoPE cannot; valid: 1")
    if kind in ("linear", "yarn") and scale != 1.0:
        return {"rope_type": "linear", "rope_theta": theta, "factor": float32_value(1.0 / scale)}
    return {"rope_type": "default", "rope_theta": theta}


def experts(meta: GGUFMeta, hp: Hparams, family: str, groups: bool = False) -> tuple[int, int]:
    """An MoE family's ``(expert_count, expert_used_count)``: one used count for
    every layer; expert groups (grouped top-k routing) refused unless the
    family's router has them (``groups``)."""
    if not hp.n_expert:
        meta.refuse("expert_count", hp.n_expert, f"no experts; family {family}'s HF model is an MoE")
    used = {u for u in hp.n_expert_used if u} or {0}
    if len(used) != 1:
        meta.refuse("expert_used_count", hp.n_expert_used, "per-layer values; HF holds one")
    if not groups and hp.n_expert_groups > 1:
        meta.refuse("expert_group_count", hp.n_expert_groups, f"grouped routing; family {family}'s router has none")
    return hp.n_expert, used.pop()


def one_theta(meta: GGUFMeta, hp: Hparams, swa: list[bool], default=None) -> float:
    """``rope.freq_base_swa`` where the family's HF config has ONE theta for every
    layer: read (default: the main base, as these archs set it), refused if a
    sliding layer would rotate with another one."""
    theta_swa = meta.get_f32("rope.freq_base_swa", hp.rope_freq_base if default is None else default)
    if any(swa) and theta_swa != hp.rope_freq_base:
        meta.refuse("rope.freq_base_swa", theta_swa, f"!= rope.freq_base {hp.rope_freq_base}; the family's HF "
                                                     "config has one RoPE theta for every layer")
    return theta_swa


def one_per_layer(meta: GGUFMeta, key: str, n: int, default=_REQUIRED) -> int:
    """A ``get_key_or_arr`` key the family's HF config holds once (the experts'
    width ...): one value for every layer, else refused."""
    vals = meta.get_per_layer(key, n, default)
    if len(set(vals)) != 1:
        meta.refuse(key, vals, "per-layer values; the family's HF config holds one")
    return int(vals[0])


def refuse_experts(meta: GGUFMeta, hp: Hparams, family: str) -> None:
    """A dense family's file must carry no experts (the arch's graph would build
    an MoE FFN the family's HF model has no place for)."""
    if hp.n_expert:
        meta.refuse("expert_count", hp.n_expert, f"an MoE FFN; family {family}'s HF model is dense")


def vocab_of(meta: GGUFMeta, shapes: dict) -> int:
    if "token_embd.weight" not in shapes:
        raise UsageError(f"--gguf {meta.path}: no token_embd.weight tensor")
    vocab = int(shapes["token_embd.weight"][0])
    declared = meta.get("vocab_size", None)
    if declared is not None and int(declared) != vocab:
        meta.refuse("vocab_size", declared, f"token_embd.weight has {vocab} rows")
    return vocab


def special_tokens(meta: GGUFMeta, vocab: int) -> dict:
    """The file's own special token ids (tokenizer.ggml.*), else none -- HF's
    defaults (e.g. pad 128004) may lie outside the file's vocabulary. They shape
    no arithmetic."""
    kw = {}
    for hf, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("pad_token_id", "padding_token_id")):
        v = meta.get(f"tokenizer.ggml.{key}", None)
        kw[hf] = int(v) if v is not None and 0 <= int(v) < vocab else None
    return kw


def one_head_dim(meta: GGUFMeta, hp: Hparams, family, swa: bool = False) -> dict:
    """HF's single ``head_dim`` from the file's key / value lengths (and, where
    a layer slides, the ``_swa`` ones): equal, or refused. Set in the kwargs
    where the family's HF config has the field (else it must be hidden // heads)."""
    hk, hv = hp.n_embd_head_k, hp.n_embd_head_v
    if hv != hk:
        meta.refuse("attention.value_length", hv, f"!= key_length {hk}; family {family.name} has one head_dim")
    if swa and (hp.n_embd_head_k_swa, hp.n_embd_head_v_swa) != (hk, hk):
        meta.refuse("attention.key_length_swa", hp.n_embd_head_k_swa,
                    f"sliding layers with another head size than {hk}; family {family.name} has one head_dim")
    default = hp.n_embd // hp.head if hp.head else hk
    if "head_dim" in family.settable_keys():
        return {"head_dim": hk}
    if hk != default:
        meta.refuse("attention.key_length", hk, f"family {family.name}'s HF attention fixes head_dim = "
                                                f"hidden / heads = {default}")
    return {}


def full_rotary(meta: GGUFMeta, hp: Hparams, family, swa: bool = False) -> None:
    """The graph rotates ``n_rot`` channels of each head: the whole head here."""
    if hp.n_rot != hp.n_embd_head_k:
        meta.refuse("rope.dimension_count", hp.n_rot, f"partial rotary (head_dim {hp.n_embd_head_k}); "
                                                      f"family {family.name}'s HF attention rotates the whole head")
    if swa and hp.n_rot_swa != hp.n_rot:
        meta.refuse("rope.dimension_count_swa", hp.n_rot_swa, f"!= rope.dimension_count {hp.n_rot}")


def alibi_config(family, meta: GGUFMeta, shapes: dict, hp: Hparams) -> dict:
    """What bloom and mpt (ALiBi, fused QKV, LayerNorm, no RoPE) read alike:
    the sizes, MHA only (HF's fused QKV has no KV groups), the FFN width as a
    multiple of the hidden size (HF: ``4 * hidden`` / ``expansion_ratio``),
    the tied head, the vocabulary. The RoPE keys load_hparams reads have no
    effect on these graphs (no ggml_rope)."""
    refuse_experts(meta, hp, family.name)
    if hp.head_kv != hp.head:
        meta.refuse("attention.head_count_kv", hp.head_kv, f"KV groups; family {family.name}'s fused QKV is "
                                                            f"multi-head ({hp.head} heads)")
    one_head_dim(meta, hp, family)
    if hp.ff % hp.n_embd:
        meta.refuse("feed_forward_length", hp.ff, f"not a multiple of embedding_length {hp.n_embd} "
                                                  f"(family {family.name}'s MLP width is a ratio of it)")
    vocab = vocab_of(meta, shapes)
    return {"vocab_size": vocab, "tie_word_embeddings": "output.weight" not in shapes, **special_tokens(meta, vocab)}


def llama_like_config(family, meta: GGUFMeta, shapes: dict, hp: Hparams, swa: bool = False, moe: bool = False,
                      rotary: bool = True, rope: dict | None = None) -> dict:
    """The HF kwargs every llama-shaped family reads the same way from
    ``read_hparams``: sizes, one head_dim, full rotary, RoPE, vocabulary, tied
    head, special tokens, and the bias switches HF keeps in the config
    (LlamaAttention: ``attention_bias`` on q/k/v/o; LlamaMLP: ``mlp_bias``),
    on when the file carries them. A family adds its arch's own keys (an MoE
    family, ``moe=True``, its expert counts: a dense one refuses experts; a
    family whose HF attention rotates a fraction of the head, ``rotary=False``,
    its partial rotary factor; one whose RoPE no generic key says -- LongRoPE's
    factor tensors --, ``rope``: its HF ``rope_parameters``)."""
    if not moe:
        refuse_experts(meta, hp, family.name)
    vocab = vocab_of(meta, shapes)
    kw = {"num_hidden_layers": hp.n_layer, "max_position_embeddings": hp.n_ctx_train,
          "hidden_size": hp.n_embd, "intermediate_size": hp.ff, "num_attention_heads": hp.head,
          "num_key_value_heads": hp.head_kv, "vocab_size": vocab,
          # the converter writes output.weight only for an untied head
          "tie_word_embeddings": "output.weight" not in shapes,
          "rope_parameters": hf_rope(meta, hp) if rope is None else rope, **one_head_dim(meta, hp, family, swa), **special_tokens(meta, vocab)}
    if rotary:
        full_rotary(meta, hp, family, swa)
    keys = family.settable_keys()
    if "attention_bias" in keys:
        # HF's one switch for all four (LlamaAttention: bias=config.attention_bias); llama.cpp
        # loads each one on its own, optionally (an absent one reads as zero: trace_import)
        kw["attention_bias"] = any(_ATTN_BIAS.fullmatch(n) for n in shapes)
    if "mlp_bias" in keys:
        kw["mlp_bias"] = "blk.0.ffn_up.bias" in shapes
    return kw


class GGUFImport:
    """The GGUF-import half of ``Family`` (mixed in)."""
    # Another family whose reverse reads this family's files as they are -- the same
    # HF model class and llama.cpp graph (sarvam_mla's files are deepseek_v3's): --gguf
    # picks that one unless --family names this (None: this family is a candidate itself)
    gguf_reads_as: str | None = None

    def gguf_import_unsupported(self) -> str | None:
        """Why ``--gguf`` cannot read this family's files (None: it can)."""
        if not self.gguf_arch:
            return "the family has no GGUF export (no llama.cpp arch)"
        return None

    def config_from_gguf(self, meta: GGUFMeta, shapes: dict[str, tuple], tensors: dict) -> dict:
        """HF config kwargs from a GGUF, as llama.cpp reads the arch (the family's
        ``load_arch_hparams``, on top of ``read_hparams``). ``shapes``: GGUF
        tensor name -> shape in numpy order; ``tensors``: name -> a callable
        giving the dequantized float32 array (for a tensor that carries a
        hyper-parameter, llama's ``rope_freqs``).

        Default: a llama-shaped arch whose ``load_arch_hparams`` reads the RMS
        eps and nothing else (src/models/llama.cpp, qwen2.cpp, qwen3.cpp:
        ``ml.get_key(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS, hparams.f_norm_rms_eps)``).
        A family whose arch reads more extends it; a key it leaves unread is
        refused by the loader, never dropped."""
        hp = read_hparams(meta)
        kw = llama_like_config(self, meta, shapes, hp)
        kw["rms_norm_eps"] = meta.get_f32("attention.layer_norm_rms_epsilon")
        return kw

    def gguf_variant_of(self, shapes: dict[str, tuple]) -> str | None:
        """The family's named variant a file is written in (default: the first)."""
        return self.variants[0] if self.variants else None

    def gguf_value_unmap(self, name: str, data: np.ndarray, config) -> np.ndarray:
        """The inverse of ``gguf_value_map`` for HF tensor ``name`` (default: none)."""
        return data

    def gguf_import_prepare(self, tensors: dict, config) -> dict:
        """The file's tensors (name -> loader) before ``trace_import`` places
        them. Default: src/llama-model.cpp's generic pass every arch gets loads
        ``X.scale`` ({1}, or {n_expert} for stacked experts) and
        ``X.input_scale``; where the arch's graph passes the scale on
        (``build_lora_mm``: ``(W x) * s``) it is folded into the weight (``W * s``:
        the same function, which HF and impl compute from it); the rest is read
        by no graph and dropped (``unused_tensors``, listed in meta.json). A family consumes what else it writes outside the HF state
        dict. ``rope_freqs`` is a hyper-parameter (``rope_freqs``, read into the
        config): not a weight."""
        tensors = dict(tensors)
        tensors.pop("rope_freqs.weight", None)
        return fold_scales(tensors, self.gguf_arch, self.gguf_recurrent_layers(config))

    def gguf_recurrent_layers(self, config) -> frozenset[int]:
        """The layers llama.cpp builds as recurrent (``hparams.is_recr``: the config
        read from the file's ``attention.recurrent_layers``), where an arch of
        ``RECURRENT_UNSCALED`` multiplies a tensor kind unscaled that its attention
        layers scale (qwen3next.cpp build_qkvz: ``build_lora_mm(model.layers[il].wqkv,
        input)``). Empty for every other arch."""
        if self.gguf_arch not in RECURRENT_UNSCALED:
            return frozenset()
        return frozenset(i for i in range(config.num_hidden_layers) if self.is_recurrent(config, i))

    def gguf_patch_model(self, model, config) -> None:
        """What the HF model built from the read-back config still lacks (default:
        a RoPE table with llama.cpp's per-pair frequency factors, where the config
        carries them)."""

        apply_freq_factors(model, config)

    def gguf_import_tensors(self, tensors: dict, model, config, variant: str | None = None,
                            path: str = "", provenance: dict | None = None) -> dict[str, np.ndarray]:
        """The HF state dict of ``model`` from the file's tensors (``trace_import``)."""
        return trace_import(self, self.gguf_import_prepare(dict(tensors), config), model, config, variant, path,
                            provenance)


# build_ffn (llama-graph.cpp) adds a dense FFN matrix's bias BEFORE its scale
# ((W x + b) * s); every other site -- build_qkv, build_attn's wo, the experts of
# build_moe_ffn, the output head -- scales the product and adds the bias after
_BIAS_THEN_SCALE = re.compile(r"blk\.\d+\.ffn_(up|gate|down)(_shexp)?\.scale$")


def _identity_trace(arr: np.ndarray) -> bool:
    """The traced index array is 0, 1, 2, ... in C order: the layout steps left every
    HF element where it was, so the file's tensor IS the HF tensor and the scatter
    can be skipped (on a 262k-vocabulary embedding, 168M indices). Checked on
    the values, in one pass: a permutation never passes."""
    flat = arr.reshape(-1)
    step = 1 << 22  # in chunks: no second index array of the model's largest tensor
    return all(np.array_equal(flat[i:i + step], np.arange(i, min(i + step, flat.size), dtype=flat.dtype))
               for i in range(0, flat.size, step))


# tensors an arch's loader creates that its graph never passes on, beyond what the generated
# tables (SCALES, ROPE_FACTORS) say: falcon-h1.cpp's graph calls build_attn(inp->get_attn(),
# model.layers[il].wo, NULL, model.layers[il].wo_s, ...) -- NULL where wo_b goes -- so the
# attn_output.bias its load_arch_tensors creates (TENSOR_NOT_REQUIRED) is never added; HF's
# o_proj bias (attention_bias switches all four) is then the zero bias of an absent one
UNREAD = {"falcon-h1": re.compile(r"blk\.\d+\.attn_output\.bias")}


def unused_tensors(names, arch: str, recurrent: frozenset[int] = frozenset()) -> list[str]:
    """The file's tensors llama.cpp loads for ``arch`` and its graph never reads:
    every ``X.input_scale``, each ``X.scale`` of a kind the arch's graph does
    not pass on (``SCALES``, generated from src/models/<arch>.cpp) -- or passes on
    only in its attention layers, in one of the ``recurrent`` layers
    (``RECURRENT_UNSCALED``: qwen3next.cpp's delta net multiplies its attn_qkv with
    no scale, build_qkvz ``build_lora_mm(model.layers[il].wqkv, input)``) --, and
    ``rope_freqs`` where the graph rotates without it (``ROPE_FACTORS``: falcon-h1.cpp
    loads it and passes ``nullptr`` as ggml_rope_ext's freq_factors)."""
    kinds = SCALES.get(arch, frozenset())
    rec_unscaled = RECURRENT_UNSCALED.get(arch, frozenset())
    names = set(names)
    return sorted(n for n in names if n.endswith(".input_scale")
                  or (n == "rope_freqs.weight" and arch not in ROPE_FACTORS)
                  or (arch in UNREAD and UNREAD[arch].fullmatch(n) is not None)
                  or (n.endswith(".scale") and _kind(n.removesuffix(".scale")) not in kinds)
                  or (n.endswith(".scale") and _kind(n.removesuffix(".scale")) in rec_unscaled
                      and _layer(n) in recurrent)
                  # qwen3next.cpp / qwen35.cpp: the legacy fused ssm_in only where no attn_qkv is
                  or (n.endswith(".ssm_in.weight") and n.replace(".ssm_in.", ".attn_qkv.") in names))


def _kind(name: str) -> str:
    return name.split(".", 2)[-1] if name.startswith("blk.") else name


def _layer(name: str) -> int | None:
    """``blk.N.…``'s N (None for a tensor of no layer)."""
    return int(name.split(".", 2)[1]) if name.startswith("blk.") else None


def fold_scales(tensors: dict, arch: str = "", recurrent: frozenset[int] = frozenset()) -> dict:
    """Every ``X.scale`` the arch's graph applies folded into ``X.weight`` (and
    into ``X.bias`` where the graph scales after the bias); the unused ones
    (``unused_tensors``; ``recurrent``: its recurrent layers) dropped. See
    ``GGUFImport.gguf_import_prepare``."""
    tensors = dict(tensors)
    for name in unused_tensors(tensors, arch, recurrent):
        del tensors[name]
    for sname in [n for n in tensors if n.endswith(".scale")]:
        base = sname.removesuffix(".scale")
        get_s = tensors.pop(sname)
        if base + ".weight" not in tensors:
            raise UsageError(f"--gguf: {sname} scales no {base}.weight")

        def scaled(get_t, get_s=get_s, sname=sname):
            def get():
                t = get_t()
                s = np.asarray(get_s(), dtype=np.float32).reshape(-1)
                if s.size == 1:
                    return t * s[0]
                if s.size == t.shape[0]:  # one scale per expert ({n_expert}): [E, ...]
                    return t * s.reshape(-1, *([1] * (t.ndim - 1)))
                raise UsageError(f"--gguf: {sname} has {s.size} elements; a scale has one (or one per expert)")
            return get

        tensors[base + ".weight"] = scaled(tensors[base + ".weight"])
        if _BIAS_THEN_SCALE.search(sname) and base + ".bias" in tensors:
            tensors[base + ".bias"] = scaled(tensors[base + ".bias"])
    return tensors


def rope_freqs(meta: GGUFMeta, kw: dict, tensors: dict) -> None:
    """A file's ``rope_freqs`` tensor (llama.cpp's ``model.get_rope_factors``: each
    pair's frequency divided by its factor, ggml_rope_ext ``freq_factors``; the
    llama, granite and llama4 loaders take it) into ``kw["rope_parameters"]``:
    HF's own ``llama3`` type where the factors follow that formula
    (conversion/llama.py ``generate_extra_tensors``), else the factors as they
    are (``freq_factors``, applied by ``rope_from_config`` and
    ``apply_freq_factors``: llama.cpp's random-model generator writes random ones)."""

    if "rope_freqs.weight" not in tensors or meta.arch not in ROPE_FACTORS:
        # a graph that never reads it (falcon-h1.cpp: ggml_rope_ext(..., nullptr, ...)) rotates
        # with theta alone; the tensor is listed unused (``unused_tensors``)
        return
    rp = kw.get("rope_parameters") or {}
    if "rope_theta" not in rp:
        if any(isinstance(v, dict) and v.get("rope_type") == "proportional" for v in rp.values()):
            return  # gemma4: the family's reverse read it as proportional RoPE's turned pairs
        raise UsageError(f"--gguf {meta.path}: rope_freqs.weight with per-layer-type RoPE parameters is not read here")
    factors = np.asarray(tensors["rope_freqs.weight"](), dtype=np.float64).reshape(-1)
    hd = kw.get("head_dim") or kw["hidden_size"] // kw["num_attention_heads"]
    try:
        kw["rope_parameters"] = llama3_from_factors(meta, factors, rp, hd)
    except UsageError:
        if factors.size != hd // 2 or rp.get("rope_type") != "default":
            raise
        kw["rope_parameters"] = {**rp, "freq_factors": [float(f) for f in factors]}


def _squeeze_leading(shape) -> tuple:
    # ggml drops trailing ne == 1 (ggml_n_dims) when it writes a tensor, numpy-leading 1s here
    shape = tuple(int(d) for d in shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


# Fused tensors a file may carry in place of the parts the export writes (llama.cpp
# loads either: create_tensor_qkv's wqkv, create_tensor_gate_up_exps' gate_up_exps;
# convert_hf_to_gguf.py writes them with --fuse-qkv / --fuse-gate-up-exps): the
# parts, concatenated in this order along the output rows
FUSED = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_gate_up_exps": ("ffn_gate_exps", "ffn_up_exps")}


# biases llama.cpp creates TENSOR_NOT_REQUIRED for every arch (create_tensor_qkv's q/k/v
# ones, and wo_b): where HF's one attention_bias switch asks for all four, an absent
# one is a zero bias -- the same function
_ATTN_BIAS = re.compile(r"blk\.\d+\.attn_(q|k|v|qkv|output)\.bias")


def split_fused(tensors: dict, expected: dict[str, tuple], where: str) -> dict:
    """The file's fused tensors split into the parts the export traces, where the
    parts are expected and absent (``expected``: GGUF name -> numpy shape)."""
    tensors = dict(tensors)
    for name in list(tensors):
        m = re.fullmatch(r"(blk\.\d+)\.(\w+)\.(weight|bias)", name)
        if not m or m.group(2) not in FUSED:
            continue
        parts = [f"{m.group(1)}.{p}.{m.group(3)}" for p in FUSED[m.group(2)]]
        if not all(p in expected and p not in tensors for p in parts):
            continue
        axis = -2 if len(expected[parts[0]]) >= 2 else -1
        sizes = [expected[p][axis] for p in parts]
        get = tensors.pop(name)

        def part(k, get=get, sizes=sizes, axis=axis, name=name):
            def load():
                t = get()
                if t.shape[axis] != sum(sizes):
                    raise UsageError(f"{where}: fused tensor {name} has {t.shape[axis]} rows; its parts need "
                                     f"{' + '.join(map(str, sizes))}")
                lo = sum(sizes[:k])
                return np.take(t, np.arange(lo, lo + sizes[k]), axis=axis)
            return load

        for k, p in enumerate(parts):
            tensors[p] = part(k)
    return tensors


def trace_import(family, tensors: dict, model, config, variant: str | None, path: str = "",
                 provenance: dict | None = None) -> dict[str, np.ndarray]:
    """Every HF tensor of ``model`` from the file, through the export run backwards.

    For each HF tensor, its element indices go through ``gguf_convert`` (the
    converter's layout steps) and gguf's tensor-name map: each resulting GGUF
    tensor holds, at every position, the index of the HF element the export
    put there. The file's tensor (dequantized) is scattered back by those
    indices, and ``gguf_value_unmap`` undoes the elementwise value step. Every
    HF element must be covered, every GGUF tensor of the file used (a fused
    tensor -- ``FUSED`` -- stands for its parts); a tensor whose shape
    contradicts the metadata is refused. ``provenance`` (if given) receives, per
    HF tensor, the GGUF tensors it came from."""
    return Trace(family, tensors, model, config, variant, path, memo={},
                 layer_key=layer_key_for(family, config, variant)).all(provenance)


def layer_key_for(family, config, variant: str | None):
    """``Trace``'s memo key of an HF tensor: a decoder layer's tensor by its name within
    the layer, its shape and the layer's description (layers of one description go
    through the same export steps); any other tensor by its name and shape."""
    try:
        descs = [repr(lc) for lc in family.layer_configs(config, variant)]
    except Exception:  # noqa: BLE001 -- a config the layer descriptions refuse: nothing kept
        return lambda name, shape: None
    prefix = family.layers_path + "."

    def key(name: str, shape: tuple):
        if not name.startswith(prefix):
            return (name, shape)  # a tensor outside the layers: traced once (a layer-by-layer reading reads it again)
        i, _, rest = name[len(prefix):].partition(".")
        return (rest, shape, descs[int(i)]) if i.isdigit() and int(i) < len(descs) else None

    return key


class Trace:
    """``trace_import``'s steps for one model, set up once: the GGUF tensor each HF
    tensor's pieces go to (pass 1, on cheap int8 stand-ins), then any HF tensor
    read back when asked (``tensor``) -- all of them (``all``), or one decoder
    layer at a time for a model too large to hold (harness/pipeline/gguf/stream.py), whose
    names and shapes ``check`` refuses up front as ``all`` would. ``memo``: the
    index traces kept by (the name with its layer number out, the shape, the
    layer's description) -- each layer's tensors go through the same steps, and
    tracing them again was most of reading one layer."""

    def __init__(self, family, tensors: dict, model, config, variant: str | None, path: str = "",
                 memo: dict | None = None, layer_key=None):
        self.family, self.config, self.variant = family, config, variant
        self.tmap = family.gguf_tensor_map(config)
        emb = getattr(model.get_input_embeddings(), "weight", None)
        meta = emb is not None and emb.device.type == "meta"
        # a model whose weights are not held (its parameters on the meta device, all at
        # address 0) is told apart by identity: a tied head is the embedding's Parameter
        sd = model.state_dict(keep_vars=True) if meta else model.state_dict()

        def tied(p):
            return emb is not None and (p is emb if meta else p.data_ptr() == emb.data_ptr())

        emb_name = next((n for n, p in sd.items() if tied(p)), None)
        self.where = f"--gguf {path}" if path else "--gguf"
        # a buffer the export drops (gguf_convert yields nothing: minimax's lightning decay
        # tables, which llama.cpp computes as HF's __init__ does) is the model's own, not the file's
        buffers = {n for n, _ in model.named_buffers()}
        self.params = [(n, p) for n, p in sd.items()
                       # the tied head: never exported (GGUFExport.gguf_tensors), loaded with token_embd
                       if not (tied(p) and n != emb_name)
                       and not (n in buffers and not self.traced(n, p, None))]
        # pass 1: the shape of every GGUF tensor the export writes (cheap int8 stand-ins)
        self.pieces = {n: [(g, tuple(a.shape)) for g, a in self.traced(n, p, None)] for n, p in self.params}
        self.expected = {g: shape for pcs in self.pieces.values() for g, shape in pcs}
        self.tensors = split_fused(tensors, self.expected, self.where)
        self.memo, self.layer_key = memo, layer_key

    def traced(self, name, p, dtype):
        """``(gguf name, array of HF element indices)`` for each piece of ``name``."""
        family, config = self.family, self.config
        idx = np.arange(p.numel(), dtype=dtype).reshape(tuple(p.shape)) if dtype is not None else \
            np.zeros(tuple(p.shape), dtype=np.int8)
        out = []
        for hf_style, arr in family.gguf_convert(name, idx, config, self.variant):
            arr = np.asarray(arr)
            if not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(f"family {family.name}: gguf_convert({name}) changed element values "
                                f"({arr.dtype}); an elementwise step belongs in gguf_value_map")
            g = self.tmap.get_name(hf_style, try_suffixes=(".weight", ".bias"))
            if g is None:
                raise ValueError(f"family {family.name}: no GGUF name for {hf_style!r} (HF {name})")
            out.append((g, arr))
        return out

    def _indices(self, name, p):
        """``[(gguf name, indices or None where the trace is the identity)]`` for ``name``."""
        key = None
        if self.memo is not None and self.layer_key is not None:
            key = self.layer_key(name, tuple(p.shape))
        if key is not None and key in self.memo:
            return [(g, ix) for (g, _), ix in zip(self.pieces[name], self.memo[key])]
        n = int(p.numel())
        pieces = self.traced(name, p, np.int32 if n < 2**31 else np.int64)
        out = [(g, None if len(pieces) == 1 and _identity_trace(arr) else arr) for g, arr in pieces]
        if key is not None:
            self.memo[key] = [ix for _, ix in out]
        return out

    def tensor(self, name: str, p, used: set, provenance: dict | None = None) -> np.ndarray:
        """HF tensor ``name`` (parameter ``p``) from the file's tensors."""
        tensors, where, family = self.tensors, self.where, self.family
        pieces = self._indices(name, p)
        if len(pieces) == 1 and pieces[0][1] is None and pieces[0][0] in tensors:
            g = pieces[0][0]
            shape = self.pieces[name][0][1]  # the piece's own (the export may reshape in flat order)
            # an F32 tensor is a read-only view of the mapped file: copied once, a dequantized one not
            data = np.require(np.asarray(tensors[g](), dtype=np.float32), requirements="W")
            if _squeeze_leading(data.shape) != _squeeze_leading(shape):
                raise UsageError(f"{where}: tensor {g} has shape {tuple(data.shape)} (numpy order); "
                                 f"the metadata makes it {shape} for family {family.name}")
            used.add(g)
            if provenance is not None:
                provenance[name] = [g]
            return family.gguf_value_unmap(name, data.reshape(tuple(p.shape)), self.config)
        n = int(p.numel())
        flat = None
        covered = None
        missing = []
        for g, arr in pieces:
            if arr is None:  # an identity trace beside others (not kept so): traced again
                arr = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64).reshape(tuple(p.shape))
            if g not in tensors and _ATTN_BIAS.fullmatch(g):
                data = np.zeros(arr.shape, dtype=np.float32)  # an optional bias the file leaves out
            elif g not in tensors:
                missing.append(g)
                continue
            else:
                data = np.asarray(tensors[g]())
            if _squeeze_leading(data.shape) != _squeeze_leading(arr.shape):
                raise UsageError(f"{where}: tensor {g} has shape {tuple(data.shape)} (numpy order); "
                                 f"the metadata makes it {tuple(arr.shape)} for family {family.name}")
            if flat is None:
                flat = aligned_empty(n)
                flat[...] = 0.0
                covered = np.zeros(n, dtype=bool)
            ix = arr.reshape(-1)
            flat[ix] = data.reshape(-1)
            covered[ix] = True
            used.add(g)
        if flat is None or not covered.all():
            what = ", ".join(missing) if missing else "(no GGUF tensor)"
            raise UsageError(f"{where}: the file has no {what} (HF {name}) for family {family.name}")
        if provenance is not None:
            provenance[name] = [g for g, _ in pieces]
        return family.gguf_value_unmap(name, flat.reshape(tuple(p.shape)), self.config)

    def _left(self, used: set) -> None:
        left = sorted(set(self.tensors) - used)
        if left:
            raise UsageError(f"{self.where}: tensors with no counterpart in family {self.family.name}'s HF model: "
                             f"{', '.join(left[:6])}{' ...' if len(left) > 6 else ''}")

    def all(self, provenance: dict | None = None) -> dict[str, np.ndarray]:
        """Every HF tensor (``trace_import``)."""
        out: dict[str, np.ndarray] = {}
        used: set[str] = set()
        for name, p in self.params:
            out[name] = self.tensor(name, p, used, provenance)
        self._left(used)
        return out

    def check(self, shapes: dict, provenance: dict | None = None) -> None:
        """What ``all`` refuses by names and shapes alone, with no tensor read: a
        GGUF tensor the model needs and the file lacks (an optional attention bias
        aside), one whose shape (``shapes``: numpy order) is not the export's, one
        the model has no place for. ``provenance`` as ``all`` gives it."""
        used: set[str] = set()
        for name, _ in self.params:
            missing = []
            for g, shape in self.pieces[name]:
                if g not in self.tensors:
                    if not _ATTN_BIAS.fullmatch(g):
                        missing.append(g)
                    continue
                if g in shapes and _squeeze_leading(shapes[g]) != _squeeze_leading(shape):
                    raise UsageError(f"{self.where}: tensor {g} has shape {tuple(shapes[g])} (numpy order); "
                                     f"the metadata makes it {shape} for family {self.family.name}")
                used.add(g)
            if missing:
                raise UsageError(f"{self.where}: the file has no {', '.join(missing)} (HF {name}) for family "
                                 f"{self.family.name}")
            if provenance is not None:
                provenance[name] = [g for g, _ in self.pieces[name]]
        self._left(used)
