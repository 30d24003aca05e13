"""Every hook a family may define, in one file, grouped by who calls it (issue 37).

In the manner of pytest's hookspec: each hook is declared here once -- a method
with its signature and a docstring (``@hook``), or a class attribute with its
type and meaning (``data``) -- and implemented, with its default, by ``Family``'s
mixins (base.py and the underscored modules) or by the shared base that adds it
(``LlamaLike``, ``MlaFamily``, ``RecurrentProbes``, ``Mamba2Mixer``). A family
class defines hooks and nothing else in public: a family's own helpers are
``_underscored``, so a misspelt hook (``lc_point``, ``hf_taps_``) is refused when
its class is defined, in one line naming the nearest hook (``check``), where it
would otherwise be silently ignored. tests/test_hookspec.py holds this file to
the implementations: every public member of the shared bases is declared here,
with the same parameters.

``conformance explain`` resolves these hooks for a family, in this order, and
docs/how-to/add-a-family.md lists them from here.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass

# who calls each group of hooks, in the order data flows
GROUPS = {
    "family": "the registry, `conformance list`, `explain` and the matrix: what the family is",
    "build": "the build stage (harness/pipeline/build.py) and the GGUF writer's streamed export: the HF model and its "
             "seeded weights",
    "config": "`--set` and the build stage: the HF config from the tiny settings",
    "impl": "the candidate side: impl's layer descriptions and weights",
    "hf": "the HF reference (harness/references/hf): where each probe is read in HF's modules",
    "llamacpp": "the llama.cpp reference (harness/references/llamacpp): where each probe is read in llama.cpp's graph",
    "gguf_export": "the GGUF writer (harness/pipeline/gguf/export.py): the converter's steps (convert_hf_to_gguf.py)",
    "gguf_import": "`--gguf`: a GGUF read back into the family's HF config and weights",
    "judge": "the scheduler and the judge: what a reference cannot run, the values a finding reads, ggml's input orders",
    "fuzz": "the fuzzer (harness/fuzz.py)",
    "bisect": "feature bisection: the switches that turn one feature off",
    "llama_like": "LlamaLike's defaults (base.py), for a family on that base",
    "mla": "MlaFamily's defaults (_mla.py), for a DeepSeek-style MLA family",
    "recurrent": "RecurrentProbes' defaults (_recurrent.py), for a family with recurrent layers",
    "mamba2": "Mamba2Mixer's defaults (_mamba2.py), for a family with Mamba-2 mixers",
}


@dataclass(frozen=True)
class Hook:
    name: str
    group: str
    kind: str  # "method" or "data"
    signature: str  # "(self, config, i: int) -> ..." or the attribute's type
    doc: str
    params: tuple = ()  # a method's parameters, (name, kind, default) each: what the implementations must take


HOOKS: dict[str, Hook] = {}


def hook(group: str, static: bool = False):
    """Declare the method hook below (its signature and docstring) in ``group``."""
    def declare(fn):
        sig = inspect.signature(fn)
        params = tuple((p.name, p.kind.name, repr(p.default)) for p in sig.parameters.values()
                       if not (static is False and p.name == "self"))
        _add(Hook(fn.__name__, group, "method", str(sig), inspect.getdoc(fn) or "", params))
        return fn
    return declare


def data(group: str, name: str, type_: str, doc: str) -> None:
    """Declare class attribute ``name`` (of type ``type_``) in ``group``."""
    _add(Hook(name, group, "data", type_, " ".join(doc.split())))


def _add(h: Hook) -> None:
    assert h.group in GROUPS and h.name not in HOOKS, h
    HOOKS[h.name] = h


class UnknownHook(TypeError):
    """A family class that defines a public name no hook has (one line)."""


# the modules of the machinery every family shares: their public members ARE the hooks
SHARED = ("harness.families.base", "harness.families._")


def nearest(name: str) -> str:
    """The declared hook nearest to ``name``."""
    return (difflib.get_close_matches(name, HOOKS, n=1, cutoff=0.0) or [""])[0]


def check(cls) -> None:
    """Refuse a family class (one outside the shared machinery) that defines a public name
    no hook declares: a misspelt hook would be silently ignored."""
    for c in cls.__mro__:  # the class and the mixins it takes from a family's folder
        if c is object or c.__module__.startswith(SHARED):
            continue
        for name in c.__dict__:
            if name.startswith("_") or name in HOOKS:
                continue
            raise UnknownHook(f"family class {c.__qualname__} ({c.__module__}) defines {name!r}, which is no family "
                              f"hook: did you mean {nearest(name)!r}? (a family's own helpers are _underscored; "
                              "harness/families/hookspec.py declares every hook)")


def by_group() -> dict[str, list[Hook]]:
    """The hooks in ``GROUPS``' order, each group in declaration order."""
    return {g: [h for h in HOOKS.values() if h.group == g] for g in GROUPS}


# ---------------------------------------------------------------------------------------------------------
# The hooks. A method's body is never run: it is the declaration (the default lives in the mixins).


# ---------------------------------------------------------------------- family

data('family', 'name', 'str',
     """The family's name: the --family value, its folder, its rows' ``family``.""")
data('family', 'hf_model_type', 'str',
     """HF's ``model_type`` (``AutoConfig.for_model``): the config class and modeling file the family mirrors.""")
data('family', 'description', 'str',
     """One line for ``conformance list`` and ``explain``.""")
data('family', 'tiny', 'dict',
     """Per-family sizes, passed as kwargs at construction so derived fields (layer_types, head_dim, ...) come out
     right.""")
