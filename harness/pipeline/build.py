"""The model stage of a case: everything every side takes from the case --
the config, the layer descriptions, the seeded (or loaded) model and its
weights, the GGUF llama.cpp runs, the token ids, the selection and the memory
plan -- computed once, when first asked, and shared.

``Build`` is the public face the other stages and every plug-in see
(references get a frozen ``CaptureRequest`` made from it; candidates get the
Build itself, as ``run``): nothing outside reads it by a private name. The
candidate's own lazy state lives in ``memo(key, make)``, never in the object's
``__dict__``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import cached_property
from pathlib import Path
import copy

import numpy as np

from impl.config import ConfigError

from .. import budget, families, kinds, references
from ..checkpoint import checkpoint_stamp
from ..errors import UsageError, suggest
from ..features import model_features
from ..ggml_types import is_quantized
from ..references import CaptureRequest, RefCapture
from ..select import Selection
from harness.lazy import lazy
from .gguf import stream as streaming
from .gguf import reader as gguf_import
from .. import candidates, warm
from ..warm import Miss
from ..checkpoint import load_config
from .gguf.weights import dequantized_model, export_for_case
from ..ggml_types import activation_dtype
from .gguf.weights import file_tensors
from ..checkpoint import load_model
from .gguf.export import BYTE_VOCAB_MIN
from ..schedule import chunk_sizes, plan_of
from .gguf.weights import transformers_reference
from ..references.llamacpp.ggml_matmul import layer_act_types
from ..ggml_types import coarsest_activation

torch = lazy("torch")


class Build:
    """The model stage of ``case`` (a frozen ``harness.case.Case``); ``case`` is
    replaced where the input decides it (a ``--gguf`` file's family and weight
    type, a ``--prompt``'s length)."""

    def __init__(self, case, warm: bool = False):
        self.case = case
        self.timings: dict[str, float] = {}
        self.derived: dict[tuple[str, str], str] = {}  # (reference, probe key) -> how it was derived
        self.switched: dict[str, int] = {}  # switch_off tag -> tensors / modules it changed
        self.source = None  # set for --gguf / --hf-model
        self.notes: list[str] = []  # what a candidate says about how it was judged (printed, in meta.json)
        self._memo: dict = {}
        self.hf_types: dict = {}  # quantized weights: HF tensor -> the GGUF types it came from
        if case.gguf:
            t = time.perf_counter()
            self.source = gguf_import.load(case.gguf, case.family or None, stream=_stream_wanted)
            self.hf_types = self.source.hf_types
            self.timings["gguf_import"] = time.perf_counter() - t
            self.family = self.source.family
            # the file decides the family and the weight type the case is judged at
            self.case = case = replace(case, family=self.family.name, gguf_type=self.source.weight_type,
                                       variant=self.source.variant)
        else:
            self.family = families.get(case.family)
        self.variant = case.variant or (self.family.variants[0] if self.family.variants else None)
        # the warm path (harness/warm.py): a record of this case's model stage, served
        # instead of building the config and the model; or the recorder of a cold run
        self.record = self.recorder = None
        if warm:
            self._warm_up()

    def _warm_up(self) -> None:
        if not warm.eligible(self.case, candidates.get(self.case.candidate)):
            return
        k = warm.key(self.case, self.family, references.names())
        self.record = warm.load(k)
        if self.record is None:
            self.recorder = warm.Recorder(k)
            return
        self.__dict__["config"] = self.record.config
        self.__dict__["raw_layer_cfgs"] = self.__dict__["layer_cfgs"] = list(self.record.layer_cfgs)
        self.__dict__["tokens"] = self.record.tokens.copy()

    def go_cold(self) -> None:
        """Forget the record and everything made from it: the case runs the cold way
        (a capture the record does not hold, harness/warm.py ``Miss``)."""

        for cls in type(self).__mro__:
            for name, attr in vars(cls).items():
                if isinstance(attr, cached_property) and name != "candidate":
                    self.__dict__.pop(name, None)
        self.record = None
        self.recorder = warm.Recorder(warm.key(self.case, self.family, references.names()))
        self._memo.clear()
        self.timings.clear()
        self.derived.clear()
        self.notes.clear()

    def write_record(self) -> None:
        """After a cold run of an eligible case: its record (harness/warm.py)."""
        if self.recorder is None or not self.recorder.ok:
            return
        counts = budget.param_counts(self.family, self.config)
        self.recorder.write(self.config, counts, self.layer_cfgs, self.tokens)

    def capture_ref(self, ref, **kw) -> RefCapture:
        """Reference ``ref``'s capture of this case with ``kw`` (``Reference.capture``'s
        arguments): the recorded one on the warm path; else made from ``request()``
        (and recorded where the run is recorded)."""
        if self.record is not None:
            return self.record.capture(ref.name, kw)
        try:
            rc = ref.capture(self.request(), **kw)
        except BaseException:
            if self.recorder is not None:
                self.recorder.ok = False
            raise
        finally:
            if self.streamed is not None:  # a model read layer by layer holds nothing between captures
                self.streamed.release_all()
        if self.recorder is not None:
            self.recorder.capture(ref.name, kw, rc)
        return rc

    def _cold_only(self, what: str) -> None:
        if self.record is not None:
            raise Miss(what)

    def memo(self, key: str, make):
        """``make()`` once per case under ``key`` (a candidate's free run that serves
        every reference, a model copy in another dtype)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def adopt_model(self, other: "Build") -> None:
        """Take ``other``'s config and layer descriptions (a case of the same family,
        variant and overrides: the same model), so they are built once."""
        self.__dict__["config"] = other.config
        self.__dict__["layer_cfgs"] = other.layer_cfgs

    def request(self) -> CaptureRequest:
        """What a reference is given to capture this case (harness/references)."""
        self._cold_only("a capture request")
        return self.memo("request", lambda: CaptureRequest(
            case=self.case, family=self.family, config=self.config, layer_cfgs=tuple(self.layer_cfgs),
            tokens=self.tokens, selection=self.selection, variant=self.variant, hf_dtype=self.plan.hf_dtype,
            weights_stamp=tuple(self.weights_stamp()), checkpoint_stamp=checkpoint_stamp(self.case.hf_model),
            user_file=self.source is not None, gguf=lambda: self.gguf_path, model=self.hf_model,
            timings=self.timings, family_base_sources=tuple(families.base_sources()), batch_plan=self.batch_plan,
            float64_keep=self.float64_keep))

    @property
    def streamed(self):
        """The user's file read one layer at a time (gguf/stream.py ``Streamed``), or None."""
        return getattr(self.source, "stream", None)

    @property
    def float64_keep(self) -> int:
        """What HF's float64 cached run may keep of its widened weights between calls: the
        memory plan counts a dequantized float32 copy of the model for quantized weights
        (budget.estimate "dequantized copy") that a user's GGUF never makes -- its model
        IS the dequantized one (gguf/reader.py) -- so copies up to that size stay inside
        the peak the plan already allowed; 0 elsewhere (widened again each call)."""
        if self.source is None or not is_quantized(self.case.gguf_type):
            return 0
        return int(self.plan.estimate.parts.get("dequantized copy", 0))

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
        seeing = [r for r in references.registry().values() if r.sees_modules]
        if hf_only and any(not references.get(r).sees_modules for r in self.case.refs):
            names = " or ".join(f"--ref {r.name}" for r in seeing) or "a reference that runs the model's modules"
            raise UsageError(f"switch_off {', '.join(hf_only)} replaces model modules, which only "
                             f"{' or '.join(r.label for r in seeing) or 'such a reference'} sees; use {names}")
        return [known[t] for t in self.case.switch_off]

    @cached_property
    def layer_cfgs(self):
        lcs = self.raw_layer_cfgs
        for sw in self.switches:
            if sw.layer is not None:
                lcs = [sw.layer(lc) for lc in lcs]
        reader = next((i for i, lc in enumerate(lcs) if getattr(lc, "kv_source", None) is not None), None)
        if self.case.evict and reader is not None:
            # impl/runner.py _check_source refuses it mid-run (the source evicts after its own
            # read rows its reader still needs): bad input here, before any capture, so a run
            # says it in one line and the fuzzer discards the draw instead of an error row
            raise UsageError(f"--kv-evict with KV shared across layers (family {self.family.name}: layer {reader} "
                             f"reads layer {lcs[reader].kv_source}'s K/V): the source would evict rows its reader "
                             f"still needs; valid: without --kv-evict")
        return lcs

    @cached_property
    def base_model(self):
        """The float32 model every reference and impl take their weights from: with
        a quantized ``gguf_type``, the weights of the quantized file llama.cpp runs,
        dequantized (harness/pipeline/gguf/weights.py) -- every side computes with the
        same numbers."""
        m = self.float_model
        if self.source is None and self.family.gguf_arch and is_quantized(self.case.gguf_type):
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
        self._cold_only("the GGUF")
        if not self.family.gguf_arch:
            raise RuntimeError(f"family {self.family.name} has no GGUF export (llama.cpp arch unknown)")

        # --hf-model: the checkpoint's files shape the GGUF as much as its config does
        stamp = [self.case.hf_model, checkpoint_stamp(self.case.hf_model)] if self.case.hf_model else None
        if self.case.switch_off:  # weights neutralised in the seeded model (Family.model_switches)
            stamp = [stamp, ["switch_off", list(self.case.switch_off)]]
        if self.case.weights != "random":  # a trained model's statistics (Family.realistic_weights)
            stamp = [stamp, ["weights", self.case.weights]]
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
        them (vec_dot_type, harness/ggml_types.py), the coarsest over the
        file's quantized tensors."""
        if not is_quantized(self.case.gguf_type):
            return self.case.gguf_type

        try:
            types = self.source.tensor_types if self.source is not None else file_tensors(self.gguf_path)[1]
        except RuntimeError:  # no file: llama.cpp is an error row, nothing is compared with it
            return "float32"
        return activation_dtype(types.values()) or "float32"

    @cached_property
    def float_model(self):
        """The model as built: the family's seeded one, a checkpoint, or the
        user's GGUF read back (its weights already those llama.cpp runs)."""
        self._cold_only("the model")
        if self.source is not None:  # --gguf: the HF model gguf_import rebuilt from the file
            return self.source.model
        t = time.perf_counter()
        if self.case.hf_model:
            m = load_model(self.case.hf_model, self.family, self.config)
        else:
            m = self.family.build_model(self.config, self.case.seed, "float32", weights=self.case.weights)
        # what each switch changed (0: nothing there to switch, e.g. a config switch
        # of the same case already removed it); feature bisection reads it
        self.switched = {tag: sw.edit(m, self.config, self.raw_layer_cfgs)
                         for tag, sw in zip(self.case.switch_off, self.switches)}
        self.timings["build_model"] = time.perf_counter() - t
        return m

    def model_in(self, dtype: str):
        """The model with its weights held in ``dtype``: the float32 base model (also
        for float64, which HF computes module by module on it: references/hf/float64.py
        ``promoted``), or ONE copy in bfloat16 / float16 made once per case."""

        if dtype in ("float32", "float64"):
            return self.base_model
        return self.memo(f"model_{dtype}", lambda: copy.deepcopy(self.base_model).to(getattr(torch, dtype)))

    @cached_property
    def selection(self) -> Selection:
        """The layers and probes this case captures and compares (``--layers``, ``--probes``)."""
        return Selection.of(self.case.layers, self.case.probes, len(self.layer_cfgs))

    @cached_property
    def plan(self) -> budget.Plan:
        """What this case runs within the memory it has (harness/budget.py), decided
        from the config before any work: a refusal is a UsageError (exit 2)."""
        c = self.case
        src = self.source
        return budget.plan(self.family, self.config, self.layer_cfgs, tokens=c.tokens, seqs=c.n_seqs, dtype=c.dtype,
                           refs=c.refs, selection=self.selection, gguf_type=c.gguf_type,
                           file_bytes=Path(src.path).stat().st_size if src is not None else None,
                           streamed=self.streamed is not None)

    def check_prompt(self):
        """A ``--prompt`` that cannot be tokenized is refused from the config alone, before
        the model or its GGUF is built (issue 41: 7.5 s of work, then the refusal); the
        reference that tokenizes it, or None without a prompt."""
        if self.case.prompt is None:
            return None
        if self.source is None:  # the export's seeded vocabulary (harness/pipeline/gguf/export.py tiny_vocab)

            if int(self.config.vocab_size) < BYTE_VOCAB_MIN:  # before any export or capture
                raise UsageError(
                    f"--prompt needs a tokenizer: the GGUF written for family {self.family.name} holds a seeded "
                    f"{self.config.vocab_size}-token vocabulary of no text; give --gguf FILE (the file's own "
                    f"tokenizer), or --set vocab_size={BYTE_VOCAB_MIN} or more for the seeded byte vocabulary")
        tok = next((r for r in references.registry().values() if r.file_weights), None)
        if tok is None:
            raise UsageError("--prompt needs a reference that reads the GGUF's vocabulary (llama.cpp); none is installed")
        return tok

    @cached_property
    def tokens(self) -> np.ndarray:
        """The token ids ``[seqs, tokens]``: seeded random ids, or ``--prompt``
        tokenized with the GGUF's own vocabulary (the user's file, or the export)
        by llama.cpp -- the same ids for every sequence and every side."""
        if self.case.prompt is not None:
            tok = self.check_prompt()
            try:
                ids = tok.tokenize(self.gguf_path, self.case.prompt)
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

    @cached_property
    def reference_refusals(self) -> dict[str, str]:
        """The case's references that do not implement its family or config at all
        (``Reference.refusal``: mlx-lm without a module for the model type), each with why."""
        out = {}
        for ref in self.case.refs:
            why = references.get(ref).refusal(self.family, self.config)
            if why:
                out[ref] = why
        return out

    @cached_property
    def schedule_refusals(self) -> dict[str, str]:
        """The case's references that cannot run its schedule, each with why
        (``Reference.schedule_refusal``: a crash their source predicts, as the family declares it), decided from the
        config before any work. A ``--prompt`` sets the length later, but only on the
        named schedules, whose shape (one call; one row per call; one call then one row
        per call) does not depend on it."""

        chunks = tuple(chunk_sizes(self.case.schedule, self.case.tokens))
        out = {}
        for ref in self.case.refs:
            why = references.get(ref).schedule_refusal(self.family, self.config, chunks)
            if why:
                out[ref] = why
        return out

    @cached_property
    def batch_plan(self):
        """Each sequence's rows, rows per call and arrival (harness/schedule.py): the
        plan every side runs -- impl through ``LayerCall.steps``, llama.cpp's decode
        calls -- after the token ids (a ``--prompt`` decides the length)."""

        return plan_of(self.case, int(self.tokens.shape[1]))

    def layer_weights_for(self, dtype: str, i: int) -> dict:
        """impl's weights of layer ``i``, as the reference computing in ``dtype`` holds
        them -- made when asked and not kept: at real sizes all layers' weights in
        float64 would be a second model."""
        lc = self.layer_cfgs[i]
        if not kinds.implemented(lc):
            return {}
        held = dtype if dtype in ("float16", "bfloat16") else "float32"
        if self.record is not None:
            return self.record.layer_weights(held, i)
        if self.source is not None:
            w = self.source.layer_weights[i]
        else:
            w = self.family.layer_weights(self.model_in(held), self.config, i)
        # a named variant may store the same function in other weights (llama's
        # wo_scale: wo / s, with s as the {1} companion)
        w = self.family.variant_weights(w, self.config, i, self.variant)
        if self.recorder is not None and self.recorder.ok:
            self.recorder.add_weights(held, i, w, budget.param_counts(self.family, self.config).total)
        return w

    def weights_for(self, dtype: str) -> list[dict]:
        """Every layer's ``layer_weights_for`` (small models; a real-size run takes them one layer at a time)."""
        return [self.layer_weights_for(dtype, i) for i in range(len(self.layer_cfgs))]

    @cached_property
    def features(self) -> list[str]:
        # one layer's weights at a time (their names decide the features)
        # (a file's: the weights' names, made once per layer description: gguf/reader.py
        # LayerWeights.names -- the variants keep the names, Family.variant_weights)
        per_layer = (self.source.layer_weights.names(i) if self.source is not None and self.record is None
                     else self.layer_weights_for("float32", i) for i in range(len(self.layer_cfgs)))
        f = model_features(self.layer_cfgs, per_layer)
        f |= set(self.family.declared_features)
        f.add(f"kv_{self.case.kv}")
        if self.case.ragged:
            f.add("kv_ragged")
        if self.case.evict:
            f.add("kv_evict")
        return sorted(f)

    def weights_stamp(self) -> list:
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
    def gguf_hf(self):
        """``(model, how)`` of transformers' own GGUF loader on the user's file
        (``(None, why not)`` where it does not read the arch); built once."""

        return transformers_reference(self.source)

    def hf_model(self, weights: str):
        """The HF reference model with its weights held in ``weights`` (as
        ``model_in``: float32 also for float64, which HF computes module by module
        on it) and, for a GGUF, how its weights were built (the caller copies
        before changing it)."""
        if self.source is None:
            return self.model_in(weights), None
        model, how = self.gguf_hf
        if model is None:
            return self.model_in(weights), how
        if weights not in ("float32", "float64"):
            # ONE copy per case, as model_in makes
            model = self.memo(f"gguf_hf_{weights}", lambda: copy.deepcopy(model).to(getattr(torch, weights)))
        return model, how

    def weights_dtype(self, rc: RefCapture) -> str:
        """The weights a teacher-forced candidate computes with against ``rc``: as
        the reference holds them (a reference that computes in the case's precision,
        HF, rounds its weights too), else float32 (llama.cpp's float32 graph)."""
        low = self.case.dtype in ("float16", "bfloat16")
        return self.case.dtype if low and references.get(rc.name).graph_dtype is None else "float32"

    # ------------------------------------------------------------ ggml's activation rounding
    def emulates(self, rc: RefCapture) -> bool:
        """Whether a candidate may reproduce ``rc``'s activation rounding: a reference
        that computes with the file's quantized weights (llama.cpp). Quantized weights
        only: a float file's comparison keeps its float16 / bfloat16 policy."""
        return (references.get(rc.name).file_weights and bool(self.hf_types)
                and is_quantized(self.case.gguf_type))

    def ggml_act_types(self, rc: RefCapture, i: int) -> dict[str, str]:
        """Against llama.cpp on quantized weights: layer ``i``'s impl weight name ->
        the type ggml's CPU quantizes the activations multiplied by it to
        (harness/references/llamacpp/ggml_matmul.py), which a candidate may reproduce
        (``LayerCall.ggml_act``); else empty."""
        if not self.emulates(rc):
            return {}

        by_layer = self.memo("act_types_by_layer", dict)
        if i not in by_layer:
            sources = self.memo("impl_weight_sources", dict)  # by layer description (ggml_matmul.py)
            # (it fills the layer's parameters with codes: a streamed file's layer is read for it)
            hold = (lambda: self.source.layer_weights.holding(i)) if self.streamed is not None else None
            by_layer[i] = layer_act_types(self.family, self.base_model, self.config, i, self.hf_types, sources,
                                          self.layer_cfgs[i], hold)
        return by_layer[i]

    def ggml_layer_dtype(self, rc: RefCapture, call) -> str | None:
        """A layer's comparison dtype against llama.cpp on quantized weights:
        ``ggml_<act>`` where the candidate reproduced ggml's activation rounding for
        every quantized matmul of the layer (``call.ggml_met``; what is left is
        float32 summation order), else the activation type's own (the rounding
        left in). None: not such a comparison."""
        if not self.emulates(rc):
            return None
        acts = {n: t for n, t in call.ggml_act.items() if n in call.weights}
        if acts and set(acts) <= call.ggml_met:
            return "ggml_" + coarsest_activation(acts.values())
        return self.weight_dtype


def _stream_wanted(family, config) -> bool:
    """Whether a GGUF file's model is read layer by layer (gguf/stream.py ``wanted``):
    where its float32 weights would not fit this run's memory budget."""

    return streaming.wanted(family, budget.param_counts(family, config).total, budget.available())
