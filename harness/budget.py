"""What a case needs before it runs -- positions the model has, memory the
machine has -- checked before any work, so an impossible case is one line and
exit status 2 instead of a crash (or a swap storm) halfway through (issue 16
item 4); and what the run does about memory (issue 13, "Memory that fits real
models").

``check`` is the one gate (the CLI's run and the matrix's spec check call it):
the position limit (``max_positions``), then the memory plan. One function
estimates memory (``estimate``); one decides (``plan``). The estimate
is a sum of parts, each named, so a refusal can say what is big:

- ``weights``: the model every reference and impl take their weights from,
  float32 (tied embeddings counted once), from the HF config on torch's meta
  device (no memory, every family's own parameter shapes); a bfloat16 /
  float16 case adds its copy in that type;
- ``float64 module``: HF in float64 (a float64 case's reference, the float64
  oracle of a lower-precision one) is computed module by module
  (references/hf/float64.py ``promoted``): its cost is the largest decoder layer,
  embedding or output head in float64, not the model;
- ``forward``: HF's activations of one layer in the compute type, the eager
  attention's ``heads x tokens x tokens`` scores, probabilities and their
  copy;
- ``logits``: ``seqs x tokens x vocab`` in HF's compute type (and in float64 for
  the oracle), twice under a final softcap (its temporary);
- ``layer probes``: what one layer's comparison holds (the probes are on
  disk, harness/store.py, and compared layer by layer): impl's probes of the
  layer in float64 plus the largest probe's metric temporaries, with
  ``attn_probs`` at ``heads x tokens x tokens``;
- ``llama.cpp``: its worker process, alive while the parent holds the
  weights: the GGUF (memory-mapped), its float32 KV cache and the compute
  buffer of its largest call.

The phases of a case run one after the other (build, GGUF export, each
capture, the comparisons), so the peak is the weights plus the largest phase.

The budget is ``CONFORMANCE_MEMORY_GB`` when set, else what the machine has
available now (``MemAvailable``). ``plan`` then decides, in this order:
everything as asked; without the float64 oracle (impl judged against HF
directly at the float32 bound scaled to the case, harness/scaling.py); for a
float64 case, HF computed in float32 (and judged so); or a refusal -- one line,
exit status 2, before any work -- naming the estimate, its largest parts and
what would make it fit (``--layers``, ``--probes``, fewer ``--tokens``).
Every fallback is said in the rows' reasons and in meta.json.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
import resource

from harness.ggml_types import is_quantized
from harness.lazy import lazy
from .errors import UsageError
from . import references, kinds
from harness.references.llamacpp import capture as llamacpp

torch = lazy("torch")
transformers = lazy("transformers")

GB = 2**30
# the config keys families name their position limit by, in the order they are read
POSITION_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions", "model_max_length", "seq_length")


def max_positions(config) -> tuple[str, int] | None:
    """``(key, limit)`` of the model's position limit, or None where the config has
    none (ALiBi bloom: its biases are defined for any length)."""
    for k in POSITION_KEYS:
        v = getattr(config, k, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k, v
    return None


def check(run) -> None:
    """Refuse (UsageError, exit 2) a case its model cannot hold or this machine
    cannot fit, before any work. ``run``: a ``CaseRun``; its ``plan`` (the memory
    decision, cached on the run) is made here."""

    case = run.case
    if getattr(run, "record", None) is not None:
        # the warm path (harness/warm.py): these checks passed on the cold run that wrote the
        # record, and its key holds everything they read (the case, the config, the code)
        _ = run.plan  # the memory plan is this machine's, made again
        return
    lim = max_positions(run.config)
    if lim and case.tokens > lim[1]:
        key, n = lim
        raise UsageError(f"--tokens {case.tokens} is past family {run.family.name}'s {key}={n}; use at most {n} "
                         f"tokens, or --set {key}=N")

    for ref in case.refs:  # a setting a reference's source asserts against (Reference.config_refusal)
        if getattr(run, "source", None) is not None and references.get(ref).file_weights:
            # a user's file (--gguf) IS what the reference that reads it runs: HF's model is its
            # reverse, the tensors that graph never reads dropped (_gguf_import.unused_tensors),
            # so a setting the export could not give it (falcon_h1's attention_bias: llama.cpp
            # drops attn_output.bias) is no refusal here -- and a crash of it is its error row
            continue
        why = references.get(ref).config_refusal(run.family, run.config)
        if why:
            raise UsageError(why)
    if len(case.refs) == 1:  # the one reference named does not implement the family (Reference.refusal)
        for ref, why in run.reference_refusals.items():
            raise UsageError(f"--ref {ref}: {why}; named beside others (--ref hf,{ref}) the case runs them and "
                             f"records {ref} as not-implemented")
    if len(case.refs) == 1:  # the one reference named cannot run the schedule (Reference.schedule_refusal)
        for ref, why in run.schedule_refusals.items():
            raise UsageError(f"--ref {ref} --schedule {case.schedule}: {why}; named beside others (--ref all, "
                             f"--ref hf,{ref}) the case runs them and says {ref} is skipped")
    _ = run.plan  # raises when even the smallest plan does not fit
_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ParamCounts:
    """A model's parameter counts, from its config alone."""
    total: int  # every distinct parameter tensor once (tied embeddings once)
    largest_module: int  # the largest decoder layer / embedding / output head
    largest_tensor: int
    gguf_bytes: int  # the float32 GGUF the llama.cpp reference loads (approximately: every tensor)