data('family', 'declared_features', 'tuple[str, ...]',
     """The features the family's layers exercise, as the matrix names them (a feature no case runs is listed as
     unexercised).""")
data('family', 'variants', 'tuple[str, ...]',
     """Named variants of the family's impl mapping and GGUF export (MLA: the naive and absorbed forms); the first
     is the default.""")


# ---------------------------------------------------------------------- build

data('build', 'experts_implementation', 'str | None',
     """HF's experts kernel, passed to from_config where set (None: HF's default). "eager": the experts' own
     forward loop from the modeling file; the default grouped_mm kernel refuses float64 (HF at --dtype
     float64).""")

@hook('build')
def build_model(self, config, seed: int, dtype: str='float32', weights: str='random'):
    """The HF model of ``config`` with seeded weights: ``random`` (O(1) activations, ``init_weights``), ``realistic``
    (the same, then a trained model's statistics: ``realistic_weights``) or ``trained`` (realistic, and the
    recurrent layers' decays as trained checkpoints spread them: ``trained_apply``)."""
data('build', 'qk_weight_names', 'tuple[str, ...]',
     """The names (endings) of the projections whose product is the attention score: scaled by
     ``realistic_weights`` so the pre-softmax scores span tens, as a trained model's do.""")
data('build', 'qk_norm_names', 'tuple[str, ...]',
     """... and of the QK norms' weights, which a QK-norm family's scores scale with instead""")

@hook('build')
def realistic_weights(self, model, config, seed: int, weights: str='realistic') -> None:
    """A trained model's statistics on top of the random weights, where random N(0, 1/in) weights have none (issue
    27 / 28: bounds fitted on those raised false alarms on real checkpoints, and low-precision bugs hid behind
    O(1) scores):"""

@hook('build')
def realistic_plan(self, config, seed: int, weights: str='realistic') -> dict:
    """What ``realistic_weights`` draws once for a model (its own generator): the outlier channels, their factors
    and signs; ``trained``: the seed of the decays."""

@hook('build')
def realistic_apply(self, name: str, p, plan: dict) -> None:
    """``realistic_weights``' step for ONE parameter (its tensor changed in place, under no_grad): each
    parameter's own, so a model written tensor by tensor as it is drawn (gguf/stream.py ``export_streamed``) takes
    the same values."""

@hook('build')
def trained_apply(self, name: str, p, seed: int) -> bool:
    """``weights="trained"``: a recurrent layer's decay parameters (``A_log``, ``dt_bias``, ``dt_proj.bias``) as a
    trained checkpoint spreads them, so that some channels remember for hundreds of rows; True where ``p`` was one
    of them (changed in place)."""

@hook('build')
def init_weights(self, model, seed: int) -> None:
    """Seeded weights with O(1) activations: HF's own init (std 0.02) leaves the attention nearly uniform, where a
    wrong scale or mask hardly shows."""

@hook('build')
def init_draws(self, model, seed: int, initial=None):
    """``(name, parameter, seeded value)`` of every parameter of ``model``, in the order ``init_weights`` draws
    them (sorted names, one generator): its one body, for a model held (each value then copied in) or one built on
    the meta device and written tensor by tensor as it is drawn (gguf/stream.py ``export_streamed``).
    ``initial(name, p)``: the parameter's value as HF initialised it, which ``init_value`` reads for a norm
    (default: the parameter itself)."""

@hook('build')
def init_value(self, name: str, p, r):
    """The seeded value of parameter ``name`` (``p``: HF's initial tensor, ``r``: a standard normal draw of its shape): weights scaled by 1/sqrt(fan-in), norms near one, biases small."""


# ---------------------------------------------------------------------- config

data('config', 'extra_settable', 'tuple[str, ...]',
     """Config attributes the modeling code reads with getattr() although the config class does not declare them
     (e.g. HF Qwen2Attention: getattr(config, "head_dim", ...)).""")
data('config', 'size_keys', 'dict[str, str]',
     """The config keys ``validate`` checks (a family whose HF config names its sizes otherwise overrides): the
     roles hidden, heads, kv_heads, layers, head_dim; a role the config does not have is left out.""")

@hook('config')
def config_class(self):
    """HF's configuration class for ``hf_model_type``."""

@hook('config')
def settable_keys(self) -> list[str]:
    """The config keys ``--set`` accepts: the config class's fields and ``extra_settable``."""

@hook('config')
def key_aliases(self) -> dict[str, str]:
    """The config class's own aliases (``PretrainedConfig.attribute_map``: GPT-2's ``hidden_size`` is ``n_embd``,
    MPT's is ``d_model``), so one ``--set`` / matrix override names the same size in every family."""

@hook('config')
def apply_overrides(self, d: dict, overrides: dict, table_default=None) -> dict:
    """``overrides`` (``--set`` keys; ``top.sub`` sets one key of the table ``top``) applied to the config dict
    ``d`` in place; a key the family does not offer is refused. ``table_default(top)``: the table a ``top.sub``
    key starts from where ``d`` has none (default: an empty one)."""

@hook('config')
def config_kwargs(self, overrides: dict) -> dict:
    """The kwargs the HF config is built from: ``tiny`` with ``overrides`` (``--set``) applied."""

@hook('config')
def make_config(self, overrides: dict | None=None):
    """The family's HF config: ``tiny`` with ``overrides``, validated before and after HF builds it."""

