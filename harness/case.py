"""One conformance case, end to end (DESIGN.md "One case, as data flows").

1. the family builds a tiny HF model with seeded weights (or a local checkpoint
   / GGUF is loaded) -- the single source of weights for everyone;
2. each reference is captured (cached, content-addressed);
3. impl runs teacher-forced: every layer is fed THAT reference's own input to
   the layer, so each layer is judged on its own;
4. every probe impl produces is compared with the reference's; references are
   compared with each other.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path

import numpy as np

from impl import Backend
from impl.config import ConfigError
from impl.kv import KV_MODES
from impl.trace import LAYER_PROBES

from . import budget, cache, families, scaling, verdict
from .compare import absmax, all_finite, judge, judge_against_oracle, metrics
from .errors import UsageError, suggest
from .families.base import NotInImpl
from .features import model_features
from .policy import Policy, comparison_dtype, dataflow_position
from .refs.capture import RefCapture  # noqa: F401 (re-exported: harness.case.RefCapture)
from .refs.checkpoint import checkpoint_stamp as _checkpoint_stamp
from .refs.ggml_types import GGUF_TYPES, is_quantized  # f32 / f16 / bf16 exports, llama_model_quantize's types
from .select import Selection, parse_layers, parse_probes
from .schedule import SCHEDULES, chunk_sizes
from .versions import versions

REFERENCES = ("hf", "llamacpp")
REF_CHOICES = REFERENCES + ("all",)
STATUSES = verdict.STATUSES
CAPTURE_SCHEMA = 2  # bump when the meaning of a stored capture changes (2: a directory of .npy, harness/store.py)


@dataclass(frozen=True)
class Case:
    family: str
    ref: str = "hf"
    backend: str = "numpy"
    device: str = "cpu"
    dtype: str = "float32"
    kv: str = "decode"
    schedule: str = "mixed"
    seed: int = 0
    tokens: int = 16
    seqs: int | None = None  # default: 1 for decode, 2 for batched / paged
    overrides: tuple = ()  # ((key, value), ...)
    gguf_type: str = "f32"
    hf_model: str | None = None
    gguf: str | None = None
    page_size: int = 4
    variant: str | None = None  # a family's named variant (MLA: naive / absorbed)
    # text for the token ids (tokenized with the GGUF's own vocabulary by llama.cpp);
    # None: seeded random ids
    prompt: str | None = None
    # features switched off in the seeded model itself (Family.model_switches; feature bisection)
    switch_off: tuple = ()
    layers: str | None = None  # "0,5,-1": capture and compare only these layers (harness/select.py)
    probes: str | None = None  # "q_rope,attn_out": only these probes (plus what a pass needs)
    # impl's contiguous KV drops the rows a windowed layer can no longer read (spec
    # evict_layer_kv, FRINK_KV_WINDOW); off by default, as in the spec
    evict: bool = False
    # the engine judged (harness/candidates: an entry point's name, or dump:DIR)
    candidate: str = "impl"

    @property
    def refs(self) -> list[str]:
        return list(REFERENCES) if self.ref == "all" else [self.ref]

    @property
    def n_seqs(self) -> int:
        return self.seqs if self.seqs is not None else (1 if self.kv == "decode" else 2)

    @property
    def family_label(self) -> str:
        return self.family

    def case_id(self) -> str:
        parts = [self.family, f"{self.backend}-{self.device}-{self.dtype}", self.kv, self.schedule, self.ref,
                 f"s{self.seed}", f"t{self.tokens}"]
        if self.candidate != "impl":  # impl's ids stay as they were: baselines compare across the change
            parts.insert(5, f"cand={self.candidate}")
        if self.seqs is not None:
            parts.append(f"n{self.seqs}")
        if self.variant:
            parts.append(f"variant={self.variant}")
        if self.gguf_type != "f32":
            parts.append(f"gguf-{self.gguf_type}")
        if self.evict:
            parts.append("kv-evict")
        for k, v in self.overrides:
            parts.append(f"{k}={v}")
        if self.switch_off:
            parts.append("off=" + "+".join(self.switch_off))
        if self.prompt is not None:
            parts.append(f"prompt={cache.key(self.prompt)[:8]}")
        if self.layers is not None:
            parts.append(f"layers={self.layers}")
        if self.probes is not None:
            parts.append(f"probes={self.probes}")
        if self.hf_model:
            parts.append(f"hf-model={Path(self.hf_model).name}")
        if self.gguf:
            parts.append(f"gguf={Path(self.gguf).name}")
        return "/".join(str(p) for p in parts)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["overrides"] = [list(kv) for kv in self.overrides]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        d = dict(d)
        d["overrides"] = tuple(tuple(kv) for kv in d.get("overrides", ()))
        d["switch_off"] = tuple(d.get("switch_off", ()))
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def validate(self) -> None:
        """Every name checked against what is valid, before any work (exit 2)."""
        if self.gguf is None:
            fam = families.get(self.family)
            if self.variant is not None and self.variant not in fam.variants:
                valid = fam.variants or ("(none: this family has no variants)",)
                raise UsageError(f"unknown variant {self.variant!r} for family {self.family}; {suggest(self.variant, valid)}")
        if self.ref not in REF_CHOICES:
            raise UsageError(f"unknown reference {self.ref!r}; {suggest(self.ref, REF_CHOICES)}")
        if self.kv not in KV_MODES:
            raise UsageError(f"unknown kv mode {self.kv!r}; {suggest(self.kv, KV_MODES)}")
        if self.gguf is None and self.gguf_type not in GGUF_TYPES:
            raise UsageError(f"unknown GGUF weight type {self.gguf_type!r}; {suggest(self.gguf_type, GGUF_TYPES)}")
        if self.gguf is None:
            from .refs.gguf_weights import check_weight_type

            check_weight_type(self.gguf_type)
        if self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt.strip()):
            raise UsageError("--prompt must be non-empty text")
        if self.prompt is not None and "," in self.schedule:
            raise UsageError("--prompt sets the length: use the prefill, decode or mixed schedule, not chunk sizes")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise UsageError(f"--seed must be a non-negative integer, got {self.seed!r}")
        if not isinstance(self.tokens, int) or self.tokens < 1:
            raise UsageError(f"--tokens must be a positive integer, got {self.tokens!r}")
        if self.n_seqs < 1:
            raise UsageError(f"--seqs must be a positive integer, got {self.n_seqs!r}")
        if self.kv == "decode" and self.n_seqs != 1:
            raise UsageError("kv mode decode holds one sequence; use --kv batched or paged for several")
        if self.page_size < 1:
            raise UsageError(f"--page-size must be a positive integer, got {self.page_size}")
        parse_layers(self.layers)
        parse_probes(self.probes)
        if not isinstance(self.evict, bool):
            raise UsageError(f"kv eviction is true or false, got {self.evict!r}")
        if self.evict and self.kv == "paged":
            raise UsageError("--kv-evict applies to the contiguous KV backings (decode, batched); the paged pool "
                             "keeps its pages (spec evict_layer_kv is in the contiguous arm)")
        try:
            Backend(self.backend, self.device, self.dtype)
            chunk_sizes(self.schedule, self.tokens)
        except ConfigError as e:
            raise UsageError(str(e)) from None
        if self.schedule not in SCHEDULES and "," not in self.schedule:
            raise UsageError(f"unknown schedule {self.schedule!r}; {suggest(self.schedule, SCHEDULES)}")
        if self.hf_model and not Path(self.hf_model).is_dir():
            raise UsageError(f"--hf-model {self.hf_model!r} is not a directory (expected config.json + *.safetensors)")
        if self.gguf and not Path(self.gguf).is_file():
            raise UsageError(f"--gguf {self.gguf!r} is not a file")
        if self.gguf and self.switch_off:
            raise UsageError("switch_off does not apply to --gguf: the file's weights are compared as they are")
        if self.gguf and (self.hf_model or self.overrides or self.gguf_type != "f32" or self.variant):
            what = ("--hf-model" if self.hf_model else "--set" if self.overrides else "--gguf-type"
                    if self.gguf_type != "f32" else "--variant")
            raise UsageError(f"{what} does not apply to --gguf: the file's metadata and tensor types are its config")
        from . import candidates

        candidates.get(self.candidate).validate(self)


class CaseRun:
    """Everything one case computes; rows come out of ``rows()``."""

    def __init__(self, case: Case, policy: Policy, progress=None):
        self.case = case
        self.policy = policy
        self.progress = progress or (lambda msg: None)
        self.timings: dict[str, float] = {}
        self.derived: dict[tuple[str, str], str] = {}  # (reference, probe key) -> how it was derived
        self.switched: dict[str, int] = {}  # switch_off tag -> tensors / modules it changed
        self.source = None  # set for --gguf / --hf-model
        self.notes: list[str] = []  # what a candidate says about how it was judged (printed, in meta.json)
        self.hf_types: dict = {}  # quantized weights: HF tensor -> the GGUF types it came from
        if case.gguf:
            from .refs import gguf_import

            t = time.perf_counter()
            self.source = gguf_import.load(case.gguf, case.family or None)
            self.hf_types = self.source.hf_types
            self.timings["gguf_import"] = time.perf_counter() - t
            self.family = self.source.family
            # the file decides the family and the weight type the case is judged at
            from dataclasses import replace

            self.case = case = replace(case, family=self.family.name, gguf_type=self.source.weight_type,
                                       variant=self.source.variant)
        else:
            self.family = families.get(case.family)
        self.variant = case.variant or (self.family.variants[0] if self.family.variants else None)

    def meta_extra(self) -> dict:
        """What the run's meta.json records beyond the case: for a GGUF, the file
        (its weight types, the metadata keys llama.cpp does not read for its arch)."""
        return {"gguf": self.source.summary()} if self.source is not None else {}

    # ------------------------------------------------------------ model & weights
    @cached_property
    def config(self):
        if self.source is not None:
            return self.source.config
        if self.case.hf_model:
            from .refs.checkpoint import load_config

            return load_config(self.case.hf_model, self.family, dict(self.case.overrides))
        return self.family.make_config(dict(self.case.overrides))

    @cached_property
    def raw_layer_cfgs(self):
        """The family's layer configs before any ``switch_off`` module switch."""
        try:
            return self.family.layer_configs(self.config, self.variant)
        except ConfigError as e:
            raise UsageError(f"family {self.family.name}: {e}") from None

    @cached_property
    def switches(self) -> list:
        """The ``ModelSwitch`` of every tag in ``case.switch_off``."""
        if not self.case.switch_off:
            return []
        known = self.family.model_switches(self.config)
        for tag in self.case.switch_off:
            if tag not in known:
                raise UsageError(f"family {self.family.name} has no model switch {tag!r}; {suggest(tag, known)}")
        hf_only = [t for t in self.case.switch_off if known[t].hf_only]
        if hf_only and self.case.refs != ["hf"]:
            raise UsageError(f"switch_off {', '.join(hf_only)} replaces HF modules, which only the HF reference "
                             "sees; use --ref hf")
        return [known[t] for t in self.case.switch_off]

    @cached_property
    def layer_cfgs(self):
        lcs = self.raw_layer_cfgs
        for sw in self.switches:
            if sw.layer is not None:
                lcs = [sw.layer(lc) for lc in lcs]
        return lcs

    @cached_property
    def base_model(self):
        """The float32 model every reference and impl take their weights from: with
        a quantized ``gguf_type``, the weights of the quantized file llama.cpp runs,
        dequantized (harness/refs/gguf_weights.py) -- every side computes with the
        same numbers."""
        m = self.float_model
        if self.source is None and self.family.gguf_arch and is_quantized(self.case.gguf_type):
            from .refs.gguf_weights import dequantized_model

            try:
                path = self.gguf_path  # its own timing: gguf_export
            except RuntimeError:  # no file for llama.cpp (its capture reports why): the float weights
                return m
            t = time.perf_counter()
            m, self.hf_types = dequantized_model(self.family, m, self.config, path, self.variant)
            self.timings["dequantize"] = time.perf_counter() - t
        return m

    @cached_property
    def gguf_path(self) -> Path:
        """The GGUF llama.cpp runs: the user's file, or the export of ``float_model``
        at the case's weight type (quantized by llama.cpp itself)."""
        if self.source is not None:
            return Path(self.source.path)
        if not self.family.gguf_arch:
            raise RuntimeError(f"family {self.family.name} has no GGUF export (llama.cpp arch unknown)")
        from .refs.gguf_weights import export_for_case

        # --hf-model: the checkpoint's files shape the GGUF as much as its config does
        stamp = [self.case.hf_model, _checkpoint_stamp(self.case.hf_model)] if self.case.hf_model else None
        if self.case.switch_off:  # weights neutralised in the seeded model (Family.model_switches)
            stamp = [stamp, ["switch_off", list(self.case.switch_off)]]
        model = self.float_model
        t = time.perf_counter()
        path = export_for_case(self.family, model, self.config, self.case.gguf_type, self.case.seed, self.variant,
                               source=stamp)
        self.timings["gguf_export"] = time.perf_counter() - t  # a cached file: the time to find it
        return path

    @cached_property
    def weight_dtype(self) -> str:
        """What llama.cpp's weights make of a comparison with it: the export's float
        type, or -- for quantized weights, which every side holds dequantized --
        the type ggml's CPU quantizes the ACTIVATIONS to before it multiplies
        them (vec_dot_type, harness/refs/ggml_types.py), the coarsest over the
        file's quantized tensors."""
        if not is_quantized(self.case.gguf_type):
            return self.case.gguf_type
        from .refs.ggml_types import activation_dtype
        from .refs.gguf_weights import file_tensors

        try:
            types = self.source.tensor_types if self.source is not None else file_tensors(self.gguf_path)[1]
        except RuntimeError:  # no file: llama.cpp is an error row, nothing is compared with it
            return "float32"
        return activation_dtype(types.values()) or "float32"

    @cached_property
    def float_model(self):
        """The model as built: the family's seeded one, a checkpoint, or the
        user's GGUF read back (its weights already those llama.cpp runs)."""
        if self.source is not None:  # --gguf: the HF model gguf_import rebuilt from the file
            return self.source.model
        t = time.perf_counter()
        if self.case.hf_model:
            from .refs.checkpoint import load_model

            m = load_model(self.case.hf_model, self.family, self.config)
        else:
            m = self.family.build_model(self.config, self.case.seed, "float32")
        # what each switch changed (0: nothing there to switch, e.g. a config switch
        # of the same case already removed it); feature bisection reads it
        self.switched = {tag: sw.edit(m, self.config, self.raw_layer_cfgs)
                         for tag, sw in zip(self.case.switch_off, self.switches)}
        self.timings["build_model"] = time.perf_counter() - t
        return m

    def model_in(self, dtype: str):
        """The model with its weights held in ``dtype``: the float32 base model (also
        for float64, which HF computes module by module on it: refs/hf_float64.py
        ``promoted``), or ONE copy in bfloat16 / float16 made once per case."""
        import copy

        import torch

        if dtype in ("float32", "float64"):
            return self.base_model
        key = f"_model_{dtype}"
        if key not in self.__dict__:
            self.__dict__[key] = copy.deepcopy(self.base_model).to(getattr(torch, dtype))
        return self.__dict__[key]

    @cached_property
    def selection(self) -> Selection:
        """The layers and probes this case captures and compares (``--layers``, ``--probes``)."""
        return Selection.of(self.case.layers, self.case.probes, len(self.layer_cfgs))

    @cached_property
    def plan(self) -> budget.Plan:
        """What this case runs within the memory it has (harness/budget.py), decided
        from the config before any work: a refusal is a UsageError (exit 2)."""
        c = self.case
        return budget.plan(self.family, self.config, self.layer_cfgs, tokens=c.tokens, seqs=c.n_seqs, dtype=c.dtype,
                           refs=c.refs, selection=self.selection, gguf_type=c.gguf_type)

    @cached_property
    def tokens(self) -> np.ndarray:
        """The token ids ``[seqs, tokens]``: seeded random ids, or ``--prompt``
        tokenized with the GGUF's own vocabulary (the user's file, or the export)
        by llama.cpp -- the same ids for every sequence and every side."""
        if self.case.prompt is not None:
            from dataclasses import replace

            from .refs.llamacpp import tokenize

            try:
                ids = tokenize(self.gguf_path, self.case.prompt)
            except RuntimeError as e:
                raise UsageError(f"--prompt: {e}") from None
            bad = [i for i in ids if not 0 <= i < int(self.config.vocab_size)]
            if bad:
                raise UsageError(f"--prompt: token ids {bad[:4]} lie outside the model's {self.config.vocab_size} "
                                 "embedding rows")
            self.case = replace(self.case, tokens=len(ids))
            return np.tile(np.asarray(ids, dtype=np.int64), (self.case.n_seqs, 1))
        vocab = int(self.config.vocab_size)
        rows = [np.random.default_rng([self.case.seed, s, 7]).integers(0, vocab, self.case.tokens)
                for s in range(self.case.n_seqs)]
        return np.stack(rows).astype(np.int64)

    def layer_weights_for(self, dtype: str, i: int) -> dict:
        """impl's weights of layer ``i``, as the reference computing in ``dtype`` holds
        them -- made when asked and not kept: at real sizes all layers' weights in
        float64 would be a second model."""
        lc = self.layer_cfgs[i]
        if isinstance(lc, NotInImpl):
            return {}
        if self.source is not None:
            w = self.source.layer_weights[i]
        else:
            model = self.model_in(dtype if dtype in ("float16", "bfloat16") else "float32")
            w = self.family.layer_weights(model, self.config, i)
        # a named variant may store the same function in other weights (llama's
        # wo_scale: wo / s, with s as the {1} companion)
        return self.family.variant_weights(w, self.config, i, self.variant)

    def weights_for(self, dtype: str) -> list[dict]:
        """Every layer's ``layer_weights_for`` (small models; a real-size run takes them one layer at a time)."""
        return [self.layer_weights_for(dtype, i) for i in range(len(self.layer_cfgs))]

    @cached_property
    def features(self) -> list[str]:
        # one layer's weights at a time (their names decide the features)
        f = model_features(self.layer_cfgs, (self.layer_weights_for("float32", i) for i in range(len(self.layer_cfgs))))
        f |= set(self.family.declared_features)
        f.add(f"kv_{self.case.kv}")
        if self.case.evict:
            f.add("kv_evict")
        return sorted(f)

    # ------------------------------------------------------------ references
    def capture(self, ref: str) -> RefCapture:
        t = time.perf_counter()
        try:
            if ref == "hf":
                rc = self._capture_hf()
            else:
                from .refs import llamacpp

                rc = llamacpp.capture_for_case(self)
        except UsageError:
            raise
        except Exception as e:  # a crash inside a reference is a recorded error row
            rc = RefCapture(ref, "float32", error=f"{type(e).__name__}: {' '.join(str(e).split())[:400]}",
                            meta={"traceback": traceback.format_exc(limit=4)})
        rc.seconds = time.perf_counter() - t
        self.timings[f"capture_{ref}"] = rc.seconds
        self.derived.update({(ref, k): how for k, how in (rc.meta.get("derived") or {}).items()})
        return rc

    def _capture_hf(self, dtype: str | None = None, weights: str | None = None,
                    force: RefCapture | None = None, attn_implementation: str = "eager") -> RefCapture:
        """HF computing in ``dtype`` (default: the case's) on its weights as held in
        ``weights`` (default: ``dtype``); ``force``: teacher-force every decoder layer
        with that capture's own layer inputs (the float64 oracle, ``hf_oracle``);
        ``attn_implementation``: transformers' attention path (the reference is
        eager; the hf-sdpa / hf-flex candidates, harness/candidates/hf_attn.py)."""
        from .refs import hf

        dtype = dtype or self.plan.hf_dtype
        weights = weights or dtype
        sel = self.selection
        src = cache.source_hash(*cache.family_sources(self.family), Path(hf.__file__),
                                Path(hf.__file__).with_name("hf_float64.py"),
                                Path(__file__).parent / "families" / "base.py")
        k = cache.key("hf", CAPTURE_SCHEMA, self.family.name, self.config.to_json_string(use_diff=False),
                      self.case.seed, self.tokens.tolist(), dtype, self.case.hf_model,
                      _checkpoint_stamp(self.case.hf_model), versions().get("torch"),
                      versions().get("transformers"), src,
                      *((["switch_off", list(self.case.switch_off)],) if self.case.switch_off else ()),
                      *self._weights_stamp(),
                      *((["weights", weights],) if weights != dtype else ()),
                      *((["forced_by", force.key],) if force is not None else ()),
                      *((["selection", sel.label()],) if sel.label() else ()),
                      *((["attn_implementation", attn_implementation],) if attn_implementation != "eager" else ()))
        hit = cache.load("hf", k)
        if hit is not None:
            return RefCapture("hf", dtype, hit[0], meta=hit[1], cached=True, key=k)
        # the weights as held (float32, or the case's bfloat16 / float16 copy); a float64
        # run computes on them module by module with every float32 side path of HF's
        # modeling code promoted (refs/hf_float64.py), so it is judged at float64
        model, how = self._hf_model(weights)
        if attn_implementation != "eager":  # a candidate's attention path, on a copy: the reference stays eager
            import copy

            model = copy.deepcopy(model)
            model.set_attn_implementation(attn_implementation)
        meta = {"family": self.family.name, "dtype": dtype, "weights": weights, **({"built_by": how} if how else {})}
        forced = None if force is None else {k2: force.probes[k2] for k2 in force.probes if k2.endswith(".layer_in")}
        # each probe goes to disk as HF computes it (harness/store.py); the oracle stops
        # after the last layer it is asked for
        with cache.writer("hf", k, keep=sel.key) as w:
            hf.capture(self.family, model, self.config, self.layer_cfgs, self.tokens, meta, force_inputs=forced,
                       sink=w, layers=sel.layers, probes=sel.probes, float64=dtype == "float64",
                       model_probes=force is None and sel.model_probes,
                       attn_implementation=attn_implementation)
            probes = cache.finish(w, meta)
        return RefCapture("hf", dtype, probes, meta=meta, key=k)

    def _weights_stamp(self) -> list:
        """What, beyond the config and seed, decides the weights HF runs: the
        user's GGUF (its stamp), or the quantized file whose weights it holds."""
        if self.source is not None:
            p = Path(self.source.path)
            return [["gguf", str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns]]
        if self.family.gguf_arch and is_quantized(self.case.gguf_type):
            try:
                return [["quantized", self.gguf_path.name]]
            except RuntimeError:
                return [["quantized", None]]
        return []

    @cached_property
    def _gguf_hf(self):
        """``(model, how)`` of transformers' own GGUF loader on the user's file
        (``(None, why not)`` where it does not read the arch); built once."""
        from .refs.gguf_weights import transformers_reference

        return transformers_reference(self.source)

    def _hf_model(self, weights: str):
        """The HF reference model with its weights held in ``weights`` (as
        ``model_in``: float32 also for float64, which HF computes module by module
        on it) and, for a GGUF, how its weights were built (the caller copies
        before changing it)."""
        if self.source is None:
            return self.model_in(weights), None
        model, how = self._gguf_hf
        if model is None:
            return self.model_in(weights), how
        if weights not in ("float32", "float64"):
            key = f"_gguf_hf_{weights}"
            if key not in self.__dict__:  # ONE copy per case, as model_in makes
                import copy

                import torch

                self.__dict__[key] = copy.deepcopy(model).to(getattr(torch, weights))
            model = self.__dict__[key]
        return model, how

    def hf_oracle(self, rc: RefCapture) -> RefCapture:
        """The float64 oracle of a comparison against HF below float64: HF's own
        arithmetic in float64 (every float32 side path promoted), on the weights as
        the lower-precision run holds them, each decoder layer fed THAT run's input to
        the layer -- so the oracle is never the candidate, and its distance to the
        reference is the reference's own rounding in the layer. An error is returned
        as a capture with ``error`` set (the comparison then errors, the run goes on)."""
        t = time.perf_counter()
        try:
            oc = self._capture_hf("float64", rc.dtype, force=rc)
        except UsageError:
            raise
        except Exception as e:
            oc = RefCapture("hf", "float64", error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
        self.timings["capture_hf_oracle"] = time.perf_counter() - t
        return oc

    # ------------------------------------------------------------ the candidate
    @cached_property
    def candidate(self):
        """The engine judged (harness/candidates; impl by default)."""
        from . import candidates

        return candidates.get(self.case.candidate)

    def weights_dtype(self, rc: RefCapture) -> str:
        """The weights a teacher-forced candidate computes with against ``rc``: as
        the reference holds them (HF's low-precision run rounds its weights too),
        else float32."""
        low = self.case.dtype in ("float16", "bfloat16")
        return self.case.dtype if low and rc.name == "hf" else "float32"

    # ------------------------------------------------------------ ggml's activation rounding
    def _emulates(self, rc: RefCapture) -> bool:
        # quantized weights only: a float file's comparison keeps its float16 / bfloat16 policy
        return rc.name == "llamacpp" and bool(self.hf_types) and is_quantized(self.case.gguf_type)

    def ggml_act_types(self, rc: RefCapture, i: int) -> dict[str, str]:
        """Against llama.cpp on quantized weights: layer ``i``'s impl weight name ->
        the type ggml's CPU quantizes the activations multiplied by it to
        (harness/refs/ggml_matmul.py), which a candidate may reproduce
        (``LayerCall.ggml_act``); else empty."""
        if not self._emulates(rc):
            return {}
        from .refs.ggml_matmul import layer_act_types

        by_layer = self.__dict__.setdefault("_act_types_by_layer", {})
        if i not in by_layer:
            by_layer[i] = layer_act_types(self.family, self.base_model, self.config, i, self.hf_types)
        return by_layer[i]

    def ggml_layer_dtype(self, rc: RefCapture, call) -> str | None:
        """A layer's comparison dtype against llama.cpp on quantized weights:
        ``ggml_<act>`` where the candidate reproduced ggml's activation rounding for
        every quantized matmul of the layer (``call.ggml_met``; what is left is
        float32 summation order), else the activation type's own (the rounding
        left in). None: not such a comparison."""
        if not self._emulates(rc):
            return None
        acts = {n: t for n, t in call.ggml_act.items() if n in call.weights}
        if acts and set(acts) <= call.ggml_met:
            from .refs.ggml_types import coarsest_activation

            return "ggml_" + coarsest_activation(acts.values())
        return self.weight_dtype

    # ------------------------------------------------------------ rows
    def rows(self) -> list[dict]:
        case = self.case
        cand = self.candidate
        name = cand.name
        self.progress(f"{case.case_id()}: capturing {', '.join(case.refs)}")
        backend = Backend(case.backend, case.device, case.dtype)
        try:
            backend.check_available()
        except ConfigError as e:
            return [self._row(name, "-", None, "", "skipped", str(e))]
        why = cand.unsupported(self)
        if why:  # a limit of the engine, said in the row: nothing compared, never a pass
            return [self._row(name, "-", None, "*", "skipped", why)]
        _ = self.plan  # decided before any capture: a case that cannot fit is refused here
        caps = [self.capture(r) for r in case.refs]
        rows: list[dict] = []
        for rc in caps:
            if rc.error:
                rows.append(self._row(name, rc.name, None, "", "error", f"reference {rc.name} failed: {rc.error}"))
                continue
            oracle = self.oracle_for(rc)
            t = time.perf_counter()
            if oracle is not None and oracle.error:
                rows.append(self._row(name, rc.name, None, "", "error",
                                      f"the float64 oracle of {rc.name} failed: {oracle.error}"))
                continue
            rows += self._compare_candidate(rc, oracle)
            self.timings[f"{name}_vs_{rc.name}"] = time.perf_counter() - t
        good = [rc for rc in caps if not rc.error]
        if len(good) >= 2:
            t = time.perf_counter()
            rows += self._compare_refs(good[1], good[0])
            self.timings["refs_compare"] = time.perf_counter() - t
        # a pass must mean the candidate was checked (harness/verdict.py): findings need a
        # guard, every implemented layer a passing attn_out against some reference
        return verdict.guard(rows, self.layer_cfgs, name,
                             lambda layer, probe, reason: self._row(name, "-", layer, probe, "unguarded", reason),
                             fallback=None if cand.teacher_forced else "layer_out", layers=self.selection.layers)

    def oracle_for(self, rc: RefCapture) -> RefCapture | None:
        """The float64 oracle the candidate is judged through against ``rc``, or None
        (judged directly). A teacher-forced candidate below float64 against HF:
        ``hf_oracle`` (HF in float64 fed ``rc``'s own layer inputs). A free-running
        candidate (it runs from the tokens, as the references do): HF in float64,
        free-running too, on the weights the case's HF run holds -- against either
        reference, where the comparison dtype's table has an oracle rule. None too
        where the memory plan skipped the oracle (harness/budget.py; every row
        against HF says so)."""
        if self.plan.skips_oracle and not (rc.name == "hf" and rc.dtype == "float64"):
            return None
        if self.candidate.teacher_forced:
            return self.hf_oracle(rc) if rc.name == "hf" and rc.dtype != "float64" else None
        if rc.dtype == "float64" and rc.name == "hf":
            return rc  # the reference is itself float64 and runs free from the same tokens
        key = "_free_oracle"
        if key not in self.__dict__:
            t = time.perf_counter()
            try:
                w = self.case.dtype if self.case.dtype in ("float16", "bfloat16") else "float32"
                self.__dict__[key] = self._capture_hf("float64", w)
            except UsageError:
                raise
            except Exception as e:
                self.__dict__[key] = RefCapture("hf", "float64", error=f"{type(e).__name__}: "
                                                                       f"{' '.join(str(e).split())[:300]}")
            self.timings["capture_hf_oracle"] = time.perf_counter() - t
        return self.__dict__[key]

    def _compare_candidate(self, rc: RefCapture, oracle: RefCapture | None = None) -> list[dict]:
        """The candidate against one reference. ``oracle``: a float64 run on the same
        inputs (``oracle_for``); where given and the comparison dtype has an oracle
        rule, each probe is judged by the candidate's distance to it relative to the
        reference's (``judge_against_oracle``). Otherwise (llama.cpp, a float32 graph,
        against a teacher-forced candidate: the reference is itself the better
        estimate of the truth) the candidate is judged directly, at the comparison
        dtype's bounds scaled to the case (harness/scaling.py).

        A teacher-forced candidate is given ``rc``'s own layer inputs, layer by
        layer; a free-running one is compared at every probe both sides hold,
        ``layer_in`` and the model-level probes included."""
        from .candidates import CandidateCapture, LayerCandidate

        cand = self.candidate
        name, forced = cand.name, cand.teacher_forced
        sel = self.selection
        # a candidate that computes one layer at a time is run and compared layer by
        # layer, its probes of a layer dropped once compared: a real-size run holds one
        # layer beyond the weights (issue 13); any other candidate captures once
        by_layer = isinstance(cand, LayerCandidate)
        try:
            whole = CandidateCapture(name, cand.dtype(self)) if by_layer else cand.capture(self, rc)
        except UsageError:
            raise
        except Exception as e:  # the candidate crashed as a whole: one error row, the run goes on
            return [self._row(name, rc.name, None, "*", "error",
                              f"{name} raised {type(e).__name__}: {' '.join(str(e).split())[:300]}")]
        cdt = comparison_dtype(whole.dtype, rc.dtype)
        if rc.name == "llamacpp":
            cdt = comparison_dtype(cdt, self.weight_dtype)
        if oracle is not None and "ratio" not in self.policy.tolerance(cdt, "default")[0]:
            oracle = None  # no oracle rule at this precision: judged directly
        # what the memory plan gave up (harness/budget.py), said in every row against HF
        plan_note = "; ".join(self.plan.notes) if rc.name == "hf" else ""
        rows = []

        def compare(cap, layer, probe, expected):
            if cap.note and cap.note not in self.notes:
                self.notes.append(cap.note)
            key = f"L{layer}.{probe}" if layer is not None else probe
            if key not in cap.probes:
                hidden = cap.hidden(key)
                if hidden and (expected or key in rc.probes):
                    rows.append(self._row(name, rc.name, layer, probe, "not-exposed", f"{name}: {hidden}"))
                elif expected and not hidden:  # a probe the candidate stopped emitting is noticed, not dropped
                    lc = self.layer_cfgs[layer] if layer is not None else None
                    what = (f"({_layer_kind(lc)} layers emit {', '.join(verdict.expected_probes(lc))})"
                            if lc is not None and verdict.expected_probes(lc) else f"({rc.name} holds it)")
                    rows.append(self._row(name, rc.name, layer, probe, "missing",
                                          f"{name} emitted no {probe} for this layer {what}"))
                return
            if key not in rc.probes:
                rows.append(self._row(name, rc.name, layer, probe, "not-exposed",
                                      f"{rc.name} does not expose {probe} for {self.family.name}"))
                return
            orc = None if oracle is None else oracle.probes.get(key)
            if oracle is not None and orc is None and not forced:
                pass  # HF computes no such tensor (MLA's absorbed query): judged directly
            elif oracle is not None and orc is None:
                rows.append(self._row(name, rc.name, layer, probe, "error",
                                      f"the float64 oracle of {rc.name} has no {probe} here"))
                return
            # a layer whose quantized matmuls the candidate rounded as ggml does is judged at
            # ggml_<act> (CaseRun.ggml_layer_dtype)
            ldt = (comparison_dtype(comparison_dtype(cap.dtype, rc.dtype), cap.layer_dtypes[layer])
                   if layer in cap.layer_dtypes else cdt)
            row = self._judge(name, rc.name, layer, probe, cap.probes[key], rc.probes[key], ldt, orc)
            if cap.note and not row.get("tol_reason"):
                row["tol_reason"] = cap.note  # why the bound is this dtype's
            if plan_note:
                row["reason"] = "; ".join(x for x in (row["reason"], plan_note) if x)
            rows.append(row)

        if not forced and sel.probe("embeddings"):
            compare(whole, None, "embeddings", "embeddings" in rc.probes)
        for i in sel.layers:
            lc = self.layer_cfgs[i]
            if forced and isinstance(lc, NotInImpl):
                rows.append(self._row(name, rc.name, i, "*", "not-implemented",
                                      f"not implemented in {name}: {lc.kind} ({lc.reason})", layer_kind=lc.kind))
                continue
            if forced and f"L{i}.layer_in" not in rc.probes:
                rows.append(self._row(name, rc.name, i, "layer_in", "not-exposed",
                                      f"{rc.name} does not expose this layer's input; the layer cannot be teacher-forced"))
                continue
            cap = whole
            if by_layer:
                t = time.perf_counter()
                cap = cand.capture_layer(self, rc, i)
                self.timings[f"{name}_run_{rc.name}"] = (self.timings.get(f"{name}_run_{rc.name}", 0.0)
                                                         + time.perf_counter() - t)
            if i in cap.errors:
                rows.append(self._row(name, rc.name, i, "*", "error", cap.errors[i]))
                continue
            expected = set(verdict.expected_probes(lc))
            if not forced:  # the engine's graph: what the reference holds, it must hold or say why not
                expected |= {p for p in LAYER_PROBES if f"L{i}.{p}" in rc.probes}
            for probe in LAYER_PROBES:
                if (probe == "layer_in" and forced) or not sel.probe(probe):
                    continue
                compare(cap, i, probe, probe in expected)
            del cap
        if not forced:
            for probe in ("final_norm", "logits"):
                if sel.probe(probe):
                    compare(whole, None, probe, probe in rc.probes)
        return rows

    def _compare_refs(self, cand: RefCapture, ref: RefCapture) -> list[dict]:
        cdt = comparison_dtype(comparison_dtype(cand.dtype, ref.dtype), self.weight_dtype)
        rows = []
        keys = [k for k in ref.probes if k in cand.probes]
        order = {p: n for n, p in enumerate(LAYER_PROBES)}

        def sort_key(k):
            if k.startswith("L"):
                layer, probe = k.split(".", 1)
                return (1, int(layer[1:]), order.get(probe, 99), probe)
            return (0 if k == "embeddings" else 2, 0, 0, k)

        for k in sorted(keys, key=sort_key):
            layer, probe = (int(k.split(".")[0][1:]), k.split(".", 1)[1]) if k.startswith("L") else (None, k)
            rows.append(self._judge(cand.name, ref.name, layer, probe, cand.probes[k], ref.probes[k], cdt, None))
        return rows

    def _judge(self, cand_name, ref_name, layer, probe, a, b, cdt, oracle) -> dict:
        if np.shape(a) != np.shape(b):
            return self._row(cand_name, ref_name, layer, probe, "error",
                             f"shape mismatch: {cand_name} {np.shape(a)} vs {ref_name} {np.shape(b)}", cmp_dtype=cdt)
        m = metrics(a, b, probe)
        base, why = self.policy.tolerance(cdt, probe, self.family.name, ref_name, cand_name)
        # the bound at this case's size: RoPE reach and the values' scale (harness/scaling.py);
        # angles are float32 in every reference below float64 (llama.cpp always)
        rope = self._rope_reach(cand_name, layer, probe)
        ref_scale = absmax(b if oracle is None else oracle)
        tol = scaling.scaled(base, rope, "float64" if cdt == "float64" else "float32", ref_scale)
        if oracle is not None:
            cm, rm = metrics(a, oracle, probe), metrics(b, oracle, probe)
            status, reason, allowed = judge_against_oracle(cm, rm, tol, all_finite(oracle))
            extra = {"nmse_cand_oracle": cm["nmse"], "nmse_ref_oracle": rm["nmse"],
                     "err_ratio": max(_over(cm["nmse"], allowed), _over(cm["max_abs"], tol["atol"]))}
            tol = dict(tol, nmse=allowed)  # the bound actually applied is what the row reports
        else:
            status, reason = judge(m, tol)
            extra = {"err_ratio": max(_over(m["nmse"], tol["nmse"]), _over(m["max_abs"], tol["atol"]))}
        if status == "fail":
            # matched on the reference's own config (the HF config; a --gguf file's read back
            # from its keys), never on what impl was told to compute
            lc = self.layer_cfgs[layer] if layer is not None else None
            known = self.policy.finding(self.family.name, cand_name, ref_name, probe, _layer_kind(lc), self.config,
                                        layer=layer, nmse=m["nmse"], dtype=cdt, tokens=self.case.tokens,
                                        n_layers=len(self.layer_cfgs))
            if known:
                status, reason = "finding", f"{reason} -- known disagreement: {known}"
        key = f"L{layer}.{probe}" if layer is not None else probe
        notes = [f"{side}'s {probe} is {self.derived[(side, key)]}" for side in (cand_name, ref_name)
                 if (side, key) in self.derived]
        if notes:  # never silent: a derived probe is not one the reference names
            reason = "; ".join(([reason] if reason else []) + notes)
        row = self._row(cand_name, ref_name, layer, probe, status, reason, cmp_dtype=cdt, **m, **extra,
                        tol_nmse=tol.get("nmse"), tol_atol=tol.get("atol"), tol_reason=why)
        return row

    def _rope_reach(self, cand: str, layer: int | None, probe: str):
        """The RoPE reach (harness/scaling.py) a comparison's bound must allow for, or
        None: a teacher-forced candidate carries the angle error of its own layer
        only, from q_rope on; free-running sides carry every RoPE upstream."""
        n = self.case.tokens
        pos = dataflow_position(layer, probe)
        reach = []
        for i, lc in enumerate(self.layer_cfgs):
            if isinstance(lc, NotInImpl) or scaling.rope_size(lc, n) is None:
                continue
            if cand == self.candidate.name and self.candidate.teacher_forced and i != layer:
                continue
            if pos >= dataflow_position(i, "q_pe" if hasattr(lc, "kv_lora_rank") else "q_rope"):
                reach.append(scaling.rope_size(lc, n))
        if not reach:
            return None
        return scaling.RopeSize(max(r.mean_sq for r in reach), max(r.max_weighted for r in reach))

    def _row(self, cand, ref, layer, probe, status, reason, **kw) -> dict:
        c = self.case
        lc = self.layer_cfgs[layer] if layer is not None and layer < len(self.layer_cfgs) else None
        row = dict(
            case_id=c.case_id(), family=self.family.name, features=";".join(self.features), backend=c.backend,
            device=c.device, dtype=c.dtype, kv=c.kv, schedule=c.schedule, seed=c.seed, tokens=c.tokens,
            seqs=c.n_seqs, gguf_type=c.gguf_type, overrides=";".join(f"{k}={v}" for k, v in c.overrides),
            candidate=cand, reference=ref, layer=-1 if layer is None else layer, probe=probe,
            variant=self.variant or "", layer_kind=kw.pop("layer_kind", None) or _layer_kind(lc),
            status=status, reason=reason,
        )
        row.update(kw)
        return row


def _over(err: float, limit: float) -> float:
    """How far ``err`` is from the tolerance that judged it (> 1 fails): the
    number the report's heatmap colours by, comparable across dtypes."""
    return err / limit if limit > 0 else (0.0 if err == 0 else float("inf"))


def _layer_kind(lc) -> str:
    if lc is None:
        return "model"
    if isinstance(lc, NotInImpl):
        return lc.kind
    return getattr(lc, "kind", None) or ("attention" if getattr(lc, "shape", "gqa") == "gqa" else lc.shape)


def run_case(case: Case, policy: Policy, progress=None) -> tuple[list[dict], dict]:
    """Validate, run, and return ``(rows, info)``. UsageError propagates (exit 2)."""
    case.validate()
    run = CaseRun(case, policy, progress)
    _ = run.layer_cfgs  # shape errors surface as UsageError before any capture
    _ = run.plan  # so does a case that cannot fit in memory (harness/budget.py)
    t = time.perf_counter()
    rows = run.rows()
    run.timings["total"] = time.perf_counter() - t
    return rows, {"case": run.case.to_dict(), "case_id": run.case.case_id(), "features": run.features,
                  "timings": run.timings, "family": run.family.name, "plan": run.plan.meta(), **run.meta_extra()}
