"""Generated conformance cases: hypothesis strategies over each family's config
space, run three-way (impl, HF, llama.cpp), shrunk to the smallest config that
still fails.

Two kinds of example, each labelled in every report line:

- ``three-way``: a ``harness.case.Case`` of a registered family -- head counts
  and GQA ratios, head widths, RoPE scaling kinds and their parameters,
  partial rotary, windows and their sizes relative to the sequence, softcap,
  biases, MLA ranks and YaRN, the KV backing and its schedule, sequence count
  and length, eviction. Only what the family's references can express is
  drawn: every config goes through the family's own HF config validation
  (``Family.make_config``, which also builds impl's layers) and a draw it
  refuses is discarded, and each knob is offered only to the families whose
  llama.cpp graph reads the GGUF key it becomes (each family's ``fuzz_space`` says which, citing
  the converter / graph); a setting only HF can express (``hf_only``) runs
  against HF alone.
- ``spec``: one layer outside what any reference family can say (both gates on
  one layer, a sub-norm after a gate, a linear or absent layer, ALiBi with a
  window, the MLA gate, ...), impl (float64) against the spec's own formulas
  (``harness.specref``), independent of impl.

``conformance fuzz`` (``harness.commands.fuzz``) drives ``hunt``.
"""

from __future__ import annotations

import functools
import itertools
import json
import time
from dataclasses import dataclass, field, replace, asdict

import numpy as np

from . import kinds, references
from .case import Case
from harness.lazy import lazy
from . import families
from .features import layer_features
from . import interrupt
from impl import Backend
from impl.runner import load_layer, run_layer
from . import budget
from .case import CaseRun
from .errors import UsageError
from .bisect import first_divergence
from impl import LayerConfig, MlaConfig, MlaYarn, NormSpec, QkNormSpec, RopeSpec, TemperatureSpec, WindowSpec
from .features import SPEC_DECORATIONS

st = lazy("hypothesis.strategies")
hypothesis = lazy("hypothesis")
hypothesis_database = lazy("hypothesis.database")
hypothesis_errors = lazy("hypothesis.errors")


def _module_reference() -> str:
    """The reference that runs the model's own modules (HF): the one a setting
    only it can express is judged against."""
    return next(r.name for r in references.registry().values() if r.sees_modules)

# ---------------------------------------------------------------- the three-way space
# Per family: the knobs the fuzzer may turn, each a name the drawing code below
# knows. A family not listed gets the generic LlamaLike knobs its settable keys
# allow. Knobs a reference cannot express are not offered (or are hf_only).
#   heads:      num_attention_heads / num_key_value_heads (any divisor: GQA, MQA, MHA)
#   head_dim:   an explicit head_dim (families whose HF attention reads it)
#   bias:       attention_bias (llama.cpp: bq/bk/bv/bo tensors where the arch creates them)
#   rope:       RoPE scaling kinds the converter writes for the arch (TextModel:
#               linear / yarn keys; llama: llama3 through rope_freqs)
#   theta:      rope_theta
#   window:     sliding_window size relative to the sequence
#   softcap:    attn_logit_softcapping (gemma2.cpp reads attn_logit_softcapping)
#   partial:    partial_rotary_factor (the arch's rope dimension count)
#   mla:        MLA ranks and widths (deepseek2.cpp reads q_lora_rank, kv_lora_rank,
#               key/value lengths _mla), YaRN on/off
#   values:     the family's own keys, each from its own choices (``fuzz_space["values"]``:
#               key -> choices; a tuple of keys -> tuples of values drawn together, for keys
#               only some combinations of which a reference can express); the first choice
#               is the one a failure shrinks to
# Each family's space lives with it (``Family.fuzz_space`` in its folder); a family
# without one gets the generic knob its heads allow.
DEFAULT_SPACE = {"knobs": ("heads",)}
# the config keys that hold the norms' epsilon, drawn for every family that declares one
# (case_strategy, after the family's own knobs, so a seed keeps its earlier draws)
NORM_EPS_KEYS = ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps", "norm_epsilon")
# the config keys that hold the layer count (HF's num_hidden_layers; GPT-2's and MPT's
# own names), drawn for every family after the norm epsilon (issue 39: the key no case
# varied in 77 families)
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
# the config keys that hold the model's context length (HF's max_position_embeddings; GPT-2's
# n_positions, MPT's max_seq_len), drawn after the layer count (open in 66 families)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length")
CONTEXT_LENGTH = 4096  # a length small released checkpoints carry (Llama 2, Phi-3-mini-4k)
# the RoPE base drawn for a family whose own knobs leave it (open in 29 families): Qwen 2.5's,
# Llama 3's 500000 is the theta knob's; four converters write no base at all (gemma, gemma2,
# stablelm, minicpm3: findings, llama.cpp's default 10000)
ROPE_THETA = 1000000.0