@hook('config')
def config_from_kwargs(self, kw: dict, refused: str):
    """The HF config from ``kw``, checked before (``validate``) and after (``validate_config``); ``refused``
    starts the error where HF refuses it."""

@hook('config')
def validate(self, kw: dict) -> None:
    """Shape checks HF itself does not make (it would build a model that silently truncates, or fail deep inside a
    forward), on the config keys ``size_keys`` names."""

@hook('config')
def validate_config(self, config) -> None:
    """Refuse (UsageError, one line) a config the family's impl mapping cannot describe."""


# ---------------------------------------------------------------------- impl


@hook('impl')
def layer_configs(self, config, variant: str | None=None) -> list[LayerConfig | NotInImpl]:
    """Every decoder layer's impl description (``LayerConfig``, a recurrent config, or ``NotInImpl`` with its reason), for ``variant``."""

@hook('impl')
def layer_config(self, config, i: int) -> LayerConfig | NotInImpl:
    """Decoder layer ``i``'s impl description."""

@hook('impl')
def layer_weights(self, model, config, i: int) -> dict[str, np.ndarray]:
    """Decoder layer ``i``'s weights, by impl's names, read from the HF model."""

@hook('impl')
def variant_weights(self, weights: dict, config, i: int, variant: str | None) -> dict:
    """Layer ``i``'s impl weights (``layer_weights``' dict) as a named variant stores them (default: every variant
    reads the same weights; llama's ``wo_scale`` keeps ``wo / s`` beside its ``{1}`` scale companion ``s``)."""


# ---------------------------------------------------------------------- hf

data('hf', 'layer_major', 'bool',
     """HF's cached path may run layer by layer, every call through a decoder layer before the next layer
     (harness/references/hf/layer_major.py): declared where each decoder layer reads and writes only its own cache
     layer; tests/test_layer_major.py holds every family that declares it to the call-by-call capture, bit for
     bit.""")
data('hf', 'layers_path', 'str',
     """The dotted path from the HF model to its list of decoder layers.""")
data('hf', 'hf_points', 'dict[str, Point]',
     """probe -> ``Point`` (a module path under the decoder layer, ``in``/``out``): where HF's hooks read each
     probe.""")
data('hf', 'hf_model_points', 'dict',
     """model-level probes: name -> (module path from the model root, "in"/"out")""")
data('hf', 'eager_name', 'str',
     """The eager attention function the attention module calls, by its name in the module's own modeling file
     (wrapped during capture to read q_rope, k_rope, attn_probs, attn_heads).""")
data('hf', 'hf_not_exposed', 'dict[str, str]',
     """probe -> why HF's tensor at that point is not the probe's quantity, so the capture drops it and the report
     says not-exposed with this reason (granite_swa's eager attention returns the softmax WITHOUT its sink:
     attn_probs is another quantity there; default: none)""")
data('hf', 'hf_tapped', 'dict[str, str]',
     """probe -> how ``hf_taps`` computes it where HF names no tensor for it (gemma3n's resid_mid: the decoder
     layer's own unnamed add, redone on the captured tensors); the capture's meta says so and every row compared on
     it too (default: none)""")

@hook('hf')
def decoder_layers(self, model):
    """The decoder-layer MODULES, each once (a cycled model's physical layers)."""

@hook('hf')
def invocation_order(self, config) -> list[int] | None:
    """The module (an index into ``decoder_layers``) each LAYER of a forward runs, in the order the forward runs
    them -- one entry per invocation, the layer index of the probes, the cache and the layer descriptions. None
    (the default): each module once, in order (layer i = module i). A model that re-runs its layers (hrm_text: the
    L and H stacks, each invocation its own cache slot ``layer_idx + cycle_offset``) lists every invocation; the
    HF capture counts the calls of each module within a forward, so the n-th call of module m is the n-th layer
    whose entry is m (references/hf/capture.py)."""

@hook('hf')
def layer_module(self, config, i: int) -> int:
    """The index into ``decoder_layers`` of the module layer ``i`` runs."""

@hook('hf')
def decoder_layer(self, model, config, i: int):
    """The module layer ``i`` runs (shared by every invocation of it)."""

@hook('hf')
def module_path(self, config, m: int) -> str:
    """The dotted path of decoder-layer module ``m`` from the model root."""

@hook('hf')
def hf_force(self, layer, forced):
    """Teacher-force decoder-layer module ``layer``: ``forced()`` gives the running layer's ``layer_in`` (a torch
    tensor in the compute dtype) or None (its own input). Default: a forward pre-hook, prepended, replacing the
    layer's ``hidden_states`` (the ``layer_in`` probe hook then records the forced input). A family whose
    ``layer_in`` is not the layer's input overrides (gemma3n: the active AltUp prediction). Returns a handle with
    ``remove()``."""

@hook('hf')
def hf_points_for(self, config, i: int) -> dict[str, Point]:
    """The probe points of layer ``i`` (families with mixed layer kinds override)."""

@hook('hf')
def hf_taps(self, model, config, sink: dict):
    """A context manager held around the HF forward that records probes neither a module hook nor the eager-
    function wrapper can read -- for models whose attention math is inline (bloom, mpt: no
    ``eager_attention_forward``). It writes ``sink[layer_idx][probe] = float64 array``, as the eager wrapper does
    (``hf_canonical`` then applies). Default: nothing."""

@hook('hf')
def hf_derived(self, probes: dict, config, layer_cfgs) -> dict:
    """Probes HF exposes only as views of other captured (canonical) tensors, ``{"L{i}.{probe}": array}``
    (default: none; MLA families slice the rope part out of the query and key the eager attention reads)."""

