"""llama.cpp capture, run in its own process.

``python -m harness.references.llamacpp.worker REQUEST.json OUT_DIR`` (one capture), or
``python -m harness.references.llamacpp.worker --serve`` (one capture per line
``REQUEST.json<TAB>OUT_DIR`` on stdin, each answered ``done <status>`` on stdout).

The parent (``harness.references.llamacpp.capture``) runs this in a subprocess so that an
abort or a segfault inside llama.cpp ends THIS process, and becomes an error
row there, while the run goes on. It keeps one serving process and reuses it:
starting Python and loading libllama costs 0.3-0.9 s, more than a tiny model's
whole capture (428 captures of a cold default matrix spent ~270 s in workers).
A capture that fails in any way ends the serving process (``serve``), so a
later capture never runs in a process llama.cpp left in an unknown state.

The request names the GGUF, the decode calls (each a list of ``[token, pos,
seq]``), and which graph tensor names to keep. Every ``llama_decode`` call
evaluates its graph with the eval callback set (``cb_eval``): on the "ask"
call we answer yes for the names we want, on the "data" call we read the
tensor (``ggml_ctypes.Ggml.read``). A name may occur several times in one graph
(``Qcur-0`` after the projection, after the bias, after the reshape, after
RoPE); every occurrence is kept in graph order with its op, so the parent can
choose by meaning, not by position. Each tensor is appended to ``OUT_DIR/data.bin``
the moment it is read (``index.json`` at the end lists them, each with its
offset, dtype and shape), so the worker holds one tensor at a time, whatever the
model's size and length; the parent maps the one file and takes views of it
(a file per tensor was 10,000 files written, opened, parsed and unlinked on a
135M-class run: 3 s of its 23).

Settings that make the capture comparable: flash attention OFF (so
``kq_soft_max`` exists), an F32 KV cache (the default F16 cache would round
every K and V), logits requested for every token (so the last layer keeps all
rows instead of ``ggml_get_rows(out_ids)``), full-size SWA cache (cells are
never reused, so a cell index is a position), one stream per sequence. The
request may turn flash attention on and name other KV cache types
(``flash_attn``, ``type_k`` / ``type_v`` as ggml type names): the
``llamacpp-fa*`` candidates (harness/candidates/llamacpp_fa.py).
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
import os
import traceback

import numpy as np

from harness.references.llamacpp.ggml_ctypes import Ggml


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet(level, text, user):
    # module level: llama.cpp keeps the pointer past the capture that set it (serve)
    if level == 4 and text:  # GGML_LOG_LEVEL_ERROR: keep errors for the error row
        sys.stderr.write(text.decode(errors="replace"))


def main(req_path: str, out_dir: str) -> int:
    req = json.loads(open(req_path).read())
    import llama_cpp as lc  # llama.cpp's library loads in the worker process only, where main runs

    ggml = Ggml()
    wanted = set(req["names"])
    verbose = bool(req.get("verbose"))
    if verbose:  # llama-cpp-python's own logger, the one its import installs (llama_cpp/_logger.py)
        from llama_cpp._logger import llama_log_callback  # in the worker, as llama_cpp above

        lc.llama_log_set(llama_log_callback, ctypes.c_void_p(0))
    else:
        lc.llama_log_set(_quiet, None)
    lc.llama_backend_init()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index: list[dict] = []
    state = {"call": 0, "occ": {}}

    @lc.ggml_backend_sched_eval_callback
    def on_eval(t, ask, user):
        name = ggml.name(t)
        base = name.rsplit("-", 1)[0] if name.rsplit("-", 1)[-1].isdigit() else name
        # a base name ("Qcur") keeps every layer's tensor; a full name ("inp_norm-0")
        # keeps that one tensor (bloom's embedding norm is cb'd with il=0)
        if base not in wanted and name not in wanted:
            return not ask  # ask: not needed; data: keep going
        if ask:
            return True
        hdr = ggml.header(t)
        occ = state["occ"].get(name, 0)
        state["occ"][name] = occ + 1
        key = str(len(index))
        try:
            at = _append(data, ggml.read(t))
            index.append({"key": key, "call": state["call"], "name": name, "occ": occ, "op": ggml.op_name(hdr),
                          "ne": [int(hdr.ne[i]) for i in range(4)], **at})
        except TypeError as e:
            index.append({"key": key, "call": state["call"], "name": name, "occ": occ, "op": ggml.op_name(hdr),
                          "error": str(e)})
        return True

    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = 0
    if "load_mode" in req:  # LLAMA_LOAD_MODE_NONE (0): read into memory, not mapped (capture.py run_worker)
        mparams.load_mode = int(req["load_mode"])
    model = lc.llama_model_load_from_file(req["gguf"].encode(), mparams)
    if not model:
        print(f"llama.cpp could not load {req['gguf']}", file=sys.stderr)
        return 3
    cparams = lc.llama_context_default_params()
    n_seq = int(req["n_seq"])
    cparams.n_ctx = int(req["n_ctx"])
    cparams.n_batch = int(req["n_batch"])
    cparams.n_ubatch = int(req["n_batch"])
    cparams.n_seq_max = n_seq
    cparams.n_threads = cparams.n_threads_batch = int(req.get("threads", 2))
    fa = bool(req.get("flash_attn", False))
    cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if fa else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ggml_types = {"f32": 0, "f16": 1, "q8_0": 8}  # enum ggml_type (ggml/include/ggml.h)
    cparams.type_k = ggml_types[req.get("type_k", "f32")]
    cparams.type_v = ggml_types[req.get("type_v", "f32")]
    if not req.get("plain"):  # plain: no callback at all (scripts/bench_real_size.py: what the capture costs)
        cparams.cb_eval = on_eval
        cparams.cb_eval_user_data = None
    cparams.swa_full = True
    cparams.kv_unified = bool(req.get("kv_unified", False))
    cparams.no_perf = True
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        print("llama.cpp could not create a context", file=sys.stderr)
        return 3

    calls = req["calls"]
    batch = lc.llama_batch_init(max(len(c) for c in calls), 0, n_seq)
    data = open(out / DATA, "wb")  # noqa: SIM115 -- closed after the last call (finally below)
    try:
        for ci, call in enumerate(calls):
            state["call"] = ci
            state["occ"] = {}
            batch.n_tokens = len(call)
            for i, (tok, pos, seq) in enumerate(call):
                batch.token[i] = int(tok)
                batch.pos[i] = int(pos)
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = int(seq)
                batch.logits[i] = 1
            rc = lc.llama_decode(ctx, batch)
            if rc != 0:
                print(f"llama_decode returned {rc} on call {ci}", file=sys.stderr)
                return 4
            if req.get("states"):  # the recurrent state each sequence of this call leaves behind
                for seq in sorted({int(s) for (_, _, s) in call}):
                    _save_state(lc, ctx, seq, ci, data, index)
    finally:
        lc.llama_batch_free(batch)
        data.close()
    lc.llama_free(ctx)
    lc.llama_model_free(model)

    (out / "index.json").write_text(json.dumps(index))
    (out / "usage.json").write_text(json.dumps({"peak_rss_gb": _own_peak_rss_gb()}))
    return 0


DATA = "data.bin"  # every tensor of a capture, one after another (``index.json``: where each lies)


def _append(f, arr: np.ndarray) -> dict:
    """``arr`` written at the end of ``f`` (at an offset a multiple of 8, so every
    view of the mapped file is aligned); where it lies, for ``index.json``."""
    arr = np.ascontiguousarray(arr)
    pad = -f.tell() % 8
    if pad:
        f.write(b"\0" * pad)
    at = {"offset": f.tell(), "dtype": arr.dtype.str, "shape": list(arr.shape)}
    arr.tofile(f)
    return at


def _save_state(lc, ctx, seq: int, ci: int, data, index: list) -> None:
    """Sequence ``seq``'s recurrent state after call ``ci``, as llama.cpp serialises it
    (``llama_state_seq_get_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: the
    recurrent memory alone, not a hybrid model's KV cache; the byte format is
    llama-memory-recurrent.cpp ``state_write`` / ``state_write_data``, which the parent
    parses: harness/references/llamacpp/capture.py ``parse_state``), written raw."""
    flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
    n = lc.llama_state_seq_get_size_ext(ctx, seq, flags)
    buf = (ctypes.c_uint8 * n)()
    got = lc.llama_state_seq_get_data_ext(ctx, buf, n, seq, flags)
    key = str(len(index))
    at = _append(data, np.frombuffer(buf, dtype=np.uint8, count=got))
    index.append({"key": key, "call": ci, "name": "__state__", "seq": seq, "occ": 0, "op": "STATE", "ne": [got], **at})


def _own_peak_rss_gb() -> float | None:
    """This process's own peak resident memory: VmHWM of /proc/self/status, which
    belongs to the address space exec made. getrusage's ru_maxrss does not: Linux
    carries the pre-exec peak across execve (the forked / vforked parent's), so a
    worker started by a 4 GB harness would report 4 GB whatever it used."""
    try:
        for line in open("/proc/self/status").read().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 2**30
    except OSError:
        pass
    return None


def _reset_peak() -> None:
    """Start VmHWM afresh for the next capture (Linux: writing 5 to clear_refs resets
    the peak resident size, Documentation/filesystems/proc.rst), so usage.json says
    this capture's peak, not the serving process's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # the peak then covers earlier captures too: an over-, never an under-statement


def serve() -> int:
    """Captures one after another, one line each on stdin. The answer goes on a copy
    of the original stdout; fd 1 itself then points at stderr, so nothing llama.cpp or
    Python prints can be taken for an answer. Ends at end of input (the parent went)
    or after the first capture that did not succeed."""

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        req_path, out_dir = line.rstrip("\n").split("\t")
        _reset_peak()
        try:
            rc = main(req_path, out_dir)
        except Exception:  # noqa: BLE001 -- reported as the capture's failure, with its traceback
            traceback.print_exc()
            rc = 1
        sys.stderr.flush()
        answers.write(f"done {rc}\n")
        answers.flush()
        if rc != 0:
            return rc


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main(sys.argv[1], sys.argv[2]))