@functools.lru_cache(maxsize=None)
def _flat_rope_theta(name: str) -> bool:
    """Whether family ``name``'s tiny config has one RoPE table with a base
    (``rope_parameters.rope_theta``; not a table per layer type, as gemma3's)."""

    rp = getattr(families.get(name).make_config({}), "rope_parameters", None)
    return isinstance(rp, dict) and "rope_theta" in rp


def layer_count_key(fam) -> str | None:
    """The config key that holds ``fam``'s layer count, or None."""
    keys = set(fam.settable_keys())
    return next((k for k in LAYER_COUNT_KEYS if k in keys and isinstance(fam.tiny.get(k), int)), None)


def layer_count_overrides(fam, n: int) -> dict:
    """The overrides that give ``fam``'s tiny config ``n`` layers: the count, and every
    per-layer list the tiny config spells out (``layer_types``, ``mlp_layer_types``, ...:
    a list as long as its layer count, named for layers) repeated or cut to ``n`` -- its
    pattern kept as a period -- so the config stays one the config class accepts. A list
    the config class derives from the count (``layer_types`` from
    ``sliding_window_pattern``) is left to it, and so is one of another meaning that is as
    long by chance (falcon_h1's two ``mlp_multipliers`` at 2 layers)."""
    key = layer_count_key(fam)
    if key is None:
        return {}
    was = fam.tiny[key]
    ov: dict = {key: n}
    for k, v in fam.tiny.items():
        if k != key and "layer" in k and isinstance(v, (list, tuple)) and len(v) == was and was > 0:
            ov[k] = [v[i % was] for i in range(n)]
    return ov


def space_of(fam) -> dict:
    return getattr(fam, "fuzz_space", None) or DEFAULT_SPACE


@dataclass(frozen=True)
class SpecExample:
    """One layer outside the references, judged against the spec's formulas."""
    cfg: object  # impl LayerConfig or MlaConfig
    weight_seed: int
    opts: tuple  # weight options ((name, True), ...)
    kv: str
    lengths: tuple
    chunks: tuple  # one tuple of chunk sizes per sequence
    page_size: int = 4
    evict: bool = False
    backend: str = "numpy"

    def label(self) -> str:
        return f"spec/{_cfg_label(self.cfg)}/{self.kv}/seqs{len(self.lengths)}x{max(self.lengths)}"


def _cfg_label(cfg) -> str:
    return "+".join(sorted(layer_features(cfg, {}))) or "plain"


# ---------------------------------------------------------------- drawing
def strategies():
    """Import hypothesis lazily: the rest of the harness runs without it."""
    return st