@hook('hf')
def hf_products(self, lc: LayerConfig) -> dict[str, float]:
    """The factor HF's next line multiplies a probe's module output by, where no module returns the product
    (falcon_h1's muP multipliers): ``{probe: factor}``. Default: none."""

@hook('hf')
def hf_probe(self, probe: str, arr: np.ndarray, lc: LayerConfig, own: frozenset=frozenset()) -> np.ndarray:
    """A captured module output as the probe's value: the canonical layout (``hf_canonical``), times the factor
    HF's next line applies (``hf_products``) -- except for the probes in ``own``, where the reference's module
    output already is its own value (mlx-lm folds some multipliers into weights, and never applies others:
    harness/references/mlx/families.py ``OWN_VALUE``)."""

@hook('hf')
def hf_canonical(self, probe: str, arr: np.ndarray, lc: LayerConfig) -> np.ndarray:
    """HF's tensor for ``probe`` ([seqs, ...]) in the canonical layout."""

@hook('hf')
def hf_refusal(self, config) -> str | None:
    """Why HF cannot compute this config at all -- a setting its modeling file crashes on -- in one line with the
    line and what is valid, or None (default). Asked by the HF references (hf, hf_cached: ``Reference.
    config_refusal``); any case naming them is refused, exit 2, before any work (harness/budget.py)."""

@hook('hf')
def hf_cached_schedule_refusal(self, config, chunks: tuple[int, ...]) -> str | None:
    """Why HF's cached path cannot run this config on a schedule whose calls carry ``chunks`` rows (each
    sequence's, in order: ``harness.schedule.chunk_sizes`` of the case's ``--schedule``) -- a crash its source
    predicts, said in one line with its lines and what is valid -- or None (default). Named alone, hf_cached is
    refused for it (exit 2); under ``--ref all`` it sits the case out in a ``skipped`` row that says why
    (``Build.schedule_refusals``): a known crash is neither an error row nor a pass."""


# ---------------------------------------------------------------------- llamacpp

data('llamacpp', 'lc_points', 'dict[str, LcPoint]',
     """llama.cpp's probe points, per layer; a probe not named here is "not exposed".""")
data('llamacpp', 'lc_model_points', 'dict[str, LcPoint]',
     """model-level: the first layer's input, the final norm, the logits""")
data('llamacpp', 'lc_not_exposed', 'dict[str, str]',
     """probe -> why llama.cpp's graph exposes no tensor for it (the report's not-exposed reason; default: none
     given)""")

@hook('llamacpp')
def lc_points_for(self, config, i: int) -> dict[str, LcPoint]:
    """probe -> ``LcPoint`` (a ``cb()`` name of src/models/<arch>.cpp, a pick, a layout) for layer ``i``: where llama.cpp's eval callback reads each probe."""

@hook('llamacpp')
def lc_layer_input(self, config, i: int) -> tuple[str, LcPoint]:
    """Where layer ``i``'s input lives in llama.cpp: the embeddings for layer 0, the previous layer's ``l_out``
    after that."""

@hook('llamacpp')
def lc_input_sum(self, config, i: int) -> tuple[LcPoint, ...] | None:
    """Where the graph names no tensor for layer ``i``'s input (``lc_layer_input`` None) but names the float32
    tensors it adds to make it, those (full names: ``LcPoint("stack_norm-4")``): the capture sums them in float32
    as ``ggml_add`` does (elementwise, exact), and the meta says the input was derived. None (default): no such
    sum."""

@hook('llamacpp')
def lc_canonical(self, probe: str, arr: np.ndarray, lc, config) -> np.ndarray:
    """llama.cpp's array ([seqs, tokens, ...] after token placement) in the canonical layout: reshape head-major
    rows, undo converter permutations."""

@hook('llamacpp')
def hf_canonical_heads(self, probe: str, arr: np.ndarray, lc) -> np.ndarray:
    """``arr`` (HF's probe) with its heads in llama.cpp's order where a GQA layer's converter permuted them."""

@hook('llamacpp')
def lc_refusal(self, config) -> str | None:
    """Why llama.cpp cannot hold this config at all -- a setting its graph asserts against, a tensor its loader
    requires or never applies, a key its converter cannot write -- in one line naming the source lines and what is
    valid, or None (default). Asked by the llama.cpp reference (``Reference.config_refusal``); any case naming it
    is refused, exit 2, before any work (harness/budget.py)."""


# ---------------------------------------------------------------------- gguf_export

data('gguf_export', 'gguf_arch', 'str | None',
     """The llama.cpp architecture the GGUF export writes (None: no llama.cpp reference).""")
data('gguf_export', 'converter_rope_freqs', 'bool',
     """The converter writes llama3 RoPE scaling as a rope_freqs tensor: LlamaModel and its subclasses do
     (conversion/llama.py LlamaModel.generate_extra_tensors), other TextModels never (conversion/base.py:
     generate_extra_tensors returns nothing). Written or not, as the converter does: an arch that reads no
     rope_freqs then refuses the file (llama-model.cpp done_getting_tensors), as it refuses a user's.""")

@hook('gguf_export')
def gguf_export_refusal(self, config) -> str | None:
    """Why ``config`` is no file of ``gguf_arch`` -- the converter writes it as another arch, or llama.cpp's graph
    for the arch cannot run it -- with the converter's or the loader's line; None (default) where it is. The
    llama.cpp reference then records a not-implemented row with these words (``LlamaCpp.refusal``), never a
    crash."""