_COUNTS: dict = {}


def param_counts(family, config) -> ParamCounts:
    """``ParamCounts`` of the family's HF model for ``config``, built on torch's meta
    device (no memory is allocated, every family's own shapes count); a recorded
    config (harness/warm.py ``ConfigSnapshot``) holds the counts made so."""
    counts = getattr(config, "counts", None)
    if isinstance(counts, ParamCounts):
        return counts
    key = (family.name, config.to_json_string(use_diff=False))
    if key in _COUNTS:
        return _COUNTS[key]

    kw = {} if family.experts_implementation is None else {"experts_implementation": family.experts_implementation}
    with torch.device("meta"):
        m = transformers.AutoModelForCausalLM.from_config(config, **kw)
    seen, total, largest_tensor = set(), 0, 0
    for p in m.parameters():  # parameters() yields a tied tensor once
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
            largest_tensor = max(largest_tensor, p.numel())
    modules = list(family.decoder_layers(m))
    modules += [x for x in (m.get_input_embeddings(), m.get_output_embeddings()) if x is not None]
    largest = max((sum(p.numel() for p in mod.parameters()) for mod in modules), default=0)
    # the GGUF writes an output matrix only where the HF model has an untied one
    out = _COUNTS[key] = ParamCounts(total, largest, largest_tensor, total * 4)
    return out


# the parts held from the model's build to the end of the case
HELD = ("weights", "weights copy", "dequantized copy")


@dataclass
class Estimate:
    """Bytes by part; ``peak``: the weights held the whole case (``HELD``) plus the
    largest phase."""

    parts: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)
    disk: int = 0  # the probes written to disk (every capture)

    @property
    def peak(self) -> int:
        return sum(self.parts.get(k, 0) for k in HELD) + max(self.phases.values(), default=0)

    def describe(self, n: int = 3) -> str:
        big = sorted(((v, k) for k, v in self.parts.items() if v > 0), reverse=True)[:n]
        return ", ".join(f"{k} {_gb(v)}" for v, k in big)


def _gb(b: float) -> str:
    return f"{b / GB:.2f} GB" if b < 10 * GB else f"{b / GB:.0f} GB"


def _layer_dims(lc) -> tuple[int, int, int, int, int]:
    """(hidden, query heads, kv heads, query/key width, value width) of a layer
    description's cache row: its kind's reading (``LayerKind.dims``); an
    unimplemented layer holds no cache impl sizes."""

    kind = kinds.of(lc)
    if kind is None:
        return int(getattr(lc, "hidden_size", 0) or 0), 0, 0, 0, 0
    return kind.dims(lc)