def case_strategy(family_names: list[str], ref: str = "all"):
    """A hypothesis strategy of three-way ``Case``s over ``family_names``."""
    st = strategies()

    @st.composite
    def draw_case(draw):
        name = draw(st.sampled_from(family_names))
        fam = families.get(name)
        space = space_of(fam)
        tokens = draw(st.integers(1, 20))
        ov: dict = {}
        hf_only = False
        keys = set(fam.settable_keys())
        for knob in space["knobs"]:
            before = dict(ov)
            _draw_knob(draw, st, knob, fam, space, tokens, ov, keys)
            # a setting llama.cpp's graph cannot read for this arch: run against HF alone
            if knob in space.get("hf_only", ()) and any(v not in (None, False) for k, v in ov.items()
                                                         if before.get(k, object()) != v):
                hf_only = True
        kv = draw(st.sampled_from(("decode", "batched", "paged")))
        seqs = 1 if kv == "decode" else draw(st.integers(1, 3))
        # a family may keep to the named schedules (``fuzz_space["schedules"]``): where a
        # chunked schedule cannot run at all (a reference's crash the family predicts is not
        # this: ``Reference.schedule_refusal`` leaves that reference out of the case instead)
        named = space.get("schedules")
        schedule = draw(st.sampled_from(tuple(named)) if named else _schedule(st, tokens))
        variant = draw(st.sampled_from(fam.variants)) if fam.variants else None
        evict = kv != "paged" and draw(st.booleans())
        page_size = draw(st.integers(1, 6)) if kv == "paged" else 4
        seed = draw(st.integers(0, 3))
        backend = draw(st.sampled_from(("numpy", "torch")))
        # drawn last, so the draws before it (and the cases a seed reproduced before) stay as they were
        ragged = kv != "decode" and seqs >= 2 and draw(st.booleans())
        # after the rest too: the norm epsilon, which every reference reads for the norms in
        # front of and inside the attention half (HF config.rms_norm_eps / layer_norm_eps ...;
        # llama.cpp f_norm_rms_eps / f_norm_eps from LLM_KV_ATTENTION_LAYERNORM(_RMS)_EPS,
        # src/llama-model.cpp), at the values released checkpoints carry. impl reads it and
        # the oracle sees it (1e-6 for 1e-5 is NMSE ~2e-11 at a normed row of mean square 1,
        # 200x float32's floor); between the references a converter's or a module's own
        # fixed eps shows only past float32's bound -- scripts/key_sweep.py at 0.01 lists them
        # (docs/measurements/2026-12-07-norm-eps.md)
        eps_keys = [k for k in NORM_EPS_KEYS if k in keys]
        if eps_keys:
            eps = draw(st.sampled_from((None, 1e-6, 1e-5)))
            if eps is not None:
                ov.update((k, eps) for k in eps_keys)
        # after the epsilon: the layer count -- the tiny config's or one more, the per-layer
        # lists the tiny config spells out cycled to it (layer_count_overrides), so the
        # pattern's last period is cut where a real model's need not be. Not fewer: the
        # tiny configs hold one layer of each kind the family has, and a model left without
        # one (a hybrid with no attention layer, an iSWA model with no sliding or no global
        # layer) is no released checkpoint -- llama.cpp asserts on it (llama-model.cpp:2807
        # is_swa_any; ggml-backend.cpp:205 the hybrid memory's empty KV buffer), measured
        # with scripts/key_sweep.py --layers 1 (docs/measurements/2026-12-07-layer-count.md)
        lkey = layer_count_key(fam)
        if lkey is not None and lkey not in ov:
            n = draw(st.sampled_from((None, fam.tiny[lkey] + 1)))
            more = layer_count_overrides(fam, n) if n is not None else {}
            if not set(more) & set(ov):  # a per-layer list the family's own knob drew stays as drawn
                ov.update(more)
        # after the layer count: the context length, where a family reads it for more than a
        # bound on the positions (LongRoPE's attention factor over its original length, the
        # converter's context_length); the tiny configs' are 64-512. A family whose own knob
        # sets it (with what must follow it: glm_moe_dsa's index_topk) keeps its draw
        ckeys = [k for k in CONTEXT_KEYS if k in keys]
        if ckeys and not any(k in ov for k in CONTEXT_KEYS):
            if draw(st.booleans()):
                ov[ckeys[0]] = CONTEXT_LENGTH
        # after the context length: the RoPE base, where the family's own knobs leave it
        if "rope_parameters.rope_theta" not in ov and "theta" not in space["knobs"] and _flat_rope_theta(name):
            if draw(st.booleans()):
                ov["rope_parameters.rope_theta"] = ROPE_THETA
        # a setting only the reference that runs the model's own modules can express
        # (HF) is judged against it alone
        r = _module_reference() if hf_only else ref
        if variant == "naive" and getattr(fam, "lc_naive_unsupported", None):
            r = _module_reference()  # llama.cpp has no graph for this form of the arch (the family says why)
        return Case(family=name, ref=r, backend=backend, kv=kv, schedule=schedule, seed=seed, tokens=tokens,
                    seqs=None if kv == "decode" else seqs, overrides=tuple(sorted(ov.items())), variant=variant,
                    page_size=page_size, evict=evict, ragged=ragged)

    return draw_case()


def _schedule(st, tokens: int):
    named = st.sampled_from(("prefill", "decode", "mixed"))
    if tokens < 2:
        return named

    @st.composite
    def chunks(draw):
        cuts = sorted(draw(st.sets(st.integers(1, tokens - 1), min_size=1, max_size=4)))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [tokens])]
        return ",".join(map(str, sizes))

    return st.one_of(named, chunks())


def _divisor(draw, st, n: int) -> int:
    return draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))