@hook('gguf_export')
def gguf_params(self, w, config, variant: str | None=None) -> None:
    """The metadata llama.cpp reads for the arch: conversion/base.py ``TextModel.set_gguf_parameters`` plus the
    arch's own additions."""

@hook('gguf_export')
def gguf_model_params(self, w, model, config, variant: str | None=None) -> None:
    """The metadata the converter takes from the WEIGHTS, not the config (default: none): apertus's per-layer
    xIELU parameters, which conversion/llama.py ``ApertusModel.modify_tensors`` writes as key arrays instead of
    tensors."""

@hook('gguf_export')
def gguf_transform(self, name: str, data: np.ndarray, config) -> np.ndarray:
    """A layout step the converter applies to one tensor (default: none). Only moves elements (permute, reshape,
    slice): the import runs it backwards by tracing element indices through it (``_gguf_import.trace_import``); a
    step that changes VALUES belongs in ``gguf_value_map``."""

@hook('gguf_export')
def gguf_value_map(self, name: str, data: np.ndarray, config) -> np.ndarray:
    """An elementwise value step the converter applies to HF tensor ``name`` (gemma's ``w + 1``, ``-exp(A_log)``;
    default: none), with its inverse in ``gguf_value_unmap``. Elementwise, so it commutes with the layout
    steps."""

@hook('gguf_export')
def gguf_convert(self, name: str, data: np.ndarray, config, variant: str | None=None):
    """One HF tensor -> the ``(hf_style_name, array)`` pairs gguf's tensor map names: the converter's
    ``modify_tensors`` / ``filter_tensors`` for it (default: ``gguf_transform``'s one tensor, or none where it
    drops the tensor). A family whose converter renames, splits or stacks overrides. Layout only, as
    ``gguf_transform``: it also runs on integer index arrays."""
data('gguf_export', 'gguf_tensor_names_from', 'str | None',
     """An arch of the installed gguf package whose tensor map names this family's HF tensors as llama.cpp's
     ``gguf_arch`` does, used only where the installed gguf predates ``gguf_arch`` (gguf 0.19 has no mellum, no
     hy_v3; llama.cpp's vendored gguf-py does): the arch string written is still ``gguf_arch``, and llama.cpp's
     loader checks every name against its own table (a wrong one fails to load).""")

@hook('gguf_export')
def gguf_tensor_map(self, config):
    """gguf's own tensor-name map of the family's arch (``get_tensor_name_map``), or of ``gguf_tensor_names_from``
    where the installed gguf lacks the arch."""

@hook('gguf_export')
def gguf_tensors(self, model, config, variant: str | None=None):
    """``(gguf_name, array)`` for every HF tensor, converted (``gguf_convert``) and renamed with gguf's own tensor
    map, as ``modify_tensors`` does."""

@hook('gguf_export')
def gguf_hf_tensor(self, name: str, data: np.ndarray, config, variant: str | None, tmap):
    """``(gguf_name, array)`` for ONE HF tensor (``gguf_tensors``' step for each: a model written tensor by tensor
    as it is drawn, gguf/stream.py, takes the same)."""

@hook('gguf_export')
def gguf_extra_tensors(self, config, variant: str | None=None):
    """The tensors the converter writes from the config alone (llama3's rope_freqs)."""

data('gguf_export', 'norm_plus_one', 'bool',
     """NormPlusOne (a mixin of _gguf_export.py): whether the converter writes ``*norm.weight + 1`` (HF's norms
     multiply by ``1 + w``); a test switches it off.""")
data('gguf_export', 'norm_plus_one_skip', 'tuple[str, ...]',
     """NormPlusOne: the norms (name endings) the converter leaves alone.""")


# ---------------------------------------------------------------------- gguf_import

data('gguf_import', 'gguf_reads_as', 'str | None',
     """Another family whose reverse reads this family's files as they are -- the same HF model class and llama.cpp
     graph (sarvam_mla's files are deepseek_v3's): --gguf picks that one unless --family names this (None: this
     family is a candidate itself)""")

@hook('gguf_import')
def gguf_import_unsupported(self) -> str | None:
    """Why ``--gguf`` cannot read this family's files (None: it can)."""

@hook('gguf_import')
def config_from_gguf(self, meta: GGUFMeta, shapes: dict[str, tuple], tensors: dict) -> dict:
    """HF config kwargs from a GGUF, as llama.cpp reads the arch (the family's ``load_arch_hparams``, on top of
    ``read_hparams``). ``shapes``: GGUF tensor name -> shape in numpy order; ``tensors``: name -> a callable
    giving the dequantized float32 array (for a tensor that carries a hyper-parameter, llama's ``rope_freqs``)."""

@hook('gguf_import')
def gguf_variant_of(self, shapes: dict[str, tuple]) -> str | None:
    """The family's named variant a file is written in (default: the first)."""

@hook('gguf_import')
def gguf_value_unmap(self, name: str, data: np.ndarray, config) -> np.ndarray:
    """The inverse of ``gguf_value_map`` for HF tensor ``name`` (default: none)."""

