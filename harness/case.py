"""One conformance case, end to end (DESIGN.md "One case, as data flows"), in
stages -- each its own module under harness/pipeline, each reading a narrow
part of the case:

1. build (``pipeline/build.py``): the family builds a tiny HF model with seeded
   weights (or a local checkpoint / GGUF is loaded) -- the single source of
   weights for everyone -- and everything derived from it;
2. capture (``pipeline/capture.py``): each reference, from a frozen
   ``CaptureRequest`` (cached, content-addressed);
3. oracle (``pipeline/oracle.py``): the float64 run a low-precision comparison
   is judged through;
4. judge (``pipeline/judge.py``): the candidate runs teacher-forced (every layer
   fed THAT reference's own input to the layer, so each layer is judged on its
   own) and every probe is compared with the reference's; references are
   compared with each other;
5. verdict (``verdict.py``): a pass must mean a check.

``CaseRun`` is the case's Build plus the orchestration of the later stages.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path
import inspect
from concurrent.futures import ThreadPoolExecutor

from impl import Backend
from impl.config import ConfigError
from impl.kv import KV_MODES

from . import cache, families, references, verdict
from .errors import UsageError, suggest
from .ggml_types import GGUF_TYPES  # f32 / f16 / bf16 exports, llama_model_quantize's types
from .pipeline import capture as capture_stage
from .pipeline import oracle as oracle_stage
from .pipeline.build import Build
from .pipeline.judge import CandidateFeed, Judge, JudgeRequest
from .policy import Policy
from .references import RefCapture  # noqa: F401 (re-exported: harness.case.RefCapture)
from .schedule import SCHEDULES, chunk_sizes, plan_of
from .select import parse_layers, parse_probes
from .config_values import check_values
from .families.base import WEIGHT_KINDS
from . import candidates
from .pipeline.gguf.weights import check_weight_type
from .config_values import check_overrides
from .candidates import CandidateCapture, LayerCandidate
from .warm import Miss
from .candidates.api import kv_source_limit
from . import budget

STATUSES = verdict.STATUSES


@dataclass(frozen=True)
class Case:
    family: str
    ref: str = "hf"  # a reference's name (harness/references), several comma-separated, or "all"
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
    # the seeded model's weights: "random" (O(1) activations), "realistic" (a trained
    # model's statistics: outlier channels, scores that span tens; Family.realistic_weights)
    # or "trained" (realistic, and recurrent decays with long memory; Family.trained_apply)
    weights: str = "random"
    # the sequences of a batched / paged case differ in length, first-call size and
    # arrival (continuous batching, drawn from the seed: harness/schedule.py ragged_plan)
    ragged: bool = False

    @property
    def refs(self) -> list[str]:
        if self.ref == "all":
            return list(references.all_names())
        # "hf,hf_cached": these references, each judged with the others (registry order)
        return [r for r in references.names() if r in self.ref.split(",")] if "," in self.ref else [self.ref]

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
        if self.weights != "random":
            parts.append(f"weights={self.weights}")
        if self.ragged:
            parts.append("ragged")
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
        choices = (*references.names(), "all")
        for r in self.ref.split(",") if "," in self.ref else [self.ref]:
            if r not in choices or ("," in self.ref and r == "all"):
                raise UsageError(f"unknown reference {r!r}; {suggest(r, choices)} (or several, comma-separated)")
        if self.kv not in KV_MODES:
            raise UsageError(f"unknown kv mode {self.kv!r}; {suggest(self.kv, KV_MODES)}")
        if self.gguf is None and self.gguf_type not in GGUF_TYPES:
            raise UsageError(f"unknown GGUF weight type {self.gguf_type!r}; {suggest(self.gguf_type, GGUF_TYPES)}")
        if self.gguf is None:
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

        if self.overrides and self.gguf is None:
            check_overrides(families.get(self.family), self.overrides)  # unknown keys, wrong types: no HF import
        check_values(self.overrides)  # values every side would turn into NaN, before any config is built
        parse_probes(self.probes)

        if self.weights not in WEIGHT_KINDS:
            raise UsageError(f"unknown weights {self.weights!r}; {suggest(self.weights, WEIGHT_KINDS)}")
        if self.weights != "random" and (self.gguf or self.hf_model):
            raise UsageError("--weights applies to the seeded model; a --gguf / --hf-model file has its own weights")
        if not isinstance(self.evict, bool):
            raise UsageError(f"kv eviction is true or false, got {self.evict!r}")
        if self.evict and self.kv == "paged":
            raise UsageError("--kv-evict applies to the contiguous KV backings (decode, batched); the paged pool "
                             "keeps its pages (spec evict_layer_kv is in the contiguous arm)")
        if not isinstance(self.ragged, bool):
            raise UsageError(f"ragged is true or false, got {self.ragged!r}")
        try:
            Backend(self.backend, self.device, self.dtype)
            chunk_sizes(self.schedule, self.tokens)
            plan_of(self)
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

        candidates.get(self.candidate).validate(self)


class CaseRun(Build):
    """One case's stages: the model stage (``Build``, whose public face the
    references and candidates see) and the orchestration of capture, oracle,
    judge and verdict; rows come out of ``rows()``."""

    def __init__(self, case: Case, policy: Policy, progress=None, warm: bool = False):
        """``warm``: take the case's record where there is one (harness/warm.py), and
        write it after a cold run that can be recorded."""
        super().__init__(case, warm=warm)
        self.policy = policy
        self.progress = _progress(progress)
        self.derived: dict[tuple[str, str], str] = {}  # (reference, probe key) -> how it was derived

    @cached_property
    def candidate(self):
        """The engine judged (harness/candidates; impl by default)."""
        return candidates.get(self.case.candidate)

    def capture(self, ref: str) -> RefCapture:
        """Reference ``ref``'s capture of this case (the capture stage)."""
        return capture_stage.capture(self, ref, self.derived)

    def oracle_for(self, rc: RefCapture) -> RefCapture | None:
        """The float64 oracle the candidate is judged through against ``rc`` (the oracle stage)."""
        return oracle_stage.oracle_for(self, rc, self.candidate.teacher_forced)

    def judge_request(self) -> JudgeRequest:
        cand = self.candidate
        return JudgeRequest(case=self.case, family=self.family.name, config=self.config,
                            layer_cfgs=tuple(self.layer_cfgs), policy=self.policy, selection=self.selection,
                            features=tuple(self.features), variant=self.variant, candidate=cand.name,
                            teacher_forced=cand.teacher_forced, weight_dtype=self.weight_dtype,
                            plan_notes=tuple(self.plan.notes), derived=dict(self.derived),
                            lengths=self.batch_plan.lengths if self.batch_plan.ragged else None,
                            chunks=tuple(tuple(c) for c in self.batch_plan.chunks))

    def feed(self) -> CandidateFeed:
        """How the candidate's probes reach the judge: a candidate that computes one
        layer at a time is run and compared layer by layer (a real-size run holds one
        layer beyond the weights); any other captures once per reference."""

        cand = self.candidate
        if isinstance(cand, LayerCandidate):
            return CandidateFeed(whole=lambda rc: CandidateCapture(cand.name, cand.dtype(self)),
                                 layer=lambda rc, i: cand.capture_layer(self, rc, i), by_layer=True)
        return CandidateFeed(whole=lambda rc: cand.capture(self, rc))

    def _reporting(self, feed: CandidateFeed) -> CandidateFeed:
        """``feed`` with each layer it runs said to ``progress`` (judging layer i of n)."""
        if not feed.by_layer:
            return feed
        n = len(self.layer_cfgs)

        def layer(rc, i):
            self.progress(f"judging {self.candidate.name} vs {rc.name}: layer {i + 1} of {n}", i, n)
            return feed.layer(rc, i)

        return CandidateFeed(whole=feed.whole, layer=layer, by_layer=True)

    def _capture_all(self, refs: list[str]) -> list[RefCapture]:
        """Every reference's capture, in ``refs`` order. A reference that computes in a
        process of its own (``Reference.runs_apart``: llama.cpp's worker) is captured
        in a thread beside the others where the memory plan holds both at once
        (``Plan.overlap``): its worker's seconds then pass while HF computes here
        (a 135M-class file: 3 s of a 23 s run). What each capture holds is the same."""

        apart = [r for r in refs if references.get(r).runs_apart] if len(refs) > 1 and self.plan.overlap else []
        if apart and self.record is None:
            # what the thread reads of this Build is made here first (never by two threads at once)
            self.progress("building the model and its GGUF")
            _ = self.request()
            try:
                _ = self.gguf_path
            except RuntimeError:
                pass  # no file: the capture itself says why (an error row)
        got: dict = {}
        for r in refs:
            references.get(r).resume()
        # a pool thread, joined on the way out -- not a daemon: one left running torch or
        # llama.cpp code while the interpreter finalises ended the process by SIGABRT
        # ("terminate called without an active exception") or SIGINT instead of exit 130.
        # On Ctrl-C (or SIGTERM in a matrix worker) the reference is aborted, so the join is
        # short: its worker is killed, or never started if the thread had not got there yet
        with ThreadPoolExecutor(max_workers=1) as pool:
            futures = {r: pool.submit(self.capture, r) for r in apart}
            try:
                for r in refs:
                    self.progress(f"capturing {r}")
                    if r not in futures:
                        got[r] = self.capture(r)
                for r, fut in futures.items():
                    got[r] = fut.result()  # an exception of the capture stage (UsageError) is raised here
            except (KeyboardInterrupt, SystemExit):
                pool.shutdown(wait=False, cancel_futures=True)
                for r in futures:
                    references.get(r).abort()
                raise
        return [got[r] for r in refs]

    # ------------------------------------------------------------ rows
    def rows(self) -> list[dict]:
        """The case's rows: from its record where the run has one (harness/warm.py),
        the cold way where the record lacks something (it then writes a new one)."""

        if self.record is not None:
            try:
                return self._rows()
            except Miss:
                self.go_cold()

                budget.check(self)  # the checks the warm path left to the record
        rows = self._rows()
        self.write_record()
        return rows

    def _rows(self) -> list[dict]:
        case = self.case
        cand = self.candidate
        name = cand.name
        backend = Backend(case.backend, case.device, case.dtype)
        try:
            backend.check_available()
        except ConfigError as e:
            return [Judge(self.judge_request()).row(name, "-", None, "", "skipped", str(e))]
        why = cand.unsupported(self)
        if not why and case.ragged and not cand.ragged:
            why = (f"candidate {name} runs one chunk plan for every sequence (LayerCall.chunks); a ragged case's "
                   "sequences differ in length, first call and arrival (LayerCall.steps: docs/how-to/add-a-candidate.md)")
        if not why and not cand.reads_kv_source and cand.teacher_forced:
            why = kv_source_limit(cand, self.layer_cfgs)
        if why:  # a limit of the engine, said in the row: nothing compared, never a pass
            return [Judge(self.judge_request()).row(name, "-", None, "*", "skipped", why)]
        _ = self.plan  # decided before any capture: a case that cannot fit is refused here
        refused = self.schedule_refusals  # several references: one that cannot run the schedule sits out
        lacking = self.reference_refusals  # ... and one that does not implement the family at all
        caps = self._capture_all([r for r in case.refs if r not in refused and r not in lacking])
        judge = Judge(self.judge_request())
        feed = self._reporting(self.feed())
        # nothing compared, never a pass; the other references judge the case (verdict.guard)
        rows: list[dict] = [judge.row(name, r, None, "*", "skipped", f"reference {r} cannot run schedule "
                                      f"{case.schedule}: {why}") for r, why in refused.items()]
        rows += [judge.row(name, r, None, "*", "not-implemented", f"reference {r}: {why}")
                 for r, why in lacking.items() if r not in refused]
        for rc in caps:
            if rc.error and rc.meta.get("not_implemented"):
                rows.append(judge.row(name, rc.name, None, "*", "not-implemented",
                                      f"reference {rc.name}: {rc.meta['not_implemented']}"))
                continue
            if rc.error:
                rows.append(judge.row(name, rc.name, None, "", "error", f"reference {rc.name} failed: {rc.error}",
                                      detail=rc.meta.get("traceback", "")))
                continue
            self.progress(f"judging {name} vs {rc.name} (the float64 oracle first, where it runs)")
            oracle = self.oracle_for(rc)
            t = time.perf_counter()
            if oracle is not None and oracle.error:
                rows.append(judge.row(name, rc.name, None, "", "error",
                                      f"the float64 oracle of {rc.name} failed: {oracle.error}",
                                      detail=oracle.meta.get("traceback", "")))
                continue
            # a float64 candidate against a float32 reference: also within that reference's own rounding
            rounding = oracle_stage.rounding_for(self, rc, cand.teacher_forced) if oracle is None else None
            if rounding is not None and rounding.error:
                rows.append(judge.row(name, rc.name, None, "", "error",
                                      f"the float64 run measuring {rc.name}'s rounding failed: {rounding.error}",
                                      detail=rounding.meta.get("traceback", "")))
                continue
            # a half-precision candidate against llama.cpp's float32: sized by HF in that dtype there
            # (and a float64 run on its own inputs and weights: whether HF computes its model there)
            sizer = oracle_stage.dtype_sizer(self, rc, cand.teacher_forced) if rounding is not None else None
            guard = oracle_stage.model_guard(self, rc, cand.teacher_forced) if sizer is not None else None
            bad = next(((what, x) for what, x in ((f"{self.case.dtype} run sizing {name}", sizer),
                                                   (f"float64 run of {rc.name}'s model", guard))
                        if x is not None and x.error), None)
            if bad is not None:
                rows.append(judge.row(name, rc.name, None, "", "error",
                                      f"the {bad[0]} on {rc.name}'s inputs failed: {bad[1].error}",
                                      detail=bad[1].meta.get("traceback", "")))
                continue
            rows += judge.compare_candidate(rc, feed, oracle, rounding, sizer, guard)
            self.timings[f"{name}_vs_{rc.name}"] = time.perf_counter() - t
        self.timings.update(judge.timings)
        self.notes += [n for n in judge.notes if n not in self.notes]
        good = [rc for rc in caps if not rc.error]
        t = time.perf_counter()
        for i, ref in enumerate(good):  # each reference with every other: the later judged against the earlier
            for later in good[i + 1:]:
                # quantized weights: the file's reference against the oracle one, bounded by the
                # drift ggml's activation rounding makes in the oracle reference itself (oracle.drift)
                # two float32 paths of one model where the policy asks: the reference's own
                # float32 rounding, measured free-running against float64 (oracle.own_rounding)
                # a half-precision case: the half side's own rounding, the same way
                base = d = None
                if references.get(later.name).file_weights:
                    d = oracle_stage.drift(self, ref)
                elif references.get(ref.name).file_weights:
                    # a float reference after the file's (mlx after llama.cpp): the same drift,
                    # made from -- and measured against -- the oracle reference's float run
                    # (mlx reads HF's dequantized checkpoint: the two compute one model)
                    base = next((c for c in good if references.get(c.name) is references.oracle_reference()), None)
                    d = None if base is None else oracle_stage.drift(self, base)
                if d is None:
                    d, base = oracle_stage.own_rounding(self, later, ref, good)
                rows += judge.compare_refs(later, ref, drift=d, drift_base=base if d is not None else None)
        if len(good) >= 2:
            self.timings["refs_compare"] = time.perf_counter() - t
        rows = judge.witnesses(rows)  # a witness beside the pair: whom it follows, measured here
        # a pass must mean the candidate was checked (harness/verdict.py): findings need a
        # guard, every implemented layer a passing attn_out against some reference
        return verdict.guard(rows, self.layer_cfgs, name,
                             lambda layer, probe, reason: judge.row(name, "-", layer, probe, "unguarded", reason),
                             fallback=None if cand.teacher_forced else "layer_out", layers=self.selection.layers)


def _progress(fn):
    """``fn`` as ``progress(message, done=None, total=None)`` (harness/progress.py
    ``Phases``); a callback of one argument is given the message alone."""

    if fn is None:
        return lambda message, done=None, total=None: None
    try:
        inspect.signature(fn).bind("", 0, 0)
        return fn
    except (TypeError, ValueError):
        return lambda message, done=None, total=None: fn(message)


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
