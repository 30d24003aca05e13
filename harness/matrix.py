"""The conformance matrix: a TOML spec expanded into cases, run in worker
processes, journaled case by case, sliced into deterministic shards.

A spec (``fixtures/matrix/*.toml``)::

    name = "default"
    description = "what this matrix is for"
    references = ["all"]        # axes at the top level: defaults for every group
    candidates = ["impl"]       # the engines judged (default impl; `conformance list`)

    [[group]]                   # one cross product; the matrix is the union of its groups
    name = "core"
    families = "*"              # every registered family
    variants = "default"        # each family's default variant ("*": all of them; the default)
    dtypes = ["float64", "float32"]
    kv_modes = ["decode", "batched", "paged"]
    # kv_evict = [true]: impl's window eviction (decode / batched only; default false)

    [[exclude]]                 # cases matching every axis given here are dropped
    backends = ["torch"]
    kv_modes = ["batched"]
    reason = "required: why these cases are not run"

Without ``[[group]]`` the top level is the one group. Every case is validated
(names, config keys, layer shapes) before anything runs, so a typo costs one
line and exit status 2, never a half-written run directory.

A run directory holds ``run.json`` (the spec text and this run's case list,
written first), ``journal.jsonl`` (one record per finished case: its rows and
timings; packed into ``journal.jsonl.gz`` once the run is finished) and, once
every case is in, the rows and the views. The journal is the
record: ``--resume`` skips what it holds, and ``merge`` builds its rows from
the shards' journals, so rows come out of one code path whichever way a run
was made.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import time
import tomllib
import traceback
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
import gzip

from contract.rows import FAILING

from . import atomic, families
from .case import Case
from .errors import UsageError, suggest
from .specs import DEFAULT_SPEC, keyword_matcher, select  # noqa: F401 (matrix.select etc., as before)
from harness.lazy import lazy
from . import budget
from . import case as case_module  # looked up at each call, as a test's patch of the module expects
from .case import CaseRun
from .policy import load_policy
from . import views, runlog
import harness.case
from . import report, references
from .cache import cache_dir

torch = lazy("torch")

# spec key -> (Case field, default values). The order is the product's order,
# the dtype varying fastest, so neighbouring cases share their references.
AXES = {
    "families": ("family", "*"),
    "variants": ("variant", "*"),
    "overrides": ("overrides", [{}]),
    "seeds": ("seed", [0]),
    "tokens": ("tokens", [16]),
    "seqs": ("seqs", [None]),
    "kv_modes": ("kv", ["decode"]),
    "schedules": ("schedule", ["mixed"]),
    "page_sizes": ("page_size", [4]),
    "kv_evict": ("evict", [False]),
    # true: the sequences differ in length, first call and arrival (continuous batching)
    "ragged": ("ragged", [False]),
    "references": ("ref", ["hf"]),
    "candidates": ("candidate", ["impl"]),  # the engines judged (harness/candidates)
    "weights": ("weights", ["random"]),  # the seeded model's weights (random, realistic, trained)
    "gguf_types": ("gguf_type", ["f32"]),
    "backends": ("backend", ["numpy"]),
    "devices": ("device", ["cpu"]),
    "dtypes": ("dtype", ["float32"]),
    # a subset of layers / probes ("0,5,-1", "q_rope,attn_probs"; harness/select.py): real sizes
    "layers": ("layers", [None]),
    "probes": ("probes", [None]),
}
_ALL_AXES = {"layers", "probes"}  # None (TOML has no null): every layer / probe
_INT_AXES = {"seeds", "tokens", "seqs", "page_sizes"}
_BOOL_AXES = {"kv_evict", "ragged"}
TOP_KEYS = {"name", "description", "group", "exclude"} | set(AXES)
GROUP_KEYS = {"name"} | set(AXES)
EXCLUDE_KEYS = {"reason"} | set(AXES)
JOURNAL = "journal.jsonl"
RUN_FILE = "run.json"


@dataclass
class Spec:
    path: str
    name: str
    text: str
    cases: list[Case]
    excluded: list[dict] = field(default_factory=list)  # {"reason", "count"}

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- spec
def load_spec(path: str | Path, keep=None, check: bool = True) -> Spec:
    """The spec at ``path``; ``keep(case)``: only the cases it admits are validated and
    kept (`conformance upstream`'s runner: the cases in question, on a release that may
    lack another family's model type altogether); ``check=False``: the cases as written,
    not validated against this install (`conformance coverage` reads what every spec
    varies, whether or not its candidates' extras are installed here)."""
    p = Path(path)
    try:
        text = p.read_text()
    except (FileNotFoundError, IsADirectoryError):
        raise UsageError(f"matrix spec {str(p)!r} is not a file") from None
    return parse_spec(text, str(p), keep, check)


def parse_spec(text: str, label: str, keep=None, check: bool = True) -> Spec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"matrix spec {label} is not valid TOML: {e}") from None
    _check_keys(data, TOP_KEYS, f"matrix spec {label}")
    groups = data.get("group", [{}])
    if not isinstance(groups, list) or not groups:
        raise UsageError(f"matrix spec {label}: 'group' must be an array of tables ([[group]])")
    excludes = data.get("exclude", [])
    for n, ex in enumerate(excludes, 1):
        where = f"matrix spec {label}, [[exclude]] #{n}"
        _check_keys(ex, EXCLUDE_KEYS, where)
        if not str(ex.get("reason", "")).strip():
            raise UsageError(f"{where}: every exclusion needs a written reason (reason = \"...\")")
    if "group" not in data and not any(k in AXES for k in data):
        # an empty file is a mistake, never "every family with every default"
        raise UsageError(f"matrix spec {label} has no [[group]] and no axes (families, dtypes, ...); nothing to run "
                         f"(see fixtures/matrix/smoke.toml)")
    defaults = {k: data[k] for k in AXES if k in data}
    cases: dict[str, Case] = {}
    hits = [0] * len(excludes)
    for n, g in enumerate(groups, 1):
        where = f"matrix spec {label}, [[group]] {g.get('name', '#' + str(n))!r}"
        _check_keys(g, GROUP_KEYS, where)
        for case in _expand({**defaults, **{k: v for k, v in g.items() if k in AXES}}, where, excludes, hits, keep,
                            check):
            cases.setdefault(case.case_id(), case)  # groups may overlap: a case runs once
    excluded = [{"reason": ex["reason"], "count": c} for ex, c in zip(excludes, hits)]
    return Spec(label, str(data.get("name", Path(label).stem)), text, list(cases.values()), excluded)


def _check_keys(table: dict, valid: set, where: str) -> None:
    if not isinstance(table, dict):
        raise UsageError(f"{where}: expected a table, got {table!r}")
    for key in table:
        if key not in valid:
            raise UsageError(f"{where}: unknown key {key!r}; {suggest(key, sorted(valid))}")


def _values(axis: str, raw, where: str) -> list:
    vals = raw if isinstance(raw, list) else [raw]
    if not vals:
        raise UsageError(f"{where}: axis {axis!r} is empty; give at least one value")
    for v in vals:
        if (axis == "seqs" or axis in _ALL_AXES) and v is None:  # the default (TOML has no null)
            continue
        if axis in _INT_AXES and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise UsageError(f"{where}: {axis} takes non-negative integers, got {v!r}")
        if axis == "overrides" and not isinstance(v, dict):
            raise UsageError(f"{where}: overrides takes tables of config fields, e.g. [{{}}, {{num_key_value_heads = 1}}]; got {v!r}")
        if axis in _BOOL_AXES and not isinstance(v, bool):
            raise UsageError(f"{where}: {axis} takes true or false, got {v!r}")
        if axis not in _INT_AXES | _BOOL_AXES and axis != "overrides" and not isinstance(v, str):
            raise UsageError(f"{where}: {axis} takes names (strings), got {v!r}")
    return vals


def _flat_overrides(table: dict) -> tuple:
    """``{rope_parameters = {factor = 2.0}}`` -> ``(("rope_parameters.factor", 2.0),)``: the
    dotted form a family merges into the field, like ``--set rope_parameters.factor=2``.
    TOML has no null: the string ``"null"`` is None (``--set q_lora_rank=null``)."""
    out = []
    for k, v in table.items():
        if isinstance(v, dict):
            out += [(f"{k}.{sub}", None if sv == "null" else sv) for sub, sv in v.items()]
        else:
            out.append((k, None if v == "null" else v))
    return tuple(out)


def _expand(axes: dict, where: str, excludes: list = (), hits: list | None = None, keep=None,
            check: bool = True) -> list[Case]:
    """The cases of one group, the ``excludes`` they match dropped (counted in
    ``hits``) BEFORE their configs are checked: an excluded case is one the spec
    says cannot run (a config key a family lacks), so it is never built."""
    vals = {a: _values(a, axes.get(a, default), where) for a, (_, default) in AXES.items()}
    fams = list(families.registry()) if vals["families"] == ["*"] else vals["families"]
    for f in fams:
        if f not in families.registry():
            raise UsageError(f"{where}: unknown family {f!r}; {suggest(f, families.registry())}")
    rest = [a for a in AXES if a not in ("families", "variants")]
    out = []
    for fam in fams:
        own = list(families.get(fam).variants) or [None]
        # "*": each of the family's variants; "default": its first (what a case without one runs)
        variants = own if vals["variants"] == ["*"] else own[:1] if vals["variants"] == ["default"] else vals["variants"]
        for variant, *combo in itertools.product(variants, *(vals[a] for a in rest)):
            kw = {AXES[a][0]: v for a, v in zip(rest, combo)}
            kw["overrides"] = _flat_overrides(kw["overrides"])
            case = Case(family=fam, variant=variant, **kw)
            hit = next((i for i, ex in enumerate(excludes) if _matches(case, ex)), None)
            if hit is not None:
                if hits is not None:
                    hits[hit] += 1
                continue
            if keep is not None and not keep(case):
                continue
            if not check:
                out.append(case)
                continue
            try:
                case.validate()
            except UsageError as e:
                raise UsageError(f"{where}: {e}") from None
            out.append(case)
    if check:
        _check_configs(out, where)
    return out


def _check_configs(cases: list[Case], where: str) -> None:
    """Config keys and layer shapes, once per distinct model, and what each case
    needs of it (positions, memory: ``budget.check``), before anything runs."""

    seen: dict = {}
    planned = set()
    for c in cases:
        k = (c.family, c.variant, repr(c.overrides))
        try:
            if k not in seen:
                seen[k] = CaseRun(c, None)
                _ = seen[k].layer_cfgs
            # positions, the selection's range and the memory plan (a case that cannot
            # fit even alone is refused here, before anything runs; harness/budget.py)
            p = (k, c.layers, c.probes, c.tokens, c.n_seqs, c.dtype, c.ref, c.gguf_type)
            if p not in planned:
                planned.add(p)
                r = CaseRun(c, None)
                r.adopt_model(seen[k])  # the same model: its config and layers, built once
                budget.check(r)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None


def _matches(case: Case, ex: dict) -> bool:
    for axis, raw in ex.items():
        if axis == "reason":
            continue
        vals = raw if isinstance(raw, list) else [raw]
        got = getattr(case, AXES[axis][0])
        if axis == "overrides":
            vals = [_flat_overrides(v) for v in vals if isinstance(v, dict)]
        if got not in vals:
            return False
    return True


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard takes I/N (e.g. 2/4), got {text!r}") from None
    if not 1 <= i <= n:
        raise UsageError(f"--shard {text}: need 1 <= I <= N")
    return i, n


def shard(cases: list, i: int, n: int) -> list:
    """Every n-th case from the (i-1)-th: deterministic, and each shard gets a
    share of every group and family, so shards take about the same time."""
    return cases[i - 1::n]


def unshard(parts: dict[int, list], n: int) -> list:
    """The inverse of ``shard``: the full list from ``{i: shard(cases, i, n)}``."""
    full = [None] * sum(len(p) for p in parts.values())
    for i, p in parts.items():
        full[i - 1::n] = p
    return full


# ---------------------------------------------------------------- journal
class Journal:
    """One JSON line per finished case, appended and flushed by the parent only
    (one writer, no locks); a line cut short by a kill is ignored on reading."""

    def __init__(self, d: Path):
        self.path = Path(d) / JOURNAL
        self.packed = self.path.with_name(JOURNAL + ".gz")  # a finished run's (``pack``)

    def _text(self) -> str:
        if self.path.exists():
            return self.path.read_text()
        if self.packed.exists():

            return gzip.decompress(self.packed.read_bytes()).decode()
        return ""

    def pack(self) -> None:
        """Compress a finished run's journal (``--resume``, ``merge`` read it the same): the
        default matrix's was the largest file of its report (issue 41)."""

        if self.path.exists():
            atomic.write_bytes(self.packed, gzip.compress(self.path.read_bytes(), compresslevel=6))
            self.path.unlink()

    def records(self) -> dict[str, dict]:
        out = {}
        text = self._text()
        if text:
            for line in text.splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "cols" in rec:  # the compact form (append): the column names once, each row its values
                    cols = rec.pop("cols")
                    rec["rows"] = [dict(zip(cols, v)) for v in rec.pop("vals")]
                out[rec["case_id"]] = rec
        return out

    def repair(self) -> None:
        """Cut a line a kill left half-written, so the next record starts on its own line."""
        if self.path.exists():
            data = self.path.read_bytes()
            if data and not data.endswith(b"\n"):
                self.path.write_bytes(data[:data.rfind(b"\n") + 1])

    def append(self, rec: dict) -> None:
        if self.packed.exists() and not self.path.exists():  # a finished run appended to again: unpack first
            self.path.write_text(self._text())
            self.packed.unlink()
        # each row's values under its case's column list, not every key in every row: the
        # default matrix's journal was 176 MB of repeated keys (issue 41), a third of that now
        rows = rec.get("rows") or []
        cols = list(dict.fromkeys(k for r in rows for k in r))
        compact = {k: v for k, v in rec.items() if k != "rows"}
        compact["cols"], compact["vals"] = cols, [[r.get(k) for k in cols] for r in rows]
        with open(self.path, "a") as f:
            f.write(json.dumps(compact, default=_plain, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _plain(x):
    return x.item() if hasattr(x, "item") else str(x)


# ---------------------------------------------------------------- one case, in a worker
_POLICIES: dict = {}


# Which cases of a matrix get a PNG (``conformance matrix --plots``). Drawing one costs
# 0.5-2 s of matplotlib text layout (harness/views.py _draw), more than a warm case: at
# 821 cases the plots were ~30% of the default matrix's cold time, and 83% of them
# showed a case whose every comparison passed. "needed" draws the cases a reader has to
# look at: a failing row (contract.rows.FAILING) or a finding.
PLOT_WHICH = ("needed", "all", "none")
PLOT_NEEDED_STATUSES = frozenset(FAILING) | {"finding"}


def wants_plot(rows, which: str) -> bool:
    """Whether a case with these rows gets its plot under ``--plots which``."""
    if which == "all":
        return True
    if which == "none":
        return False
    return any(r.get("status") in PLOT_NEEDED_STATUSES for r in rows)


def work(case_dict: dict, policy_path: str | None, plot_dir) -> dict:
    """Run one case (in a worker process, or in-process for -j1) and draw its plot.
    ``plot_dir``: None (no plot), a folder (every case's plot), or ``(folder, which)``
    with ``which`` one of ``PLOT_WHICH``."""

    case = Case.from_dict(case_dict)
    if policy_path not in _POLICIES:
        _POLICIES[policy_path] = load_policy(policy_path)
    t = time.perf_counter()
    try:
        rows, info = case_module.run_case(case, _POLICIES[policy_path])
    except Exception as e:  # a crash outside impl's per-layer guard is this case's error row; the run goes on
        tb = traceback.format_exc()

        runlog.traceback_block(f"{case.case_id()}: the case", tb)
        rows = [crash_row(case, f"{type(e).__name__}: {' '.join(str(e).split())[:400]}", tb)]
        info = {"features": [], "timings": {}, "traceback": tb}
    info = {"features": info.get("features", []), "timings": info.get("timings", {}),
            **({"traceback": info["traceback"]} if "traceback" in info else {})}
    info["timings"]["case_s"] = time.perf_counter() - t
    if _WORKER_STARTUP:  # this worker's first case: what starting it cost, reported apart
        info["worker_startup_s"] = _WORKER_STARTUP.pop()
    plot_dir, which = plot_dir if isinstance(plot_dir, (tuple, list)) else (plot_dir, "all")
    if plot_dir and wants_plot(rows, which):

        try:
            views.plot_case(rows, Path(plot_dir) / views.plot_name(case.case_id()))
        except Exception as e:  # a plot is a view; its failure must not lose the case's rows
            info["plot_error"] = f"{type(e).__name__}: {e}"
    return {"case_id": case.case_id(), "rows": rows, "info": info}


def crash_row(case: Case, reason: str, detail: str = "") -> dict:
    return dict(case_id=case.case_id(), family=case.family, features="", backend=case.backend, device=case.device,
                dtype=case.dtype, kv=case.kv, schedule=case.schedule, seed=case.seed, tokens=case.tokens,
                seqs=case.n_seqs, gguf_type=case.gguf_type, weights=case.weights, ragged=case.ragged,
                overrides=";".join(f"{k}={v}" for k, v in case.overrides), candidate=case.candidate, reference=case.ref,
                layer=-1, probe="*", variant=case.variant or "", layer_kind="model", status="error", reason=reason,
                detail=detail)


_WORKER_STARTUP: list = []  # a worker's start-up seconds, until its first case reports them


def _init_worker(threads: int, log_path: str | None = None, verbose: bool = False) -> None:
    # Before torch is imported in this process: one pool of `threads` per worker,
    # so -j workers share the cores instead of each spinning all of them.

    # Ctrl-C reaches every process of the terminal's group: a worker leaves it to the
    # parent, which stops the workers with SIGTERM (_stop_workers) -- a worker's own
    # KeyboardInterrupt printed a traceback beside the parent's one line (issue 41)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    runlog.setup(verbose)  # third-party chatter to the run's log, as in the parent
    signal.signal(signal.SIGTERM, _worker_sigterm)
    if log_path:
        runlog.attach(log_path)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("CONFORMANCE_LLAMACPP_THREADS", str(threads))
    os.environ["MPLBACKEND"] = "Agg"
    t = time.perf_counter()

    torch.set_num_threads(threads)
    # said apart from the first case's own time (its record's info.worker_startup_s)
    _WORKER_STARTUP.append(time.perf_counter() - t)


def execute(cases: list[Case], jobs: int, policy_path: str | None, plot_dir: str | None, on_start, on_done,
            task=None, skip=None) -> None:
    """Run ``cases``; ``on_start(case)`` as one is handed out, ``on_done(case,
    record)`` as it finishes (completion order). ``jobs`` <= 1 runs in this
    process (where a test's mutant applies); otherwise in reused 'spawn'
    workers (fork after torch has started threads can deadlock). ``task``: the
    picklable top-level function a worker runs, ``task(case_dict, policy_path,
    plot_dir)`` (default ``work``); ``skip(case)``: checked as each case is
    about to be handed out -- True drops it (``conformance mutate --first-kill``)."""
    task = task or work
    if jobs <= 1:
        for c in cases:
            if skip is not None and skip(c):
                continue
            on_start(c)
            on_done(c, task(c.to_dict(), policy_path, plot_dir))
        return
    threads = max(1, (os.cpu_count() or 1) // jobs)

    def pool():
        return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(threads, runlog.log_path(), runlog.verbose()))

    pending, tries, inflight = deque(cases), {}, {}
    ex = pool()
    finished = False
    try:
        while pending or inflight:
            # Never more than `jobs` handed out, so "in flight" is exactly what runs.
            while pending and len(inflight) < jobs:
                c = pending.popleft()
                if skip is not None and skip(c):
                    continue
                with _sigint_blocked():  # a worker spawned here inherits the mask: no Ctrl-C before its initializer
                    inflight[ex.submit(_in_worker, task, c.to_dict(), policy_path, plot_dir)] = c
                on_start(c)
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                c = inflight.pop(fut)
                try:
                    on_done(c, fut.result())
                except BrokenProcessPool:
                    broken = True
                    inflight[fut] = c
            if broken:
                # A worker died (segfault, OOM): every case in flight is retried once in a
                # fresh pool; one that kills a worker twice is an error row.
                for fut, c in list(inflight.items()):
                    tries[c.case_id()] = tries.get(c.case_id(), 0) + 1
                    if tries[c.case_id()] >= 2:
                        on_done(c, {"case_id": c.case_id(), "rows": [crash_row(c, "the worker process died running this case (twice)")],
                                    "info": {"features": [], "timings": {}}})
                    else:
                        pending.appendleft(c)
                inflight.clear()
                ex.shutdown(wait=False, cancel_futures=True)
                ex = pool()
        finished = True
    finally:
        if finished:
            ex.shutdown(wait=True)
        else:
            _stop_workers(ex)  # Ctrl-C / SIGTERM: the cases in flight are abandoned, not waited for


def _stop_workers(ex) -> None:
    """Stop the pool now. ``shutdown(wait=False)`` alone leaves the workers running
    their current case to the end -- and the interpreter's exit joins them
    (concurrent.futures' atexit hook): an interrupted ``-j 2`` run took as long
    as its slowest case in flight to exit. So each worker is sent SIGTERM, on
    which it abandons its case (``_worker_sigterm``: its ``finally`` blocks run,
    a llama.cpp subprocess is killed by ``subprocess.run``, temporary files
    go) and then takes the shutdown sentinel. ``_processes``: the executor's
    own table of its workers (CPython's ProcessPoolExecutor)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()


class _Abandon(SystemExit):
    """Raised in a worker by SIGTERM. Not an Exception, so no case's error handler
    takes it for a crash; a SystemExit, so a worker it reaches between cases ends
    quietly."""


_IN_TASK = [False]


def _worker_sigterm(signum, frame):
    if not _IN_TASK[0]:
        # between cases (or in the interpreter's teardown, an atexit hook waiting on a
        # llama.cpp server): nothing to unwind -- leave now, silently. Raised there, the
        # exception was printed as "Exception ignored ... _Abandon: 143" (issue 41)
        os._exit(128 + signum)
    raise _Abandon(128 + signum)


def _in_worker(task, *args):
    """A task as a worker runs it: abandoned on SIGTERM, and once its ``finally``
    blocks have run, the worker leaves at once (``os._exit``) -- not through
    the pool's loop and the interpreter's teardown (seconds, with torch loaded)."""
    _IN_TASK[0] = True
    try:
        return task(*args)
    except _Abandon as e:
        os._exit(e.code)
    finally:
        _IN_TASK[0] = False


class _sigint_blocked:
    """SIGINT held back in this thread for the block: a process spawned inside it starts
    with SIGINT blocked (the mask survives fork and exec), and a Ctrl-C meanwhile is
    delivered to this process when the block ends, not lost."""

    def __enter__(self):
        self.old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self.old)


def run_order(cases: list[Case]) -> list[Case]:
    """Execution order: first one case per shared llama.cpp / HF capture, then the
    rest. Cold, the workers then compute distinct captures side by side instead
    of the same one twice; the rows are written in spec order regardless."""
    first, rest, seen = [], [], set()
    for c in cases:
        k = (c.family, c.variant, repr(c.overrides), c.seed, c.tokens, c.n_seqs, c.kv == "decode", c.schedule, c.gguf_type,
             c.ragged)
        (rest if k in seen else first).append(c)
        seen.add(k)
    return first + rest


# ---------------------------------------------------------------- a run directory
def nonempty(spec: Spec) -> list[Case]:
    """The spec's cases; none is bad input -- a run that compares nothing proves nothing."""
    if not spec.cases:
        total = sum(e["count"] for e in spec.excluded)
        raise UsageError(f"matrix spec {spec.path} expands to zero cases ({total} excluded); nothing to compare")
    return spec.cases


def start(spec: Spec, out: str | None, shard_arg: tuple[int, int] | None, policy_path: str | None,
          jobs: int, argv: list[str]) -> Path:
    """Check everything, then create the run directory with its ``run.json``."""
    cases = nonempty(spec)
    if shard_arg:
        cases = shard(cases, *shard_arg)
        if not cases:
            raise UsageError(f"--shard {shard_arg[0]}/{shard_arg[1]} is empty: the spec has {len(spec.cases)} cases; "
                             f"use at most {len(spec.cases)} shards")
    if policy_path:

        load_policy(policy_path)  # a bad policy is bad input: refused before the directory exists
    preflight(cases)
    run_id = report.new_run_id()
    # claimed (report.claim_out: a lock only this process holds until the run is finished or
    # interrupted), so a second command into the same --out is refused, never interleaved
    d = report.claim_out(out, run_id, f"use --resume {report.run_dir(out, run_id)} to complete it, or another --out")
    run = {"run_id": run_id, "argv": argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "spec": {"path": spec.path, "name": spec.name, "sha": spec.sha, "text": spec.text,
                    "cases_total": len(spec.cases), "excluded": spec.excluded},
           "shard": f"{shard_arg[0]}/{shard_arg[1]}" if shard_arg else None,
           "policy": policy_path, "jobs": jobs, "cases": [c.to_dict() for c in cases]}
    atomic.write_text(d / RUN_FILE, json.dumps(run, indent=1, default=str))
    return d


def preflight(cases: list[Case]) -> None:
    """Every reference's start-up check of every family the cases run (its hook points
    in the installed release: harness/references ``Reference.preflight``), on the
    family's own config: a release that moved one is refused in one line before the
    run directory exists, not met as an error row in every case of the family."""

    refs: dict[str, set] = {}
    for c in cases:
        refs.setdefault(c.family, set()).update(c.refs)
    for name in sorted(refs):
        fam = families.get(name)
        references.preflight(refs[name], fam, fam.make_config())


def read_run(d: str | Path) -> dict:
    p = Path(d) / RUN_FILE
    if not p.is_file():
        raise UsageError(f"{d} is not a matrix run directory (no {RUN_FILE})")
    return json.loads(p.read_text())


def cases_of(run: dict) -> list[Case]:
    return [Case.from_dict(c) for c in run["cases"]]


def complete(d: Path, jobs: int, on_start=lambda c: None, on_done=lambda c, rec: None,
             plots: bool | str = "needed") -> tuple:
    """Run whatever the journal of ``d`` does not hold yet, then finalize ``d``.
    ``plots``: which cases get a PNG, one of ``PLOT_WHICH`` (True: "needed", False: "none")."""
    which = plots if isinstance(plots, str) else ("needed" if plots else "none")
    run = read_run(d)
    cases = cases_of(run)
    journal = Journal(d)
    journal.repair()
    held = journal.records()
    todo = [c for c in cases if c.case_id() not in held]
    plot_dir = d / "plots" if which != "none" else None
    if plot_dir:
        plot_dir.mkdir(exist_ok=True)
    t0 = time.perf_counter()

    def done(c, rec):
        journal.append(rec)
        on_done(c, rec)

    execute(run_order(todo), jobs, run.get("policy"), (str(plot_dir), which) if plot_dir else None, on_start, done)
    wall = time.perf_counter() - t0
    prior = run.get("wall_s", 0.0)
    run["wall_s"] = prior + wall  # summed over the invocations that made the run
    atomic.write_text(d / RUN_FILE, json.dumps(run, indent=1, default=str))
    meta = {"run_id": run["run_id"], "command": "matrix", "argv": run["argv"], "spec": _spec_meta(run),
            "shard": run["shard"], "jobs": jobs, "policy": run.get("policy"),
            "cases_already_done": len(held), "wall_s": prior + wall, "started": run["started"]}
    return finalize(d, cases, journal.records(), meta)


def _spec_meta(run: dict) -> dict:
    return {k: v for k, v in run["spec"].items() if k != "text"}


def finalize(d: Path, cases: list[Case], records: dict, meta: dict):
    """Rows in case order from the journal records, meta.json and the views."""
    missing = [c.case_id() for c in cases if c.case_id() not in records]
    if missing:
        raise UsageError(f"{d}: {len(missing)} cases have no journal record (first: {missing[0]}); "
                         f"complete it with `conformance matrix --resume {d}`")
    rows = [r for c in cases for r in records[c.case_id()]["rows"]]
    df = report.write_rows(d, rows)
    info = {c.case_id(): records[c.case_id()]["info"] for c in cases}
    meta = dict(meta, cases=[c.case_id() for c in cases], case_info=info,
                counts=report.counts(df), case_counts=views.case_counts(df),
                finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                cache_dir=str(_cache_dir()))
    report.write_meta(d, meta)
    views.write_all(d, df, json.loads((d / "meta.json").read_text()))
    Journal(d).pack()
    return df, meta


def _cache_dir():
    return cache_dir()


def merge(dirs: list[str], out: str | None, argv: list[str]):
    """Join the shards of one spec into one run directory (rows from their journals)."""
    runs = []
    for d in dirs:
        run = read_run(d)
        if not run.get("shard"):
            raise UsageError(f"{d} is not a shard (it was run without --shard)")
        runs.append((Path(d), run))
    shas = {r["spec"]["sha"] for _, r in runs}
    if len(shas) > 1:
        raise UsageError(f"the shards come from different specs ({', '.join(sorted(shas))}); merge shards of one spec")
    ns = {int(r["shard"].split("/")[1]) for _, r in runs}
    if len(ns) > 1:
        raise UsageError(f"the shards were cut differently (N = {', '.join(map(str, sorted(ns)))}); merge shards of one --shard I/N")
    n = ns.pop()
    by_i: dict[int, tuple] = {}
    for d, r in runs:
        i = int(r["shard"].split("/")[0])
        if i in by_i:
            raise UsageError(f"shard {i}/{n} given twice ({by_i[i][0]} and {d})")
        by_i[i] = (d, r)
    absent = [f"{i}/{n}" for i in range(1, n + 1) if i not in by_i]
    if absent:
        raise UsageError(f"shard(s) {', '.join(absent)} missing; merge needs all {n}")
    records, parts = {}, {}
    for i, (d, r) in by_i.items():
        held = Journal(d).records()
        cs = cases_of(r)
        lacking = [c for c in cs if c.case_id() not in held]
        if lacking:
            raise UsageError(f"shard {i}/{n} in {d} is incomplete ({len(cs) - len(lacking)} of {len(cs)} cases); "
                             f"complete it with `conformance matrix --resume {d}`")
        parts[i] = cs
        records.update(held)
    cases = unshard(parts, n)
    run_id = report.new_run_id()
    od = report.check_out(out, run_id)
    od.mkdir(parents=True, exist_ok=True)
    for i, (d, _) in sorted(by_i.items()):
        if (d / "plots").is_dir():
            shutil.copytree(d / "plots", od / "plots", dirs_exist_ok=True)
    first = by_i[1][1]
    meta = {"run_id": run_id, "command": "merge", "argv": argv, "spec": _spec_meta(first), "shard": None,
            "shards": [{"dir": str(d), "run_id": r["run_id"], "shard": r["shard"], "wall_s": r.get("wall_s")}
                       for _, (d, r) in sorted(by_i.items())],
            "policy": first.get("policy"), "wall_s": sum(r.get("wall_s", 0.0) for _, r in by_i.values()),
            "started": min(r["started"] for _, r in by_i.values())}
    return od, *finalize(od, cases, records, meta)