@hook('gguf_import')
def gguf_import_prepare(self, tensors: dict, config) -> dict:
    """The file's tensors (name -> loader) before ``trace_import`` places them. Default: src/llama-model.cpp's
    generic pass every arch gets loads ``X.scale`` ({1}, or {n_expert} for stacked experts) and ``X.input_scale``;
    where the arch's graph passes the scale on (``build_lora_mm``: ``(W x) * s``) it is folded into the weight
    (``W * s``: the same function, which HF and impl compute from it); the rest is read by no graph and dropped
    (``unused_tensors``, listed in meta.json). A family consumes what else it writes outside the HF state dict.
    ``rope_freqs`` is a hyper-parameter (``rope_freqs``, read into the config): not a weight."""

@hook('gguf_import')
def gguf_recurrent_layers(self, config) -> frozenset[int]:
    """The layers llama.cpp builds as recurrent (``hparams.is_recr``: the config read from the file's
    ``attention.recurrent_layers``), where an arch of ``RECURRENT_UNSCALED`` multiplies a tensor kind unscaled
    that its attention layers scale (qwen3next.cpp build_qkvz: ``build_lora_mm(model.layers[il].wqkv, input)``).
    Empty for every other arch."""

@hook('gguf_import')
def gguf_patch_model(self, model, config) -> None:
    """What the HF model built from the read-back config still lacks (default: a RoPE table with llama.cpp's per-
    pair frequency factors, where the config carries them)."""

@hook('gguf_import')
def gguf_import_tensors(self, tensors: dict, model, config, variant: str | None=None, path: str='', provenance: dict | None=None) -> dict[str, np.ndarray]:
    """The HF state dict of ``model`` from the file's tensors (``trace_import``)."""


# ---------------------------------------------------------------------- judge


@hook('judge')
def ggml_input_orders(self, desc) -> dict:
    """impl weight name -> the order of its input columns in the GGUF, where the converter permuted them (default:
    none): ggml quantizes an activation row in blocks of the FILE's columns
    (harness/references/llamacpp/ggml_matmul.py)."""

@hook('judge')
def finding_values(self, config) -> dict:
    """Values this family reads from a reference's config where no config key says them, for its findings'
    conditions (``config = { "family.NAME" = ... }``, harness/policy.py config_value): gemma3n's KV sharing and
    activation sparsity as llama.cpp's fixed rules make them. Default: none."""

# ---------------------------------------------------------------------- fuzz

data('fuzz', 'fuzz_space', 'dict | None',
     """The fuzzer's space of the family (harness/fuzz.py): the knobs it may turn -- each offered only where the
     family's llama.cpp graph reads the GGUF key it becomes -- and those only HF expresses (``hf_only``: judged
     against HF alone); None: the family is not fuzzed.""")


# ---------------------------------------------------------------------- bisect


@hook('bisect')
def feature_switches(self, config, features: set[str]) -> dict[str, dict]:
    """Config overrides that switch one feature OFF in the reference -- and so in impl, which derives its layers
    from the same config. Used by feature bisection; a family extends this (calling super) for what only it knows.
    Only settings HF itself honours belong here."""

@hook('bisect')
def case_switches(self, case, features: set[str]) -> dict[str, dict]:
    """Case fields that switch a feature off for every side at once (the KV backing; a family's named variant).
    Used by feature bisection."""
data('bisect', 'switch_modules', 'dict[str, tuple[str, ...]]',
     """HF module paths (relative to a decoder layer) of the norms a module switch replaces by the identity; a
     family whose modules are named otherwise overrides.""")
data('bisect', 'switch_params', 'dict[str, tuple[str, ...]]',
     """HF parameter name endings (within a decoder layer) a weight switch neutralises""")

@hook('bisect')
def model_switches(self, config) -> dict[str, 'ModelSwitch']:
    """Features switched off (or neutralised) in the seeded model itself, where no config field reaches:
    ``Case.switch_off`` names them, the case's Build applies them to the model every side takes its weights from
    (and, for a module switch, to impl's layer configs). Each layer kind owns its switches
    (``LayerKind.switches``, harness/kinds/<kind>/switches.py); a family adds what only it has by extending
    this."""


# ---------------------------------------------------------------------- llama_like

data('llama_like', 'input_norm_kind', 'str',
     """The layer's decorations as the family's HF modules define them (``layer_config`` reads them; a family
     states only what differs, citing its HF module): the input norm's kind (impl NormSpec: "rms" LlamaRMSNorm,
     "rms1p" gemma's (1 + w), "layer" LayerNorm), a norm on the branch before the residual (None: none), the QK
     norm (its eps is the layer's), the RoPE layout, and whether the RoPE parameters are keyed per layer type
     (``rope_parameters[layer_types[i]]``).""")
data('llama_like', 'post_norm_kind', 'str | None',
     """A norm on the attention branch before the residual add (impl NormSpec kind; None: none).""")
data('llama_like', 'qk_norm', 'QkNormSpec | None',
     """The QK norm (impl QkNormSpec; None: none); its eps is the layer's.""")
data('llama_like', 'rope_layout', 'str',
     """The RoPE layout: ``neox`` (rotate halves) or ``interleaved`` (rotate pairs).""")
data('llama_like', 'rope_per_layer_type', 'bool',
     """Whether the RoPE parameters are keyed per layer type (``rope_parameters[layer_types[i]]``).""")

@hook('llama_like')
def head_dim(self, config) -> int:
    """The head size: ``config.head_dim`` where set, else hidden // heads (HF *Attention.__init__)."""

@hook('llama_like')
def layer_widths(self, config, i: int) -> tuple[int, int]:
    """Layer ``i``'s ``(head_dim, n_kv_heads)``: ``head_dim`` and ``config.num_key_value_heads`` for every layer
    (default); a config whose layers differ (gemma4's global layers, ``config.per_layer_config[i]``) answers
    per layer."""

