"""llama.cpp (through llama-cpp-python) as a reference.

The GGUF is written from the same HF weights (``gguf_export``) or taken from
the user (``--gguf``); the capture runs in a subprocess
(``llamacpp_worker``) so a crash inside llama.cpp is an error row, not the end
of the run. The decode calls follow the case: one call per chunk of the
schedule, and for several sequences every call carries a chunk of EACH
sequence (a multi-sequence batch) -- llama.cpp's counterpart of impl's Batched
and Paged backings, as token-by-token decode is of Decode.

Captured tensors are placed back by (sequence, position) and put into the
canonical layout by the family (``Family.lc_canonical``: head-major rows
reshaped, the converter's Q/K permutation undone, ...).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
import select

import numpy as np

from harness import cache
from harness.versions import ROOT, versions
from harness.ggml_env import worker_env  # noqa: F401  (here too: the worker's and tests' import)
from harness.schedule import chunk_sizes
from contract.recurrent import RecurrentConfig
from contract.layers import Unimplemented
from ..capture import RefCapture
from .worker import DATA
from contract.probes import STATE_PROBES

CAPTURE_SCHEMA = 1
TIMEOUT_S = 300
WORKER_MODULE = "harness.references.llamacpp.worker"  # a test points this at a worker that crashes


class LlamaCppUnavailable(RuntimeError):
    pass


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401 -- an optional extra ([llamacpp]): the probe of whether it is here
        import gguf  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    if not available():
        raise LlamaCppUnavailable(
            "llama-cpp-python (and gguf) are not installed: pip install -e '.[llamacpp]' "
            "(builds llama.cpp from source, ~5 minutes on 2 cores)")


_TOKENIZE = """
import json, sys, ctypes, llama_cpp as l
quiet = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda level, text, user: None)
l.llama_log_set(quiet, None)
l.llama_backend_init()
p = l.llama_model_default_params()
p.vocab_only = True
m = l.llama_model_load_from_file(sys.argv[1].encode(), p)
if not m:
    sys.exit(3)