def _draw_knob(draw, st, knob, fam, space, tokens, ov, keys) -> None:
    t = fam.tiny
    if knob == "heads":
        h = draw(st.sampled_from((1, 2, 4, 8)))
        if "head_dim" not in t and "head_dim" not in space["knobs"]:
            h = min(h, 4)  # hidden 64 / heads: the head width stays >= 16 (and even)
        ov["num_attention_heads"] = h
        if "num_key_value_heads" in keys:
            ov["num_key_value_heads"] = _divisor(draw, st, h)
    elif knob == "heads_hidden":  # bloom: n_head divides hidden_size; head width even
        ov["n_head"] = draw(st.sampled_from((1, 2, 4, 8)))
    elif knob == "head_dim" and "head_dim" in keys:
        ov["head_dim"] = draw(st.sampled_from((8, 16, 32)))
    elif knob == "bias" and "attention_bias" in keys:
        ov["attention_bias"] = draw(st.booleans())
    elif knob == "theta":
        ov["rope_parameters.rope_theta"] = draw(st.sampled_from((100.0, 10000.0, 500000.0)))
    elif knob == "rope":
        kind = draw(st.sampled_from(space.get("rope", ("default",))))
        ov["rope_parameters.rope_type"] = kind
        if kind != "default":
            ov["rope_parameters.factor"] = draw(st.sampled_from((2.0, 4.0, 8.0)))
        if kind in ("yarn", "llama3"):
            ov["rope_parameters.original_max_position_embeddings"] = draw(st.sampled_from((8, 32, 64)))
        if kind == "llama3":
            ov["rope_parameters.low_freq_factor"] = 1.0
            ov["rope_parameters.high_freq_factor"] = draw(st.sampled_from((2.0, 4.0)))
    elif knob == "yarn_params":
        ov["rope_parameters.factor"] = draw(st.sampled_from((2.0, 8.0, 32.0)))
        ov["rope_parameters.beta_fast"] = draw(st.sampled_from((8.0, 32.0)))
    elif knob == "window":
        # shorter than, equal to, longer than the sequence; from 2: at sliding_window = 1 HF's cached
        # path keeps every key (cache_utils.py DynamicSlidingWindowLayer.update slices [-0:]) or
        # crashes on the mask's shape -- a written finding (fixtures/tolerance.toml), not news
        size = draw(st.integers(2, tokens + 2))
        if "use_sliding_window" in keys:  # qwen2, qwen3 (from max_window_layers), qwen3_moe (every layer)
            ov.update(use_sliding_window=True, sliding_window=size)
            if "max_window_layers" in keys:
                ov["max_window_layers"] = draw(st.integers(0, 2))
        elif "sliding_window" in keys:
            ov["sliding_window"] = size
    elif knob == "kimi_heads":
        h = draw(st.sampled_from((4, 1, 2)))  # 4: the KDA layers' own (the tiny config's)
        if h != 4:
            ov.update(num_attention_heads=h, num_key_value_heads=h)
    elif knob == "nope_interval":
        if draw(st.booleans()):  # off: the family's own pattern (every 4th layer NoPE)
            ov["no_rope_layer_interval"] = draw(st.sampled_from((1, 2, 3)))
    elif knob == "chunk":
        ov["attention_chunk_size"] = draw(st.integers(1, tokens + 2))
    elif knob == "softcap":
        # never None: conversion/gemma.py Gemma2Model writes add_attn_logit_softcapping(hparams[...]),
        # which a None refuses, so no GGUF of a softcap-free gemma2 exists
        ov["attn_logit_softcapping"] = draw(st.sampled_from((1.0, 5.0, 50.0)))
    elif knob == "partial":
        ov["rope_parameters.partial_rotary_factor"] = draw(st.sampled_from((0.25, 0.5, 1.0)))
    elif knob in ("mla", "mla_nope"):
        if knob == "mla":
            h = draw(st.sampled_from((1, 2, 4)))
            ov.update(num_attention_heads=h, num_key_value_heads=h)
        ov.update(kv_lora_rank=draw(st.sampled_from((8, 16, 32))),
                  qk_nope_head_dim=draw(st.sampled_from((4, 8, 16))),
                  v_head_dim=draw(st.sampled_from((4, 8, 12))))
        if knob == "mla":
            ov["qk_rope_head_dim"] = draw(st.sampled_from((4, 8)))
            if "q_lora_rank" in keys:
                ov["q_lora_rank"] = draw(st.sampled_from((None, 8, 24)))
    elif knob == "values":
        for key, choices in space["values"].items():
            pick = draw(st.sampled_from(tuple(choices)))
            ov.update(zip(key, pick) if isinstance(key, tuple) else ((key, pick),))
    elif knob == "mla_yarn":
        if draw(st.booleans()):
            ov["rope_parameters.rope_type"] = "default"  # the YaRN keys stay; a default RoPE reads none
        else:
            # mscale == mscale_all_dim: llama.cpp's deepseek2 reads one YaRN multiplier
            # (yarn_log_multiplier = 0.1 * mscale_all_dim) and assumes a rope magnitude of
            # 1 (llama-context.cpp); a file cannot say mscale != mscale_all_dim (the
            # policy's deepseek_v2 finding measures what HF then does differently)
            m = draw(st.sampled_from((0.707, 1.0)))
            if (t.get("rope_parameters") or {}).get("rope_type") != "yarn":
                # a family whose tiny config rotates plainly (youtu: YoutuConfig's default): the
                # YaRN keys alone would change nothing -- turn it on, over a window below the
                # max length
                ov["rope_parameters.rope_type"] = "yarn"
                ov["rope_parameters.original_max_position_embeddings"] = 128
            ov["rope_parameters.factor"] = draw(st.sampled_from((2.0, 4.0, 16.0)))
            ov["rope_parameters.mscale_all_dim"] = m
            ov["rope_parameters.mscale"] = m


