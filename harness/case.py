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
from typing import Any

import numpy as np

import impl
from impl import Backend
from impl.config import ConfigError
from impl.kv import KV_MODES
from impl.runner import SCHEDULES, chunk_sizes, load_layer, run_layer
from impl.trace import LAYER_PROBES

from . import cache, families
from .compare import judge, judge_against_oracle, metrics
from .errors import UsageError, suggest
from .families.base import NotInImpl
from .features import model_features
from .policy import Policy, comparison_dtype
from .refs.capture import RefCapture  # noqa: F401 (re-exported: harness.case.RefCapture)
from .refs.checkpoint import checkpoint_stamp as _checkpoint_stamp
from .refs.ggml_types import GGUF_TYPES, is_quantized  # f32 / f16 / bf16 exports, llama_model_quantize's types
from .versions import versions

REFERENCES = ("hf", "llamacpp")
REF_CHOICES = REFERENCES + ("all",)
STATUSES = ("pass", "fail", "error", "finding", "not-exposed", "not-implemented", "skipped")
CAPTURE_SCHEMA = 1  # bump when the meaning of a stored capture changes


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
        if self.seqs is not None:
            parts.append(f"n{self.seqs}")
        if self.variant:
            parts.append(f"variant={self.variant}")
        if self.gguf_type != "f32":
            parts.append(f"gguf-{self.gguf_type}")
        for k, v in self.overrides:
            parts.append(f"{k}={v}")
        if self.switch_off:
            parts.append("off=" + "+".join(self.switch_off))
        if self.prompt is not None:
            parts.append(f"prompt={cache.key(self.prompt)[:8]}")
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
        if not isinstance(self.tokens, int) or self.tokens < 1:
            raise UsageError(f"--tokens must be a positive integer, got {self.tokens!r}")
        if self.n_seqs < 1:
            raise UsageError(f"--seqs must be a positive integer, got {self.n_seqs!r}")
        if self.kv == "decode" and self.n_seqs != 1:
            raise UsageError("kv mode decode holds one sequence; use --kv batched or paged for several")
        if self.page_size < 1:
            raise UsageError(f"--page-size must be a positive integer, got {self.page_size}")
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

            t = time.perf_counter()
            try:
                path = self.gguf_path
            except RuntimeError:  # no file for llama.cpp (its capture reports why): the float weights
                return m
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
        return export_for_case(self.family, self.float_model, self.config, self.case.gguf_type, self.case.seed,
                               self.variant, source=stamp)

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
        import copy

        import torch

        if dtype == "float32":
            return self.base_model
        return copy.deepcopy(self.base_model).to(getattr(torch, dtype))

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

    def weights_for(self, dtype: str) -> list[dict]:
        """impl's weights, as the reference computing in ``dtype`` holds them."""
        key = f"_weights_{dtype}"
        if key not in self.__dict__:
            if self.source is not None:
                ws = self.source.layer_weights
            else:
                model = self.model_in(dtype if dtype in ("float16", "bfloat16") else "float32")
                ws = [
                    {} if isinstance(lc, NotInImpl) else self.family.layer_weights(model, self.config, i)
                    for i, lc in enumerate(self.layer_cfgs)
                ]
            # a named variant may store the same function in other weights (llama's
            # wo_scale: wo / s, with s as the {1} companion)
            self.__dict__[key] = [w if isinstance(lc, NotInImpl) else
                                  self.family.variant_weights(w, self.config, i, self.variant)
                                  for i, (lc, w) in enumerate(zip(self.layer_cfgs, ws))]
        return self.__dict__[key]

    @cached_property
    def features(self) -> list[str]:
        f = model_features(self.layer_cfgs, self.weights_for("float32"))
        f |= set(self.family.declared_features)
        f.add(f"kv_{self.case.kv}")
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

    def _hf_dtype(self) -> str:
        return self.case.dtype

    @staticmethod
    def _hf_effective(dtype: str) -> str:
        # HF runs a float64 model with float32 inside: LlamaRMSNorm.forward upcasts to
        # float32 (`hidden_states.to(torch.float32)`), the rotary embedding keeps
        # inv_freq in float32 and computes cos/sin under `.float()`. So a float64
        # comparison against HF is judged at float32 -- the precision HF delivers.
        return "float32" if dtype == "float64" else dtype

    def _capture_hf(self) -> RefCapture:
        from .refs import hf

        dtype = self._hf_dtype()
        src = cache.source_hash(*cache.family_sources(self.family), Path(hf.__file__),
                                Path(__file__).parent / "families" / "base.py")
        k = cache.key("hf", CAPTURE_SCHEMA, self.family.name, self.config.to_json_string(use_diff=False),
                      self.case.seed, self.tokens.tolist(), dtype, self.case.hf_model,
                      _checkpoint_stamp(self.case.hf_model), versions().get("torch"),
                      versions().get("transformers"), src,
                      *((["switch_off", list(self.case.switch_off)],) if self.case.switch_off else ()),
                      *self._weights_stamp())
        hit = cache.load("hf", k)
        if hit is not None:
            return RefCapture("hf", self._hf_effective(dtype), hit[0], meta=hit[1], cached=True)
        model, how = self._hf_model(dtype)
        probes = hf.capture(self.family, model, self.config, self.layer_cfgs, self.tokens)
        meta = {"family": self.family.name, **({"weights": how} if how else {})}
        cache.store("hf", k, probes, meta)
        return RefCapture("hf", self._hf_effective(dtype), probes, meta=meta)

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

    def _hf_model(self, dtype: str):
        """The HF reference model and, for a GGUF, how its weights were built."""
        if self.source is None:
            return self.model_in(dtype), None
        from .refs.gguf_weights import transformers_reference

        model, how = transformers_reference(self.source)
        if model is None:
            model = self.model_in(dtype)
        elif dtype != "float32":
            import torch

            model = model.to(getattr(torch, dtype))
        return model, how

    # ------------------------------------------------------------ impl
    def run_impl(self, rc: RefCapture, backend: Backend, dtype_weights: str) -> dict[str, np.ndarray]:
        """impl teacher-forced from ``rc``'s own layer inputs: ``{"L{i}.{probe}": [seqs, ...]}``."""
        out: dict[str, np.ndarray] = {}
        weights = self.weights_for(dtype_weights)
        for i, lc in enumerate(self.layer_cfgs):
            if isinstance(lc, NotInImpl):
                continue
            key = f"L{i}.layer_in"
            if key not in rc.probes:
                continue
            inputs = [rc.probes[key][s] for s in range(rc.probes[key].shape[0])]
            try:
                layer = load_layer(lc, weights[i], backend)
                with self._ggml_matmuls(rc, layer, i) as hits:
                    _, traces, _ = run_layer(layer, inputs, self.case.kv, self.case.schedule,
                                             page_size=self.case.page_size, seed=self.case.seed)
                self._note_ggml(rc, layer, i, hits)
                per_seq = [t.assemble() for t in traces]
            except Exception as e:  # the candidate crashed: an error row for this layer, the run goes on
                out[f"L{i}.__error__"] = f"impl raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"
                continue
            for probe in per_seq[0]:
                out[f"L{i}.{probe}"] = np.stack([p[probe] for p in per_seq])
        return out

    def _act_types(self, i: int) -> dict[str, str]:
        from .refs.ggml_matmul import layer_act_types

        cache_ = self.__dict__.setdefault("_act_types_by_layer", {})
        if i not in cache_:
            cache_[i] = layer_act_types(self.family, self.base_model, self.config, i, self.hf_types)
        return cache_[i]

    def _emulates(self, rc: RefCapture) -> bool:
        # quantized weights only: a float file's comparison keeps its float16 / bfloat16 policy
        return rc.name == "llamacpp" and bool(self.hf_types) and is_quantized(self.case.gguf_type)

    def _ggml_matmuls(self, rc: RefCapture, layer, i: int):
        """Against llama.cpp on quantized weights: impl's projections see their
        inputs rounded as ggml's CPU quantizes activations (the oracle,
        harness/refs/ggml_matmul.py)."""
        import contextlib

        if not self._emulates(rc):
            return contextlib.nullcontext(set())
        from .refs.ggml_matmul import installed

        return installed(layer, self._act_types(i))

    def _note_ggml(self, rc: RefCapture, layer, i: int, hits: set) -> None:
        """Layer ``i``'s comparison dtype against llama.cpp on quantized weights:
        ``ggml_<act>`` where the oracle reproduced every quantized matmul impl
        made (its residue is float32 summation order), else the weight type's
        own (the activation rounding left in)."""
        if not self._emulates(rc):
            return
        acts = {n: t for n, t in self._act_types(i).items() if n in layer.w}
        cover = self.__dict__.setdefault("_ggml_dtype", {})
        if acts and set(acts) <= hits:
            from .refs.ggml_types import coarsest_activation

            cover[i] = "ggml_" + coarsest_activation(acts.values())
        else:
            cover[i] = self.weight_dtype

    # ------------------------------------------------------------ rows
    def rows(self) -> list[dict]:
        case = self.case
        self.progress(f"{case.case_id()}: capturing {', '.join(case.refs)}")
        backend = Backend(case.backend, case.device, case.dtype)
        try:
            backend.check_available()
        except ConfigError as e:
            return [self._row("impl", "-", None, "", "skipped", str(e))]
        caps = [self.capture(r) for r in case.refs]
        rows: list[dict] = []
        for rc in caps:
            if rc.error:
                rows.append(self._row("impl", rc.name, None, "", "error", f"reference {rc.name} failed: {rc.error}"))
                continue
            t = time.perf_counter()
            rows += self._compare_impl(rc, backend)
            self.timings[f"impl_vs_{rc.name}"] = time.perf_counter() - t
        good = [rc for rc in caps if not rc.error]
        if len(good) >= 2:
            rows += self._compare_refs(good[1], good[0])
        return rows

    def _compare_impl(self, rc: RefCapture, backend: Backend) -> list[dict]:
        case = self.case
        cdt = comparison_dtype(case.dtype, rc.dtype)
        if rc.name == "llamacpp":
            cdt = comparison_dtype(cdt, self.weight_dtype)
        low = backend.low_precision
        wdt = case.dtype if low and rc.name == "hf" else "float32"
        cand = self.run_impl(rc, backend, wdt)
        # The float64 oracle judges a low-precision candidate against a reference that
        # ALSO computed in low precision (HF at bf16): both are measured against it.
        # Against a float32 reference (llama.cpp) the reference is the better estimate
        # of the truth, so the candidate is judged directly, at its dtype's tolerance.
        oracle = self.run_impl(rc, Backend("numpy", "cpu", "float64"), wdt) if low and rc.dtype in (
            "float16", "bfloat16") else None
        rows = []
        ggml_dtype = self.__dict__.get("_ggml_dtype", {}) if rc.name == "llamacpp" else {}
        for i, lc in enumerate(self.layer_cfgs):
            if isinstance(lc, NotInImpl):
                rows.append(self._row("impl", rc.name, i, "*", "not-implemented",
                                      f"not implemented in impl: {lc.kind} ({lc.reason})", layer_kind=lc.kind))
                continue
            if f"L{i}.layer_in" not in rc.probes:
                rows.append(self._row("impl", rc.name, i, "layer_in", "not-exposed",
                                      f"{rc.name} does not expose this layer's input; the layer cannot be teacher-forced"))
                continue
            if f"L{i}.__error__" in cand:
                rows.append(self._row("impl", rc.name, i, "*", "error", cand[f"L{i}.__error__"]))
                continue
            for probe in LAYER_PROBES:
                key = f"L{i}.{probe}"
                if key not in cand or probe == "layer_in":
                    continue
                if key not in rc.probes:
                    rows.append(self._row("impl", rc.name, i, probe, "not-exposed",
                                          f"{rc.name} does not expose {probe} for {self.family.name}"))
                    continue
                orc = None if oracle is None or f"L{i}.__error__" in oracle else oracle.get(key)
                ldt = comparison_dtype(comparison_dtype(case.dtype, rc.dtype), ggml_dtype[i]) if i in ggml_dtype else cdt
                rows.append(self._judge("impl", rc.name, i, probe, cand[key], rc.probes[key], ldt, orc))
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
        tol, why = self.policy.tolerance(cdt, probe, self.family.name, ref_name)
        extra = {}
        if oracle is not None and cdt in ("float16", "bfloat16"):
            cm, rm = metrics(a, oracle, probe), metrics(b, oracle, probe)
            status, reason = judge_against_oracle(cm, rm, tol)
            extra = {"nmse_cand_oracle": cm["nmse"], "nmse_ref_oracle": rm["nmse"],
                     "err_ratio": _over(cm["nmse"], tol["ratio"] * max(rm["nmse"], tol["nmse_floor"]))}
        else:
            status, reason = judge(m, tol)
            extra = {"err_ratio": max(_over(m["nmse"], tol["nmse"]), _over(m["max_abs"], tol["atol"]))}
        if status == "fail":
            lc = self.layer_cfgs[layer] if layer is not None else None
            known = self.policy.finding(self.family.name, cand_name, ref_name, probe, _layer_kind(lc), self.features,
                                        dict(self.case.overrides), layer=layer, nmse=m["nmse"], dtype=cdt)
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
    t = time.perf_counter()
    rows = run.rows()
    run.timings["total"] = time.perf_counter() - t
    return rows, {"case": run.case.to_dict(), "case_id": run.case.case_id(), "features": run.features,
                  "timings": run.timings, "family": run.family.name, **run.meta_extra()}