def _probe_elems(lc, seqs: int, tokens: int) -> int:
    """Elements of a layer's probes its ``dims`` do not count (a recurrent layer's
    probes and per-call states: ``LayerKind.probe_elems``)."""

    kind = kinds.of(lc)
    return kind.probe_elems(lc, seqs, tokens) if kind is not None else 0


@dataclass
class EstimateContext:
    """What a reference's ``estimate`` reads of the case (harness/references)."""
    pc: "ParamCounts"
    seqs: int
    tokens: int
    vocab: int
    dims: list
    hmax: int
    inter: int
    hf_dtype: str
    gguf_type: str
    want_logits: bool
    softcap: bool
    largest_probe: int
    probs: int
    file_bytes: int | None = None  # a user's GGUF's size, where known

    @staticmethod
    def bytes(dtype: str) -> int:
        return _BYTES.get(dtype, 4)

    def forward(self, b: int) -> int:
        """One layer's activations, the eager attention, and the logits read back."""
        hidden = max((d[0] for d in self.dims), default=0)
        return self.seqs * self.tokens * (4 * hidden + 3 * self.inter) * b + 3 * self.probs * b

    def logits(self, b: int) -> int:
        """HF's logits in compute type ``b``: the output head's result and, under a final
        softcap, the one temporary beside it (modeling_gemma2 Gemma2ForCausalLM.forward:
        ``logits / cap``, ``tanh``, ``* cap``, each a new tensor); a bfloat16 / float16
        result is read back widened to float32 (references/hf/capture.py capture); float32 and float64
        go to the store as they are."""
        if not self.want_logits:
            return 0
        n = self.seqs * self.tokens * self.vocab
        return n * b * (2 if self.softcap else 1) + (n * 4 if b < 4 else 0)


def estimate(family, config, layer_cfgs, *, tokens: int, seqs: int, dtype: str, refs: list[str],
             hf_dtype: str | None = None, oracle: bool = True, selection=None, gguf_type: str = "f32",
             file_bytes: int | None = None, streamed: bool = False) -> Estimate:
    """What one case will hold: ``Estimate.parts`` (bytes) and the peak.
    ``hf_dtype``: what HF computes in (default: the case's dtype); ``oracle``: the
    float64 oracle runs (a comparison against the oracle reference below float64);
    ``selection``: the ``harness.select.Selection`` (None: every layer and probe).
    ``file_bytes``: a user's GGUF's size (what llama.cpp maps; else estimated from
    the parameters); ``streamed``: the file's model is read one layer at a time
    (gguf/stream.py): the weights held are a decoder layer, the embedding and the
    head, not the model. Each reference adds its own parts (``Reference.estimate``)."""

    pc = param_counts(family, config)
    hf_dtype = hf_dtype or dtype
    s, t = int(seqs), int(tokens)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    layers = [i for i in range(len(layer_cfgs)) if selection is None or selection.layer(i)]
    dims = [_layer_dims(layer_cfgs[i]) for i in range(len(layer_cfgs))]
    inter = getattr(config, "intermediate_size", 0) or 0
    inter = max(inter) if isinstance(inter, (list, tuple)) else int(inter)  # gemma3n: one per layer
    inter = inter or 4 * max((d[0] for d in dims), default=0)
    hmax = max((d[1] for d in dims), default=0)
    probs = s * hmax * t * t  # elements of one layer's attn_probs

    def rows(i):  # elements of one layer's row probes (attn_in, q, k, v, ropes, heads, branch, out, resid, layer_out)
        hidden, h, hkv, d, dv = dims[i]
        return s * t * (6 * hidden + 3 * h * d + 3 * hkv * d + 2 * h * dv) + _probe_elems(layer_cfgs[i], s, t)

    keep_probs = selection is None or selection.probe("attn_probs")
    layer_probe = max((rows(i) + (probs if keep_probs else 0) for i in layers), default=0)
    largest_probe = max([probs if keep_probs else 0] + [s * t * dims[i][0] for i in layers] + [0])
    ctx = EstimateContext(pc, s, t, vocab, dims, hmax, inter, hf_dtype, gguf_type,
                          selection is None or selection.probe("logits"),
                          bool(getattr(config, "final_logit_softcapping", None)), largest_probe, probs, file_bytes)
    mine = [references.get(r) for r in refs]

    # a streamed model holds one decoder layer, the embedding and the head at most (each no
    # larger than the largest module)
    parts: dict[str, int] = {"weights": (3 * pc.largest_module if streamed else pc.total) * 4}
    if dtype in ("bfloat16", "float16"):
        parts["weights copy"] = pc.total * _BYTES[dtype]
    if family.gguf_arch and is_quantized(gguf_type) and not streamed:
        # every side computes on the quantized file's weights, dequantized into a float32
        # copy of the model held beside the float one it was exported from (Build.base_model);
        # a user's --gguf makes no such copy, and HF's float64 cached path keeps widened
        # weights between calls within it instead (Build.float64_keep)
        parts["dequantized copy"] = pc.total * 4
    f64 = hf_dtype == "float64" or (oracle and any(r.oracle for r in mine))
    parts["float64 module"] = pc.largest_module * 8 if f64 else 0
    # every reference's parts are named, 0 for those the case does not run (meta.json's plan)
    estimates = [(r.estimate(ctx), r in mine) for r in references.registry().values()]
    for e, runs in estimates:
        for k, v in e["parts"].items():
            parts[k] = max(parts.get(k, 0), v if runs else 0)
    parts["logits"] = max(parts.get("logits", 0), ctx.logits(8) if f64 else 0)
    # impl's layer probes (float64) + the references' probe of the moment + the metric temporaries
    parts["layer probes"] = 8 * layer_probe + 6 * 8 * min(largest_probe, _CHUNK)
    phases = {"build": pc.largest_tensor * 8 * 2}
    for e, runs in estimates:
        for k, v in e["phases"].items():
            phases[k] = max(phases.get(k, 0), v if runs else 0)
    phases["hf float64"] = parts["float64 module"] + (ctx.forward(8) + ctx.logits(8) if f64 else 0)
    phases["compare"] = parts["layer probes"]
    disk_per_ref = sum(rows(i) + (probs if keep_probs else 0) for i in layers) * 4 + (s * t * vocab * 4 if ctx.want_logits else 0)
    n_caps = len(refs) + (1 if f64 else 0)
    return Estimate(parts, phases, disk_per_ref * n_caps)