# ---------------------------------------------------------------- the spec space
def spec_strategy():
    """A hypothesis strategy of ``SpecExample``s: every decoration of the spec,
    in any combination the spec's types allow."""
    st = strategies()

    @st.composite
    def draw_example(draw):
        n = draw(st.integers(1, 12))
        hid = draw(st.sampled_from((8, 16, 24)))
        opts: dict = {}
        # a layer kind draws its own description and the weights it needs
        # (harness/kinds/<kind>/fuzz.py); MLA one time in ten
        kind = kinds.registry()["mla" if draw(st.integers(0, 9)) == 9 else "attention"]
        cfg = draw(kind.spec_strategy(st, n, hid, opts))
        kv = draw(st.sampled_from(("decode", "batched", "paged")))
        n_seq = 1 if kv == "decode" else draw(st.integers(1, 3))
        lengths = tuple(draw(st.integers(max(1, n - 3), n)) for _ in range(n_seq))
        chunks = tuple(tuple(_split(draw, st, t)) for t in lengths)
        return SpecExample(cfg=cfg, weight_seed=draw(st.integers(0, 2**16)), opts=tuple(sorted(opts.items())), kv=kv,
                           lengths=lengths, chunks=chunks, page_size=draw(st.integers(1, 5)),
                           evict=kv != "paged" and draw(st.booleans()),
                           backend=draw(st.sampled_from(("numpy", "torch"))))

    return draw_example()


def _split(draw, st, t: int) -> list[int]:
    if t < 2:
        return [t]
    cuts = sorted(draw(st.sets(st.integers(1, t - 1), max_size=t - 1)))
    return [b - a for a, b in zip([0] + cuts, cuts + [t])]


def spec_weights(ex: SpecExample) -> dict:
    """Seeded float64 weights for the example's layer, every optional one the
    options switch on (the tensor decides, as in the spec): its kind's own
    (``LayerKind.spec_weights``)."""
    rng = np.random.default_rng(ex.weight_seed)
    return kinds.of(ex.cfg).spec_weights(ex.cfg, dict(ex.opts), rng)


# ---------------------------------------------------------------- judging
SPEC_RTOL = 1e-9  # float64 impl against float64 formulas: rounding is ~1e-15 relative


@dataclass
class Outcome:
    kind: str  # "three-way" or "spec"
    label: str
    failed: bool
    why: str = ""
    features: tuple = ()
    rows: list = field(default_factory=list)
    seconds: float = 0.0
    # what kind of failure (family, comparison, probe, status): hypothesis shrinks a
    # failure only into examples with the same signature, so two bugs stay two
    signature: str = ""