@hook('llama_like')
def norm_eps(self, config) -> float:
    """The eps of the layer's norms (input, QK, post)."""

@hook('llama_like')
def window(self, config, i: int) -> WindowSpec | None:
    """Layer ``i``'s attention window (impl WindowSpec; None: full causal)."""

@hook('llama_like')
def uses_rope(self, config, i: int) -> bool:
    """Whether layer ``i`` rotates Q and K (False: a NoPE layer)."""

@hook('llama_like')
def rope(self, config, i: int, head_dim: int):
    """Layer ``i``'s RoPE (impl RopeSpec; None: a NoPE layer)."""
data('llama_like', 'weight_map', 'dict',
     """HF name (relative to the decoder layer) -> impl weight name""")


# ---------------------------------------------------------------------- mla

data('mla', 'hf_rope_deinterleaves', 'bool',
     """HF returns the rope slice de-interleaved (apply_rotary_pos_emb_interleave)""")
data('mla', 'latent_norm_eps', 'float',
     """HF builds q_a_layernorm / kv_a_layernorm with the RMSNorm's default eps (e.g. modeling_deepseek_v2.py:
     `DeepseekV2RMSNorm(config.kv_lora_rank)`), whatever rms_norm_eps says; llama.cpp uses rms_norm_eps for both
     (deepseek2.cpp build_norm -> f_norm_rms_eps). impl mirrors HF.""")
data('mla', 'lc_naive_unsupported', 'str | None',
     """why llama.cpp cannot run the naive (combined kv_b) form of this arch, if it cannot""")
data('mla', 'direct_q_rank_key', 'bool',
     """deepseek2, direct Q: write `attention.q_lora_rank = 0`, which the converter omits (a test switches it off
     to show llama.cpp then refuses the file)""")
data('mla', 'hf_mla_points', 'dict',
     """The MLA layer's HF probe map (``Point`` per probe): the latents after their norms, the query, the
     heads.""")

@hook('mla')
def is_mla(self, config, i: int) -> bool:
    """Whether layer ``i`` is an MLA layer (False: a dense or recurrent layer of a hybrid)."""

@hook('mla')
def mla_rope_layout(self, config) -> str:
    """The MLA layer's RoPE layout (``interleaved``: HF's DeepSeek apply_rotary_pos_emb_interleave; a family whose
    checkpoint is de-interleaved says ``neox``)."""

@hook('mla')
def mla_rope(self, config):
    """impl RoPE of the decoupled slices from ``config.rope_parameters``, at their plain bands: HF's rotary
    embedding runs at ``dim = head_dim``, which the configs force to ``qk_rope_head_dim``
    (configuration_deepseek_v2.py ``__post_init__``). YaRN is not here but in ``mla_yarn``."""

@hook('mla')
def mla_yarn(self, config, rope) -> MlaYarn | None:
    """The ONE YaRN setting of the layer (spec ``yarn`` argument): YaRN's per-band divisors and its magnitude on
    the rotated channels (HF ``_compute_yarn_parameters``: ``inv_freq`` and ``attention_factor``, the magnitude on
    cos and sin), and the softmax half ``softmax_mscale``."""

@hook('mla')
def softmax_mscale(self, config) -> float:
    """HF ``yarn_apply_mscale``: ``scaling *= yarn_get_mscale(factor, mscale_all_dim) ** 2`` when the RoPE type is
    not default and ``mscale_all_dim`` is set and non-zero (``mscale`` alone never enters the softmax scale)."""
data('mla', 'mla_weight_map', 'dict',
     """HF name (relative to the decoder layer) -> impl weight name""")

@hook('mla')
def mla_sizes(self, meta, hp) -> dict:
    """The MLA head sizes as llama.cpp derives them (llama_hparams::is_mla: both ``_mla`` lengths present):
    absorbed -- key_length ``r + rope``, value_length ``r``, one KV head, the head sizes in the ``_mla`` keys;
    legacy -- key_length ``nope + rope``, value_length ``v``, a KV head per head. HF expands K/V to every head
    either way."""

@hook('mla')
def mla_rope_parameters(self, meta, hp, log_mul: float=0.0) -> dict:
    """HF YaRN parameters for what deepseek2.cpp / glm-dsa.cpp compute: the rotated channels' magnitude ``a``
    (llama-context.cpp: ``get_mscale(f)``, or ``get_mscale(f, m) / get_mscale(f, log_mul)`` with ``m = log_mul``
    for deepseek2 when it is not 1, times ``rope.scaling.attn_factor``) and the softmax scale ``(a * (1 + 0.1
    log_mul ln f))^2 / sqrt(d)`` (the graphs' ``kq_scale``), which HF takes as ``get_mscale(f,
    mscale_all_dim)^2``."""

@hook('mla')
def mla_router(self, meta, hp) -> dict:
    """The HF router keys from the file's gating keys (a family per router)."""

@hook('mla', static=True)
def deepseek2_gating(meta, hp) -> int:
    """The gating function deepseek2.cpp ``load_arch_hparams`` routes a file by: its ``expert_gating_func``, or --
    absent ("for compatibility with existing DeepSeek V2 and V2.5 GGUFs") -- sigmoid (2) for "GLM 4.7 Lite", which
    it recognises by 47 or 48 layers and a 154880-token vocabulary, softmax (1) otherwise."""