_CHUNK = 1 << 22  # elements per block of the chunked metrics (harness/compare.py)


def available() -> int:
    """The memory budget in bytes: ``CONFORMANCE_MEMORY_GB`` or MemAvailable."""
    env = os.environ.get("CONFORMANCE_MEMORY_GB")
    if env:
        try:
            return int(float(env) * GB)
        except ValueError:

            raise UsageError(f"CONFORMANCE_MEMORY_GB must be a number of gigabytes, got {env!r}") from None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))  # where /proc is missing


@dataclass(frozen=True)
class Plan:
    """What a case runs: HF's compute type, whether the float64 oracle runs, and why
    (``notes``: said in the rows and meta.json)."""

    hf_dtype: str
    oracle: bool
    estimate: Estimate
    budget: int
    notes: tuple[str, ...] = ()
    held: int = 0  # resident bytes of this process when planned (interpreter, torch): outside the budget already
    streamed: bool = False  # the model is read one layer at a time (gguf/stream.py)

    # float32 weights up to which llama.cpp's capture runs beside HF's: measured on 2 cores at
    # load 5 (docs/measurements/2026-12-02-real-file-speed.md), beside HF's captures the worker
    # saved 8 s of 50 on a 135M-class file and 5 s of 61 on Gemma 3 270M (1.07 GB), and cost
    # 20 s of 147 on a 1B-class one (3.2 GB), whose HF captures keep both cores busy themselves
    OVERLAP_WEIGHTS = 2 << 30

    @property
    def overlap(self) -> bool:
        """Whether llama.cpp's capture may run beside HF's (harness/case.py
        ``_capture_all``): a model small enough that HF's captures leave the cores
        idle much of the time (``OVERLAP_WEIGHTS``), and the weights held, its worker
        and HF's forward at once fit the budget (the phases are otherwise counted one
        after the other). Never for a file read layer by layer (its worker holds the
        whole model)."""
        if self.streamed or self.estimate.parts.get("weights", 0) > self.OVERLAP_WEIGHTS:
            return False
        ph = self.estimate.phases
        both = sum(self.estimate.parts.get(k, 0) for k in HELD) + ph.get("llama.cpp capture", 0) + ph.get("hf capture", 0)
        return both <= self.budget

    @property
    def skips_oracle(self) -> bool:
        """A fallback dropped the float64 oracle for memory (said in ``notes``)."""
        return not self.oracle and bool(self.notes)

    def meta(self) -> dict:
        return {"hf_dtype": self.hf_dtype, "oracle": self.oracle, "budget_gb": round(self.budget / GB, 2),
                "estimate_gb": round(self.estimate.peak / GB, 2),
                "estimate_parts_gb": {k: round(v / GB, 3) for k, v in self.estimate.parts.items()},
                "disk_gb": round(self.estimate.disk / GB, 2), "held_gb": round(self.held / GB, 3),
                "notes": list(self.notes)}