def run_spec(ex: SpecExample) -> Outcome:
    """impl (float64) against ``harness.specref`` on every probe both name."""
    interrupt.check()

    t0 = time.perf_counter()
    w = spec_weights(ex)
    rng = np.random.default_rng(ex.weight_seed + 1)
    xs = [rng.standard_normal((t, ex.cfg.hidden_size)) for t in ex.lengths]
    feats = set(layer_features(ex.cfg, w)) | {f"kv_{ex.kv}"} | ({"kv_evict"} if ex.evict else set())
    label = ex.label()
    try:
        layer = load_layer(ex.cfg, w, Backend(ex.backend, "cpu", "float64"))
        _, traces, _ = run_layer(layer, xs, ex.kv, [list(c) for c in ex.chunks], page_size=ex.page_size,
                                 evict=ex.evict)
    except Exception as e:
        return Outcome("spec", label, True, f"impl raised {type(e).__name__}: {e}", tuple(sorted(feats)),
                       seconds=time.perf_counter() - t0, signature=f"raised {type(e).__name__}")
    for s, x in enumerate(xs):
        got, want = traces[s].assemble(), kinds.spec_layer(ex.cfg, w, x)
        for probe in want:
            if probe not in got:
                continue
            a, b = np.asarray(got[probe]), np.asarray(want[probe])
            if a.shape != b.shape:
                return Outcome("spec", label, True, f"seq {s} {probe}: shape {a.shape} vs the spec's {b.shape}",
                               tuple(sorted(feats)), seconds=time.perf_counter() - t0, signature=f"shape {probe}")
            err = float(np.abs(a - b).max(initial=0.0))
            scale = max(1.0, float(np.abs(b).max(initial=0.0)))
            if not err <= SPEC_RTOL * scale:
                return Outcome("spec", label, True, f"seq {s} {probe}: max|impl - spec| = {err:.3g} "
                               f"(> {SPEC_RTOL:g} x {scale:.3g})", tuple(sorted(feats)),
                               seconds=time.perf_counter() - t0, signature=f"differs {probe}")
    return Outcome("spec", label, False, "", tuple(sorted(feats)), seconds=time.perf_counter() - t0)


def run_three_way(case: Case, policy) -> Outcome:
    """One generated case end to end; failed when any comparison fails or errors
    (a known, bounded finding of the policy is not a failure)."""

    interrupt.check()  # a Ctrl-C swallowed in the last example's finalisers ends the run here

    t0 = time.perf_counter()
    try:
        case.validate()
        run = CaseRun(case, policy)
        _ = run.layer_cfgs
        # what the CLI refuses before any work (harness/budget.py check): a setting a
        # reference's source crashes on (Reference.config_refusal: HF's mistral4 at plain
        # RoPE), a length past the model's positions -- not a case the references express
        budget.check(run)
        rows = run.rows()
        feats = tuple(run.features)
    except UsageError as e:
        # the family refused the draw (HF config validation, the family's own shape
        # rules): not a case the references can express
        return Outcome("three-way", case.case_id(), False, f"refused: {e}", seconds=time.perf_counter() - t0,
                       rows=[{"refused": True}])
    except Exception as e:
        return Outcome("three-way", case.case_id(), True, f"crashed: {type(e).__name__}: {e}",
                       seconds=time.perf_counter() - t0, signature=f"{case.family} crashed {type(e).__name__}")
    bad = [r for r in rows if r["status"] in ("fail", "error")]
    why, d, who = "", None, "impl"
    if bad:
        d, who = first_divergence(rows), "impl"
        for other in references.names()[1:]:  # a reference judged against the first
            if d is None:
                d, who = first_divergence(rows, candidate=other), other
        r = bad[0] if d is None else {**d, "candidate": who}
        why = (f"{len(bad)} failing rows; first: {r.get('candidate')} vs {r.get('reference')} L{r.get('layer')} "
               f"{r.get('probe')}: {r.get('status')} {str(r.get('reason', ''))[:200]}")
    compared = any(r["status"] in ("pass", "finding") for r in rows)
    if not bad and not compared:
        bad, why = rows, "nothing was compared"
    sig = ""
    if bad:
        r = bad[0] if d is None else {**d, "candidate": who}
        sig = f"{case.family} {r.get('candidate')}-{r.get('reference')} {r.get('probe')} {r.get('status')}"
    return Outcome("three-way", case.case_id(), bool(bad), why, feats, rows, time.perf_counter() - t0, sig)


def is_refused(o: Outcome) -> bool:
    return bool(o.rows) and o.rows[0].get("refused", False) is True


# ---------------------------------------------------------------- reproduce, record
def repro_command(case: Case) -> str:
    """The exact ``conformance run`` command of a case."""
    parts = ["conformance run", f"--family {case.family}", f"--ref {case.ref}", f"--backend {case.backend}",
             f"--dtype {case.dtype}", f"--kv {case.kv}", f"--schedule {case.schedule}", f"--seed {case.seed}",
             f"--tokens {case.tokens}"]
    if case.seqs is not None:
        parts.append(f"--seqs {case.seqs}")
    if case.kv == "paged":
        parts.append(f"--page-size {case.page_size}")
    if case.variant:
        parts.append(f"--variant {case.variant}")
    if case.evict:
        parts.append("--kv-evict")
    if case.ragged:
        parts.append("--ragged")
    for k, v in case.overrides:
        parts.append(f"--set {k}={json.dumps(v, separators=(',', ':')) if not isinstance(v, str) else v}")
    return " ".join(parts)


def spec_repro(ex: SpecExample) -> str:
    return "conformance fuzz --replay-spec '" + json.dumps(spec_to_dict(ex)) + "'"