@hook('mla')
def mla_common(self, meta, shapes, hp) -> dict:
    """What deepseek2.cpp and glm-dsa.cpp read alike: the sizes, the RMS eps, the leading dense layers, the
    experts (width, shared count), the tied head, the vocabulary."""

@hook('mla')
def check_lc_variant(self, variant: str | None) -> None:
    """Refuse the naive MLA form where llama.cpp cannot run it (``lc_naive_unsupported``)."""

@hook('mla', static=True)
def put(w, key: str, value, adder) -> None:
    """Write a key the converter writes twice (base TextModel first, then the arch's own value): drop the first,
    as GGUFWriter's "Duplicated key name ... overwriting" does, without the warning."""

@hook('mla')
def text_params(self, w, config) -> None:
    """conversion/base.py ``TextModel.set_gguf_parameters`` for these configs, after
    ``DeepseekV2Model.set_gguf_parameters`` has set ``hparams["num_key_value_heads"] = 1`` ("deepseek2 using MLA
    converts into MQA"); the naive variant's legacy file keeps the real head count."""

@hook('mla')
def deepseek_params(self, w, config, variant: str) -> None:
    """conversion/deepseek.py ``DeepseekV2Model.set_gguf_parameters`` on top of ``TextModel``'s, key for key, for
    the two forms: ``absorbed`` = what the converter writes today (head_count_kv 1, key_length ``r + rope``,
    value_length ``r``, the ``_mla`` lengths); ``naive`` = the legacy file llama.cpp still loads on its
    ``!is_mla()`` path (deepseek2.cpp ``llama_model_deepseek2::load_arch_tensors``: ``attn_kv_b`` when the
    ``_mla`` keys are absent), with the head metadata of an MHA (head_count_kv = H, key_length ``nope + rope``,
    value_length ``v``)."""


# ---------------------------------------------------------------------- recurrent

data('recurrent', 'hf_rec_module', 'str',
     """the recurrent module's path in the decoder layer, and the HF module that is its gated norm (its second
     argument is z) -- None where the family reads z otherwise""")
data('recurrent', 'hf_rec_gate_norm', 'str | None',
     """The HF submodule of the recurrent layer's gated output norm (None: none).""")
data('recurrent', 'lc_recurrent_points', 'dict',
     """llama.cpp: recurrent probe -> LcPoint (src/models/<arch>.cpp cb() names); the state probes come from
     llama_state_seq_get_data (lc_states)""")

@hook('recurrent')
def is_recurrent(self, config, i: int) -> bool:
    """Whether layer ``i`` is a recurrent layer (False: an attention layer of the hybrid)."""

@hook('recurrent')
def recurrent_taps(self, model, config, sink):
    """A context manager recording the functional conv / scan / l2norm calls of the recurrent layers into
    ``sink[layer][probe]`` (canonical arrays)."""

@hook('recurrent')
def hf_cache_states(self, cache, config, i: int, lc) -> dict:
    """Layer ``i``'s state in HF's cache after a call, canonical (``[S, ...]``)."""

@hook('recurrent')
def lc_v_head_order(self, config) -> str:
    """How llama.cpp's graph orders the value heads: ``grouped`` (HF's) or ``tiled``."""

@hook('recurrent')
def lc_recurrent_canonical(self, probe: str, arr: np.ndarray, lc: RecurrentConfig, config) -> np.ndarray | None:
    """llama.cpp's ``[S, T, ...]`` array of a recurrent probe in the canonical layout."""

@hook('recurrent')
def lc_state_canonical(self, r_row: np.ndarray, s_row: np.ndarray, lc: RecurrentConfig, config) -> dict:
    """One sequence's state rows of one layer (llama-memory-recurrent.cpp ``state_write_data``: the ``r_l`` row,
    the ``s_l`` row, float32) in the canonical layout: ``state_conv [C, K-1]`` (ggml's conv state is ``[K-1, C]``
    with the rows fastest: channel-major, as HF's), ``state_rec [Hv, Dk, Dv]`` (ggml: ``[Dv][Dk]`` per head, HF's
    transposed)."""


# ---------------------------------------------------------------------- mamba2

data('mamba2', 'mamba2_module', 'str',
     """Where the Mamba-2 mixer sits under the decoder layer.""")

@hook('mamba2')
def mamba2_sizes(self, config) -> Mamba2Sizes:
    """The mixer's sizes as the family's HF config names them (``Mamba2Sizes``)."""

@hook('mamba2')
def mamba2_config(self, config, input_norm) -> RecurrentConfig:
    """The mixer as impl's ``mamba2`` kind, with the layer's ``input_norm``."""

@hook('mamba2')
def mamba2_weights(self, layer, config) -> dict:
    """impl's weights of the mixer, ``in_proj`` split z | xBC | dt as HF splits it."""

@hook('mamba2')
def mamba2_validate(self, ints: dict, heads: str, groups: str) -> None:
    """Refuse SSD shapes HF cannot compute (``ints``: the sizes; ``heads``, ``groups``: their keys)."""

@hook('mamba2')
def mamba2_refusal(self, config, key: str='conv_kernel') -> str | None:
    """Why llama.cpp's Mamba-2 cannot hold the config's short conv (``key``: the config's name for the
    kernel), for ``lc_refusal`` (None: it can)."""

@hook('mamba2')
def mamba2_convert(self, name: str, data, config):
    """The converter's transform of Mamba-2 tensor ``name`` (conversion/mamba.py ``Mamba2Model.modify_tensors``)."""