def plan(family, config, layer_cfgs, *, tokens: int, seqs: int, dtype: str, refs: list[str], selection=None,
         gguf_type: str = "f32", budget: int | None = None, file_bytes: int | None = None,
         streamed: bool = False) -> Plan:
    """The fullest run that fits ``budget`` (default ``available()``), or a
    ``UsageError`` (exit 2) when even the smallest does not."""

    budget = available() if budget is None else budget
    kw = dict(tokens=tokens, seqs=seqs, dtype=dtype, refs=refs, selection=selection, gguf_type=gguf_type,
              file_bytes=file_bytes, streamed=streamed)

    oracle_ref = any(references.get(r).oracle for r in refs)
    wants_oracle = oracle_ref and dtype != "float64"
    tries = [(dtype, wants_oracle, ())]
    if wants_oracle:
        tries.append((dtype, False, ("the float64 oracle was skipped: HF's float64 run of one module would not fit "
                                     "in memory; impl is judged against HF directly at the float32 bound scaled to "
                                     "the case",)))
    if dtype == "float64" and oracle_ref:
        tries.append(("float32", False, ("HF ran in float32, not float64: its float64 run of one module would not "
                                         "fit in memory; impl is judged against it at the float32 bound scaled to "
                                         "the case",)))
    est = None
    for hf_dtype, oracle, notes in tries:
        est = estimate(family, config, layer_cfgs, hf_dtype=hf_dtype, oracle=oracle, **kw)
        if est.peak <= budget:
            return Plan(hf_dtype, oracle, est, budget, notes, held=_resident(), streamed=streamed)
    raise UsageError(
        f"this case needs about {_gb(est.peak)} of memory ({est.describe()}) but {_gb(budget)} is available "
        f"(CONFORMANCE_MEMORY_GB or the machine's MemAvailable); capture less with --layers 0,-1, "
        f"--probes (e.g. without attn_probs: {tokens} tokens cost heads x tokens x tokens per layer) or fewer --tokens")


def _resident() -> int:
    """This process's resident bytes now: what MemAvailable (the budget) already
    leaves out, so the estimate is what the case adds to it."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def usage() -> dict:
    """What this process (and the workers it waited for: llama.cpp) used so far:
    peak resident memory in GB and CPU seconds -- meta.json's ``resources``, what
    scripts/bench_real_size.py reports against the estimate."""

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    # the workers' own peaks (VmHWM, reported by each worker): RUSAGE_CHILDREN's maxrss
    # carries the harness's own RSS at the spawn across exec, so it read the harness twice
    worker = llamacpp.WORKER_PEAK_RSS_GB
    return {"peak_rss_gb": round(me.ru_maxrss * 1024 / GB, 3),
            "peak_rss_children_gb": round(worker if worker is not None else kids.ru_maxrss * 1024 / GB, 3),
            "cpu_s": round(me.ru_utime + me.ru_stime, 1), "cpu_children_s": round(kids.ru_utime + kids.ru_stime, 1)}