def spec_to_dict(ex: SpecExample) -> dict:
    d = asdict(ex)
    d["cfg_type"] = type(ex.cfg).__name__
    return d


def spec_from_dict(d: dict) -> SpecExample:
    d = dict(d)
    c = dict(d.pop("cfg"))
    kind = d.pop("cfg_type", "LayerConfig")

    def norm(v):
        return None if v is None else NormSpec(**v)

    for k in ("input_norm", "sub_norm", "post_norm", "q_a_norm", "kv_a_norm"):
        if k in c:
            c[k] = norm(c[k])
    if c.get("rope") is not None:
        c["rope"] = RopeSpec(**{**c["rope"], "inv_freq": tuple(c["rope"]["inv_freq"])})
    if kind == "MlaConfig":
        if c.get("yarn") is not None:
            c["yarn"] = MlaYarn(**{**c["yarn"], "freq_factors": tuple(c["yarn"]["freq_factors"])})
        cfg = MlaConfig(**c)
    else:
        if c.get("qk_norm") is not None:
            c["qk_norm"] = QkNormSpec(**{**c["qk_norm"], "norm": NormSpec(**c["qk_norm"]["norm"])})
        if c.get("window") is not None:
            c["window"] = WindowSpec(**c["window"])
        if c.get("temperature") is not None:
            c["temperature"] = TemperatureSpec(**c["temperature"])
        cfg = LayerConfig(**c)
    return SpecExample(cfg=cfg, weight_seed=d["weight_seed"], opts=tuple(tuple(o) for o in d["opts"]), kv=d["kv"],
                       lengths=tuple(d["lengths"]), chunks=tuple(tuple(c) for c in d["chunks"]),
                       page_size=d["page_size"], evict=d["evict"], backend=d["backend"])


def regression_group(case: Case, why: str, n: int) -> str:
    """One ``[[group]]`` of a matrix spec that runs exactly this case."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        return '"null"' if v is None else json.dumps(v)  # TOML has no null (harness.matrix)

    ov = ", ".join(f"{json.dumps(k)} = {val(v)}" for k, v in case.overrides)
    lines = [f"# {why[:300]}", "# reproduce: " + repro_command(case), "[[group]]",
             f'name = "fuzz-{n}"', f'families = ["{case.family}"]',
             f'variants = ["{case.variant}"]' if case.variant else 'variants = "default"',
             f'references = ["{case.ref}"]', f'backends = ["{case.backend}"]', f'dtypes = ["{case.dtype}"]',
             f'kv_modes = ["{case.kv}"]', f'schedules = ["{case.schedule}"]', f"seeds = [{case.seed}]",
             f"tokens = [{case.tokens}]", f"page_sizes = [{case.page_size}]", f"kv_evict = [{val(case.evict)}]"]
    if case.seqs is not None:
        lines.append(f"seqs = [{case.seqs}]")
    if case.ragged:
        lines.append("ragged = [true]")
    lines.append(f"overrides = [{{ {ov} }}]" if ov else "overrides = [{}]")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- coverage
def feature_pairs(features) -> set[tuple[str, str]]:
    """Pairs of decorations exercised together (the KV backing counts as one)."""
    tags = sorted(t for t in set(features) if t in SPEC_DECORATIONS)
    return set(itertools.combinations(tags, 2))


def all_pairs() -> int:
    return len(SPEC_DECORATIONS) * (len(SPEC_DECORATIONS) - 1) // 2


# ---------------------------------------------------------------- the hunt
class FuzzFailure(AssertionError):
    """A generated example failed: hypothesis shrinks on it."""


_FAILURE_TYPES: dict[str, type] = {}


def _failure(signature: str) -> type:
    """One exception type per failure signature: hypothesis tells bugs apart by the
    exception's type and place, so a shrink never trades one bug for another."""
    if signature not in _FAILURE_TYPES:
        _FAILURE_TYPES[signature] = type(f"FuzzFailure[{signature}]", (FuzzFailure,), {})
    return _FAILURE_TYPES[signature]


class _Stop(BaseException):
    """The budget is spent. A BaseException, so hypothesis lets it through at once
    instead of shrinking on it as it would on a failure."""


@dataclass
class HuntStats:
    started: float = field(default_factory=time.monotonic)
    examples: int = 0
    by_kind: dict = field(default_factory=dict)
    seconds_by_kind: dict = field(default_factory=dict)
    refused: int = 0
    pairs: set = field(default_factory=set)
    pairs_by_kind: dict = field(default_factory=dict)
    by_family: dict = field(default_factory=dict)  # three-way examples per family
    failures: list = field(default_factory=list)  # (outcome, smallest failing example)
    shrink_runs: int = 0