text = sys.stdin.buffer.read()
n = len(text) + 16
buf = (l.llama_token * n)()
k = l.llama_tokenize(l.llama_model_get_vocab(m), text, len(text), buf, n, True, False)
print(json.dumps(list(buf[:k]) if k >= 0 else None))
"""


def tokenize(gguf_path, text: str) -> list[int]:
    """``text`` tokenized with the file's own vocabulary, by llama.cpp's tokenizer
    (``llama_tokenize``, special tokens added as the file asks -- ``add_bos``):
    the ids every side of a ``--prompt`` case then takes. In a subprocess, as
    every llama.cpp call here."""
    require()
    proc = subprocess.run([sys.executable, "-c", _TOKENIZE, str(gguf_path)], input=text.encode(),
                          capture_output=True, timeout=120, env=worker_env(), process_group=0)
    ids = json.loads(proc.stdout or b"null") if proc.returncode == 0 else None
    if not ids:
        lines = [x for x in (proc.stderr or b"").decode(errors="replace").strip().splitlines() if "what()" in x]
        why = (f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
               if proc.returncode else "no tokens") + (f", {lines[-1].strip()}" if lines else "")
        raise RuntimeError(f"llama.cpp could not tokenize the prompt with {Path(gguf_path).name}'s vocabulary "
                           f"({why})")
    return [int(i) for i in ids]


def plan_calls(tokens: np.ndarray, kv: str, schedule: str, plan=None) -> list[list[tuple[int, int, int]]]:
    """The decode calls: ``[[(token, pos, seq), ...], ...]``, sequences in
    ascending order inside every call (llama.cpp splits a ubatch into one
    stream per sequence in that order). The schedule is the case's
    (``harness.schedule``), the same chunk sizes impl's runner is handed;
    ``plan`` (a ``harness.schedule.BatchPlan``): a ragged case's, where each
    sequence has its own length, chunks and arrival (``ubatches``)."""

    if plan is not None and plan.ragged:
        return [[(int(tokens[s, p]), p, s) for s, start, n in ub for p in range(start, start + n)]
                for call in plan.calls() for ub in ubatches(call)]
    n_seq, n_tok = tokens.shape
    sizes = chunk_sizes(schedule, n_tok)
    calls = []
    if kv == "decode":
        for s in range(n_seq):
            start = 0
            for size in sizes:
                calls.append([(int(tokens[s, p]), p, s) for p in range(start, start + size)])
                start += size
        return calls
    start = 0
    for size in sizes:
        calls.append([(int(tokens[s, p]), p, s) for s in range(n_seq) for p in range(start, start + size)])
        start += size
    return calls


def ubatches(call: list[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    """One call of a ragged plan (``[(seq, start, rows), ...]``) as the ubatches
    llama.cpp evaluates it in, each then issued as a call of its own so that one
    call is one graph (the capture reads each name once per graph). With one KV
    stream per sequence llama.cpp splits a batch by ``split_equal(n_ubatch,
    sequential=true)`` (src/llama-kv-cache.cpp init_batch; llama-batch.cpp
    split_equal): a ubatch holds a run of consecutive sequence ids from the
    lowest one left, and as many rows of each as the shortest of them has --
    so a call whose sequences carry different row counts is several graphs,
    in this order, with the same cache in between."""
    left = {s: [start, n] for s, start, n in call}
    out = []
    while left:
        seqs = sorted(left)
        run = [seqs[0]]
        for s in seqs[1:]:
            if s != run[-1] + 1:
                break
            run.append(s)
        n = min(left[s][1] for s in run)
        out.append([(s, left[s][0], n) for s in run])
        for s in run:
            left[s][0] += n
            left[s][1] -= n
            if not left[s][1]:
                del left[s]
    return out


class _Dumped(dict):
    """The worker's tensors: read-only views of its one data file, mapped once
    (worker.py ``DATA``; ``index.json`` says where each lies)."""

    def __init__(self, d: Path, index: list[dict]):
        super().__init__()

        path = d / DATA
        self.mm = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
        self.at = {rec["key"]: rec for rec in index if "offset" in rec}

    def __getitem__(self, key):
        rec = self.at[key]
        dt = np.dtype(rec["dtype"])
        n = int(np.prod(rec["shape"], dtype=np.int64))
        return self.mm[rec["offset"]:rec["offset"] + n * dt.itemsize].view(dt).reshape(rec["shape"])


def worker_timeout(gguf_path: Path, calls) -> int:
    """How long the worker may take before it counts as hung: ``TIMEOUT_S``, plus
    for a real model the time of reading its weights once per call and of its
    rows' arithmetic at a pace far below any CPU's (2 s per GB per call, 0.5 s per
    GB per row; ``CONFORMANCE_LLAMACPP_TIMEOUT`` overrides), and for a long run the
    calls themselves (0.25 s each: a graph, its callbacks, the cells read so far).
    A 1B model's 129 calls of a mixed schedule took 200 s on two loaded cores; a
    fixed 300 s was a false error at real sizes, and so was the weights-only
    allowance at real lengths (a tiny llama4 at 8256 tokens, mixed: 4129 calls,
    timed out after 308 s)."""
    env = os.environ.get("CONFORMANCE_LLAMACPP_TIMEOUT")
    if env:
        return int(float(env))
    try:
        gb = gguf_path.stat().st_size / 2**30
    except OSError:
        gb = 0.0
    rows = sum(len(c) for c in calls)
    return int(TIMEOUT_S + gb * (2 * len(calls) + 0.5 * rows) + 0.25 * len(calls))


WORKER_PEAK_RSS_GB: float | None = None  # the largest worker's own peak so far (budget.usage)


def _note_worker_peak(path: Path) -> None:
    global WORKER_PEAK_RSS_GB
    try:
        gb = json.loads(path.read_text()).get("peak_rss_gb")
    except (OSError, ValueError):
        return
    if gb is not None:
        WORKER_PEAK_RSS_GB = max(gb, WORKER_PEAK_RSS_GB or 0.0)


class _WorkerServer:
    """The serving worker (``python -m WORKER_MODULE --serve``), started on the first
    capture and reused by the next ones of this process: the interpreter and libllama
    start once, not once a capture. What a crash means is unchanged -- the capture that
    crashed (or failed, or timed out) is an error, the process is gone (the worker
    ends itself after any failure; a timeout kills it), and the next capture starts a
    fresh one. Its stderr goes to a file of its own; each capture's message is what was
    written there from its request on. A change of ``WORKER_MODULE`` or of the
    environment starts a new one; after ``MAX_CAPTURES`` it is renewed anyway, so
    whatever llama.cpp keeps between models never accumulates without bound."""

    MAX_CAPTURES = 64

    def __init__(self):
        self.proc = None
        self.err = None
        self.key = None
        self.served = 0

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            proc.stdout.close()
        if self.err is not None:
            self.err.close()
            self.err = None

    def _start(self, key) -> None:
        self.close()
        self.err = tempfile.TemporaryFile(prefix="conformance-lc-err-")
        # in a process group of its own (process_group=0): the terminal's Ctrl-C goes to the
        # harness, which ends the worker (close, atexit) -- received by both, the worker died
        # first and the harness's own KeyboardInterrupt was lost in the capture's error path
        # (issue 41: `fuzz` went on to its budget's end and exited 0)
        self.proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=worker_env(), cwd=str(ROOT),
                                     text=True, bufsize=1, process_group=0)
        self.key, self.served = key, 0

    def capture(self, req_path: Path, out_dir: Path, timeout: float) -> tuple[int, str]:
        """Run one capture; ``(status, its stderr)``: 0, or the worker's exit status
        (negative: the signal that ended it)."""

        key = (WORKER_MODULE, tuple(sorted(worker_env().items())))
        _check_aborted()
        if self.proc is None or self.proc.poll() is not None or key != self.key or self.served >= self.MAX_CAPTURES:
            self._start(key)
        self.served += 1
        # read by position (pread): the file's offset is shared with the worker writing to it
        fd = self.err.fileno()
        start = os.fstat(fd).st_size
        try:
            self.proc.stdin.write(f"{req_path}\t{out_dir}\n")
            self.proc.stdin.flush()
        except OSError:  # it is gone already (a worker that dies as it starts): its status below
            pass
        # waited on in short steps: a Ctrl-C that came while this thread was starting the
        # worker found none to kill (CI: an interrupted run held 90 s by the capture it began)
        deadline = time.monotonic() + timeout
        while not select.select([self.proc.stdout], [], [], min(0.25, max(deadline - time.monotonic(), 0)))[0]:
            if _ABORTED.is_set() or time.monotonic() >= deadline:
                self.proc.kill()
                self.close()
                _check_aborted()
                raise RuntimeError(f"llama.cpp capture timed out after {timeout}s")
        answer = self.proc.stdout.readline()
        rc = int(answer.split()[1]) if answer.startswith("done ") else None
        if rc != 0:  # the worker ends after a failure; a crash ended it already
            try:
                status = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                status = self.proc.wait()
            rc = status if rc is None else rc
        err = os.pread(fd, max(os.fstat(fd).st_size - start, 0), start).decode(errors="replace")
        if rc != 0:
            self.close()
        return rc, err


_SERVER = _WorkerServer()
atexit.register(_SERVER.close)


_ABORTED = threading.Event()


def _check_aborted() -> None:
    if _ABORTED.is_set():
        raise RuntimeError("llama.cpp capture interrupted (Ctrl-C)")


def abort() -> None:
    """Kill the worker now (Ctrl-C): it runs in a process group of its own, so the
    terminal's SIGINT never reaches it, and a capture thread waiting on it held an
    interrupted run for the rest of the capture (45 s on a loaded CI machine). Until
    ``resume``, no capture starts one again, and one waiting on a worker ends."""
    _ABORTED.set()
    proc = _SERVER.proc
    if proc is not None and proc.poll() is None:
        proc.kill()


def resume() -> None:
    """Captures may run again (the next case's): an abort holds until then."""
    _ABORTED.clear()


def run_worker(gguf_path: Path, calls, n_seq: int, names: set[str], timeout: int = TIMEOUT_S, out_dir=None,
               engine: dict | None = None, states: bool = False):
    """Run the worker; return ``(arrays, index)`` or raise RuntimeError with its message.
    The worker writes each tensor to ``out_dir`` as it reads it (default: a
    temporary folder, read into memory before it goes); ``arrays`` reads them from there.
    ``engine``: context settings other than the reference's (``flash_attn``,
    ``type_k``, ``type_v``; the llamacpp-fa candidates). ``states``: the worker also
    saves each sequence's recurrent state after every call (``parse_state``)."""
    n_tok = max(p for call in calls for (_, p, _) in call) + 1
    # a multiple of the sequences: with n_ubatch not one, llama.cpp's kimi-linear graph aborts
    # (ggml.c ggml_can_repeat) for any ubatch of fewer sequences than n_seq_max -- its worst-case
    # graph is reserved with n_ubatch / n_seq_max rows a sequence (src/llama-context.cpp
    # graph_reserve, ubatch_reserve); a lockstep plan's calls are such multiples already
    n_batch = -(-max(max(len(c) for c in calls), 1) // n_seq) * n_seq
    if timeout == TIMEOUT_S:
        timeout = worker_timeout(Path(gguf_path), calls)
    req = {
        "gguf": str(gguf_path), "calls": calls, "n_seq": n_seq,
        # one stream per sequence, each holding every position (swa_full)
        "n_ctx": n_seq * max(256, -(-n_tok // 256) * 256), "n_batch": max(n_batch, 1),
        "names": sorted(names), "threads": int(os.environ.get("CONFORMANCE_LLAMACPP_THREADS", "2")),
        # the file read into memory, not mapped (LLAMA_LOAD_MODE_NONE): ggml's CPU backend repacks
        # K-quant weights into memory of its own, so a mapped file's pages counted on top while
        # it loaded (an 8B-class Q4_K_M file: a 7.8 GB peak, 4.7 GB read); the same weights --
        # the captures of the 135M, 1B and Gemma 3 270M files are identical either way
        "load_mode": 0,
        **({"states": True} if states else {}), **(engine or {}),
    }
    with tempfile.TemporaryDirectory(prefix="conformance-lc-") as d:
        rp, op = Path(d) / "req.json", Path(out_dir) if out_dir is not None else Path(d) / "out"
        rp.write_text(json.dumps(req))
        rc, err = _SERVER.capture(rp, op, timeout)
        _check_aborted()  # killed by an abort: its status says nothing, and nothing after it is wanted
        if rc != 0:
            tail = " | ".join(line for line in err.strip().splitlines()[-6:] if line.strip())
            how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            raise RuntimeError(f"llama.cpp worker {how}: {tail or '(no message)'}")
        index = json.loads((op / "index.json").read_text())
        _note_worker_peak(op / "usage.json")
        arrays = _Dumped(op, index)
        if out_dir is None:  # the folder goes with this block: read it now
            arrays = {rec["key"]: np.array(arrays[rec["key"]]) for rec in index if "error" not in rec}
    return arrays, index


def _pick(occ: list[dict], how: str) -> dict | None:
    """Choose one occurrence of a name in one graph (see ``LcPoint.pick``)."""
    if not occ:
        return None
    if how == "last":
        return occ[-1]
    if how == "first":
        return occ[0]
    if how == "rope":
        ropes = [o for o in occ if o["op"] == "ROPE"]
        return ropes[-1] if ropes else None
    if how == "pre_rope":
        first_rope = next((i for i, o in enumerate(occ) if o["op"] == "ROPE"), len(occ))
        before = occ[:first_rope]
        return before[-1] if before else None
    if how.startswith("op:"):
        ops = [o for o in occ if o["op"] == how[3:]]
        return ops[-1] if ops else None
    raise ValueError(f"unknown occurrence pick {how!r}")


def _wide(a: np.ndarray):
    """The type a probe is assembled in: the tensor's own (ggml's float32 read back), at
    least float32 -- placing values is exact, and a float64 array of the logits would be
    the capture's largest allocation (2 x 128 x 262144 doubles: 0.5 GB)."""
    return np.result_type(a.dtype, np.float32)


def assemble(arrays: dict, index: list[dict], calls, n_seq: int, n_tok: int, name: str, point) -> np.ndarray | None:
    """One probe over the whole run: ``[seqs, tokens, ...]`` (rows / heads) or
    ``[seqs, heads, tokens, tokens]`` (probs), placed by (sequence, position)."""
    by_call: dict[int, list[dict]] = {}
    for rec in index:
        if rec["name"] == name:
            by_call.setdefault(rec["call"], []).append(rec)
    out = None
    for ci, call in enumerate(calls):
        rec = _pick(sorted(by_call.get(ci, []), key=lambda r: r["occ"]), point.pick)
        if rec is None:
            return None
        if "error" in rec:
            raise RuntimeError(f"{name}: {rec['error']}")
        a = arrays[rec["key"]]  # [ne3, ne2, ne1, ne0]
        if point.layout == "probs":
            n_stream, n_head, n_q, n_kv = a.shape
            # a call sees the cells used so far (llama_kv_cache::get_n_kv pads them to 256),
            # so an early call of a long run has fewer cells than the run's positions:
            # what must hold is that each token's own causal keys are all there
            last = max(pos for (_, pos, _) in call)
            if n_kv <= last:
                raise RuntimeError(f"{name}: {n_kv} KV cells hold fewer than the {last + 1} positions of this call")
            if out is None:
                out = np.zeros((n_seq, n_head, n_tok, n_tok), dtype=_wide(a))
            per_stream = len(call) // n_stream
            in_call = sorted({seq for (_, _, seq) in call})  # a ubatch's streams: its sequences, ascending
            for j, (_, pos, seq) in enumerate(call):
                stream, row = (j // per_stream, j % per_stream) if n_stream > 1 else (0, j)
                if n_stream > 1 and in_call[stream] != seq:
                    raise RuntimeError(f"{name}: token of sequence {seq} landed in stream {stream}")
                p = a[stream, :, row, :]
                # a fresh cache fills a sequence's cells in position order; mass past the
                # positions would mean the mapping is wrong, so it is checked, not assumed
                if np.abs(p[:, n_tok:]).max(initial=0.0) > 1e-6 or np.abs(p[:, pos + 1:]).max(initial=0.0) > 1e-6:
                    raise RuntimeError(f"{name}: probability mass outside the causal cells; KV cell mapping failed")
                width = min(n_kv, n_tok)
                out[seq, :, pos, :width] = p[:, :width]
            continue
        flat = a.reshape(-1, *a.shape[-2:]) if point.layout == "rows" else a.reshape(-1, *a.shape[-3:])
        if flat.shape[0] > 1 and flat.shape[0] * flat.shape[1] == len(call):
            # [seqs, tokens per seq, C]: a graph that keeps a multi-sequence ubatch's
            # sequences apart (the recurrent layers: qwen3next.cpp's `linear_attn_out`
            # is [n_embd, n_seq_tokens, n_seqs]); the equal split holds them in the
            # call's order (sequences ascending), so the rows flatten to the call's rows
            # (heads too: `attn_output` is [S_v, H_v, n_seq_tokens, n_seqs])
            flat = flat.reshape(1, -1, *flat.shape[2:])
        if flat.shape[0] != 1:
            raise RuntimeError(f"{name}: unexpected leading dims {a.shape}")
        flat = flat[0]
        if flat.shape[0] != len(call):
            raise RuntimeError(f"{name}: {flat.shape[0]} rows for a call of {len(call)} tokens")
        if out is None:
            out = np.zeros((n_seq, n_tok, *flat.shape[1:]), dtype=_wide(flat))
        for j, (_, pos, seq) in enumerate(call):
            out[seq, pos] = flat[j]
    return out


def parse_state(buf: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One sequence's recurrent state as ``llama_state_seq_get_data_ext(...,
    LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)`` writes it: ``(r rows, s rows)``, one float32
    row per recurrent layer, in layer order. The format (llama-context.cpp
    ``state_seq_get_data``; llama-memory-hybrid.cpp ``state_write`` skips the KV cache
    under PARTIAL_ONLY; llama-memory-recurrent.cpp ``state_write``, ``state_write_meta``,
    ``state_write_data``): magic u32, seq_id i32, cell_count u32, per cell (pos i32,
    n_seq_id u32 = 0), s_trans u32, n_layer u32, then per layer with an ``r_l`` (type
    i32, row size u64, the cells' rows), then per layer with an ``s_l`` the same. The
    two sections hold one record per recurrent layer each; anything else is refused."""
    b = bytes(np.asarray(buf, dtype=np.uint8))
    off = 0

    def take(fmt_size, dtype):
        nonlocal off
        v = np.frombuffer(b, dtype=dtype, count=1, offset=off)[0]
        off += fmt_size
        return int(v)

    take(4, "<u4")  # magic
    take(4, "<i4")  # seq_id
    cells = take(4, "<u4")
    if cells != 1:
        raise RuntimeError(f"llama.cpp state: {cells} cells for one sequence (expected 1)")
    take(4, "<i4")  # pos
    if take(4, "<u4") != 0:
        raise RuntimeError("llama.cpp state: per-cell sequence ids in a one-sequence state")
    if take(4, "<u4") != 0:
        raise RuntimeError("llama.cpp state: a transposed s_l (s_trans), which no recurrent arch here writes")
    take(4, "<u4")  # n_layer
    records = []
    while off < len(b):
        typ, size = take(4, "<i4"), take(8, "<u8")
        if typ != 0:  # GGML_TYPE_F32: llama-memory-recurrent's type_r / type_s as the context makes them
            raise RuntimeError(f"llama.cpp state: a state row of ggml type {typ}, expected F32 (0)")
        records.append(np.frombuffer(b, dtype="<f4", count=size // 4, offset=off).copy())
        off += size
    if len(records) % 2:
        raise RuntimeError(f"llama.cpp state: {len(records)} layer records, not one r and one s per layer")
    half = len(records) // 2
    return records[:half], records[half:]


def assemble_states(fam, config, layer_cfgs, index: list[dict], arrays, n_seq: int) -> dict[str, np.ndarray]:
    """The state probes ``{"L{i}.state_conv": [S, calls, ...], ...}`` of every recurrent
    layer from the worker's per-call state dumps, canonical (``Family.lc_state_canonical``)."""

    rec_layers = [i for i, lc in enumerate(layer_cfgs) if isinstance(lc, RecurrentConfig)]
    per: dict[tuple[int, str], list[list]] = {}
    for rec in sorted((r for r in index if r["name"] == "__state__"), key=lambda r: (r["seq"], r["call"])):
        r_rows, s_rows = parse_state(arrays[rec["key"]])
        if len(r_rows) != len(rec_layers):
            raise RuntimeError(f"llama.cpp state: {len(r_rows)} recurrent layers, the model has {len(rec_layers)}")
        for i, r, s in zip(rec_layers, r_rows, s_rows):
            for name, a in fam.lc_state_canonical(r, s, layer_cfgs[i], config).items():
                per.setdefault((i, name), [[] for _ in range(n_seq)])[rec["seq"]].append(a)
    out = {}
    for (i, name), seqs in per.items():
        if len({len(x) for x in seqs}) != 1:
            # a ragged plan: each sequence ran its own calls, and the states are compared call
            # by call on a common calls axis; not exposed there (RAGGED_STATES)
            continue
        out[f"L{i}.{name}"] = np.stack([np.stack(x) for x in seqs])
    return out


RAGGED_STATES = ("on a ragged plan each sequence runs its own calls; the per-call states are compared on a calls "
                 "axis the sequences share, so they are not compared there")


def derive_attn_out(probes: dict, layer_cfgs) -> dict[str, str]:
    """``attn_out`` where the arch's graph names no tensor for it (qwen2.cpp,
    qwen3.cpp, starcoder2.cpp, ... add ``build_attn``'s result to the residual
    unnamed): ``ffn_inp - layer_in``, divided by the layer's residual
    multiplier. Exact up to one float32 rounding of the residual; every row
    compared on a derived probe says so in its reason. Returns
    ``{probe key: how it was derived}``."""
    derived = {}
    for i, lc in enumerate(layer_cfgs):
        if getattr(lc, "shape", None) == "absent":
            # a layer without attention (nemotron-h.cpp's MLP layers): the residual the
            # FFN half reads is the layer's input itself (`inpSA = inpL`), which the graph
            # names as the previous layer's output, read here as layer_in
            x = probes.get(f"L{i}.layer_in")
            if f"L{i}.resid_mid" not in probes and x is not None:
                probes[f"L{i}.resid_mid"] = x
                derived[f"L{i}.resid_mid"] = "the layer's input (no attention half: the residual passes through)"
            continue
        key = f"L{i}.attn_out"
        if key in probes or getattr(lc, "residual", None) != "sequential":
            continue
        normed = getattr(lc, "residual_base", "input") == "normed"
        base = f"L{i}.attn_in" if normed else f"L{i}.layer_in"
        resid, x = probes.get(f"L{i}.resid_mid"), probes.get(base)
        if resid is None or x is None or resid.shape != x.shape:
            continue
        m = float(getattr(lc, "residual_multiplier", 1.0))
        alpha = float(getattr(lc, "residual_alpha", 1.0))
        # minimax-01.cpp: `ffn_inp = cur + ggml_scale(attn_norm output, f_residual_scale)`
        probes[key] = (np.asarray(resid, dtype=np.float64) - alpha * np.asarray(x, dtype=np.float64)) / m
        what = ("attn_norm" if normed else "layer_in") + (f" x {alpha:g}" if alpha != 1.0 else "")
        derived[key] = f"derived as ffn_inp - {what}" + (f", over the residual multiplier {m:g}" if m != 1.0 else "")
    return derived


def capture_for_case(req, engine: dict | None = None, capture_name: str = "llamacpp"):
    """The llama.cpp capture for a case (``req``: its ``CaptureRequest``). ``engine``:
    context settings other than the reference's (flash attention, KV cache
    types), for a candidate that is llama.cpp run differently; ``capture_name``
    names the capture."""

    require()
    case, fam, config = req.case, req.family, req.config
    gguf_path = req.gguf()
    if req.user_file:
        st = gguf_path.stat()
        # the user's file: its path, size and mtime (ns), and the config read back from it
        file_stamp = [str(gguf_path.resolve()), st.st_size, st.st_mtime_ns,
                      cache.key(config.to_json_string(use_diff=False))]
    else:
        file_stamp = gguf_path.name  # content-keyed (harness/pipeline/gguf/export.py, harness/pipeline/gguf/weights.py quantize)
    calls = plan_calls(req.tokens, case.kv, case.schedule, getattr(req, "batch_plan", None))
    n_seq, n_tok = req.tokens.shape
    layer_cfgs = list(req.layer_cfgs)
    sel = req.selection

    # the callback keeps only the tensors of the layers and probes selected (--layers,
    # --probes): a base name ("Qcur") keeps it in every layer, a full one ("Qcur-5") in one
    points = {i: {p: pt for p, pt in fam.lc_points_for(config, i).items() if sel.probe(p)} for i in sel.layers}
    model_points = {m: pt for m, pt in fam.lc_model_points.items() if sel.probe(m)}
    # None: the graph names no tensor for the layer's input (hrm-text.cpp's stack input,
    # an unnamed ggml_add): derived as the float32 sum of the tensors it adds, where the
    # family names them (lc_input_sum), else the layer is not teacher-forced against llama.cpp
    inputs = {i: fam.lc_layer_input(config, i) for i in sel.layers}
    input_sums = {i: fam.lc_input_sum(config, i) for i in sel.layers if inputs[i] is None}
    input_sums = {i: pts for i, pts in input_sums.items() if pts}

    def input_name(i):
        # the tensor under the layer its key names (the previous layer's l_out by default;
        # gemma3n's own layer's active_prediction)
        src_key, pt = inputs[i]
        return pt.name if src_key == "embeddings" else f"{pt.name}-{int(src_key.split('.')[0][1:])}"

    if sel.every_layer:
        names = {p.name for pts in points.values() for p in pts.values()}
        names |= {v[1].name for v in inputs.values() if v is not None}
    else:
        names = {f"{p.name}-{i}" for i, pts in points.items() for p in pts.values()}
        names |= {input_name(i) for i in sel.layers if inputs[i] is not None}
        # a name the graph gives without a layer number (bloom's inp_norm-0 is per model)
        names |= {p.name for pts in points.values() for p in pts.values() if "-" in p.name}
    names |= {pt.name for pts in input_sums.values() for pt in pts}
    names |= {p.name for p in model_points.values()}

    src = cache.source_hash(*cache.family_sources(fam), Path(__file__), Path(__file__).with_name("worker.py"),
                            *req.family_base_sources)
    k = cache.key("llamacpp", CAPTURE_SCHEMA, fam.name, str(file_stamp), req.variant, calls, versions().get("llama_cpp_python"),
                  versions().get("llama_cpp_kernels"), src, *((["selection", sel.label()],) if sel.label() else ()),
                  *((sorted(engine.items()),) if engine else ()))
    hit = cache.load("llamacpp", k)
    if hit is not None:
        return RefCapture(capture_name, "float32", hit[0], meta=hit[1], cached=True, key=k)

    with cache.writer("llamacpp", k, keep=sel.key) as probes, \
            tempfile.TemporaryDirectory(prefix="conformance-lc-", dir=cache.cache_dir()) as dump:
        t = time.perf_counter()

        want_states = (any(isinstance(lc, RecurrentConfig) for i, lc in enumerate(layer_cfgs) if i in sel.layers)
                       and any(sel.probe(p) for p in STATE_PROBES))
        arrays, index = run_worker(gguf_path, calls, n_seq, names, out_dir=Path(dump) / "t", engine=engine,
                                   states=want_states)
        req.timings["llamacpp_worker"] = time.perf_counter() - t
        by_name: dict[str, list] = {}
        for rec in index:
            by_name.setdefault(rec["name"], []).append(rec)

        def one(name, pt):
            return assemble(arrays, by_name.get(name, []), calls, n_seq, n_tok, name, pt)

        # one probe at a time: assembled, made canonical, written, dropped
        input_derived: dict[str, str] = {}
        for mname, pt in model_points.items():
            a = one(pt.name, pt)
            if a is not None:
                probes.put(mname, a)
        for i in sel.layers:
            lc = layer_cfgs[i]
            for probe, pt in points[i].items():
                a = one(f"{pt.name}-{i}", pt)
                if a is None:
                    continue
                if not isinstance(lc, Unimplemented):
                    # None: the tensor under that name is not this probe in this layer's
                    # form (MLA: `Kcur` is the per-head key in the naive graph, the latent
                    # row in the absorbed one), so the probe stays absent (not exposed)
                    a = fam.lc_canonical(probe, a, lc, config)
                    if a is None:
                        continue
                probes.put(f"L{i}.{probe}", a)
            a = None if inputs[i] is None else one(input_name(i), inputs[i][1])
            if i in input_sums:
                parts = [one(pt.name, pt) for pt in input_sums[i]]
                if all(x is not None for x in parts):
                    a = parts[0].astype(np.float32)
                    for x in parts[1:]:
                        a = a + x.astype(np.float32)  # ggml_add's float32 sum, element by element
                    input_derived[f"L{i}.layer_in"] = ("derived as the float32 sum "
                                                       + " + ".join(pt.name for pt in input_sums[i]))
            if a is not None:
                probes.put(f"L{i}.layer_in", a)
        if want_states:  # the recurrent layers' states after each call (llama_state_seq_get_data)
            for key, a in assemble_states(fam, config, layer_cfgs, index, arrays, n_seq).items():
                i, probe = int(key.split(".")[0][1:]), key.split(".", 1)[1]
                if i in sel.layers and sel.probe(probe):
                    probes.put(key, a)
        derived = {**input_derived, **derive_attn_out(probes, layer_cfgs)}
        not_exposed = dict(fam.lc_not_exposed or {})
        if want_states and getattr(case, "ragged", False):

            not_exposed.update({p: RAGGED_STATES for p in STATE_PROBES})
        meta = {"gguf": str(gguf_path), "gguf_type": case.gguf_type, "calls": len(calls), "derived": derived,
                **({"engine": engine} if engine else {}),
                # why the graph names no tensor for a probe, where the family says (LcCapture.lc_not_exposed)
                **({"not_exposed": not_exposed} if not_exposed else {})}
        store = cache.finish(probes, meta)
    req.timings["llamacpp_assemble"] = time.perf_counter() - t - req.timings["llamacpp_worker"]
    return RefCapture(capture_name, "float32", store, meta=meta, key=k)