def hunt(kind: str, strategy, check, budget_s: float, seed: int, stats: HuntStats, db_dir=None,
         shrink_s: float | None = None, log=print):
    """Draw examples from ``strategy`` and ``check`` each (-> Outcome) until
    ``budget_s`` ends; on a failure let hypothesis shrink it (at most
    ``shrink_s`` more seconds), record the smallest failing example and go on
    with the remaining budget under the next seed. A draw the family refuses
    (``is_refused``) is discarded (``assume``), never shrunk into."""

    deadline = time.monotonic() + budget_s
    shrink_s = max(30.0, budget_s / 2) if shrink_s is None else shrink_s
    round_ = 0
    while time.monotonic() < deadline:
        memo: dict = {}
        state = {"failing": None, "shrink_until": None}

        @hypothesis.settings(max_examples=10_000, deadline=None, database=None if db_dir is None else
                  hypothesis_database.DirectoryBasedExampleDatabase(str(db_dir / kind)), derandomize=False, report_multiple_bugs=False,
                  suppress_health_check=list(hypothesis.HealthCheck),
                  # the saved failures are replayed once, first; later rounds look for new ones
                  phases=((hypothesis.Phase.reuse,) if round_ == 0 else ()) + (hypothesis.Phase.generate, hypothesis.Phase.shrink),
                  print_blob=False)
        @hypothesis.seed(seed * 1000 + round_)
        @hypothesis.given(strategy)
        def prop(ex):
            key = repr(ex)
            if key in memo:
                out = memo[key]
            else:
                now = time.monotonic()
                if (state["shrink_until"] is None and now > deadline) or (
                        state["shrink_until"] is not None and now > state["shrink_until"]):
                    raise _Stop
                out = memo[key] = check(ex)
                if state["shrink_until"] is not None:
                    stats.shrink_runs += 1
                elif is_refused(out):
                    stats.refused += 1
                else:
                    stats.examples += 1
                    stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
                    stats.seconds_by_kind[kind] = stats.seconds_by_kind.get(kind, 0.0) + out.seconds
                    stats.pairs |= feature_pairs(out.features)
                    stats.pairs_by_kind.setdefault(kind, set()).update(feature_pairs(out.features))
                    if kind != "spec":
                        fam = out.label.split("/", 1)[0]
                        stats.by_family[fam] = stats.by_family.get(fam, 0) + 1
                    if kind != "spec" or out.failed or now - state.get("said", 0.0) > 30:
                        state["said"] = now  # quick examples (spec) are summarised, not listed
                        log(f"  [{kind}] #{stats.by_kind[kind]} {'FAIL' if out.failed else 'ok  '} {out.seconds:5.1f}s "
                            f"{out.label}" + (f" -- {out.why}" if out.failed else ""))
            hypothesis.assume(not is_refused(out))
            if out.failed:
                if state["shrink_until"] is None:
                    state["shrink_until"] = time.monotonic() + shrink_s
                    log(f"  [{kind}] shrinking (at most {shrink_s:.0f}s)...")
                state["failing"] = (ex, out)
                raise _failure(out.signature)(out.why)

        seen = {repr(ex) for _, ex in stats.failures}
        try:
            prop()
        except FuzzFailure:
            ex, out = state["failing"]
            if repr(ex) in seen:
                # a later round shrank to a failure already recorded (hypothesis starts every
                # round from the strategy's simplest example): this space has nothing new
                # before that failure is fixed; the rest of the budget goes elsewhere
                log(f"  [{kind}] shrank again to the failure recorded above; this hunt ends")
                break
            stats.failures.append((out, ex))
            log(f"  [{kind}] smallest failing example: {out.label} -- {out.why}")
        except _Stop:
            if state["failing"] is not None:  # shrinking cut short: the smallest failure found so far
                ex, out = state["failing"]
                stats.failures.append((replace(out, why=f"{out.why} (shrinking stopped at its time limit)"), ex))
                log(f"  [{kind}] smallest failing example so far: {out.label} -- {out.why}")
        except hypothesis_errors.Flaky as e:  # the failure did not reproduce: recorded as such, never dropped
            ex, out = state["failing"]
            stats.failures.append((replace(out, why=f"{out.why} (flaky on replay: {type(e).__name__})"), ex))
        except hypothesis_errors.Unsatisfiable:
            break
        round_ += 1
    return stats
