"""``ort-gqa``: ONNX Runtime's own attention op judged layer by layer.

Each decoder layer's attention half is built as a one-layer ONNX graph from the
``LayerCall`` (its description and weights) around
``com.microsoft.GroupQueryAttention`` -- the contrib op onnxruntime-genai's model
builder emits for every decoder it supports (builders/base.py ``make_attention``)
-- and run by ORT's CPU execution provider, teacher-forced like impl: fed each
reference's own input to the layer, chunk by chunk on the case's schedule, the
op's KV cache carried between calls (``past_key`` / ``present_key``, BNSH).

What the op computes itself (read from its schema in the installed
onnxruntime, ``onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema``):
the rotary embedding (``do_rotary``, ``rotary_interleaved``, the caller's
``cos_cache`` / ``sin_cache``), the scale, the causal mask and its sliding
window (``local_window_size``), the softcap, attention sinks (``head_sink``)
. Everything around it is ONNX's standard ops (MatMul,
Add, Clip, Sigmoid, the norms), as the model builder writes them -- the per-head
Q/K norm too: the op's own ``q_norm_weight`` / ``k_norm_weight`` inputs are
refused by its CPU kernel ("GroupQueryAttention (CPU): q_norm_weight /
k_norm_weight inputs are not supported. The per-head Q/K RMS normalization
prologue is implemented only on the CUDA and WebGPU EPs", onnxruntime 1.31.1). A decoration the op has no input or attribute for (ALiBi slopes,
chunked windows, a norm after the rotary, llama4's temperature, MLA's latent
cache, a page pool) is ``skipped`` naming the schema's limit; a shape the
op's kernel refuses is skipped in ORT's own words (a one-row probe run in
``unsupported``).

Probes: ``attn_in``, ``q``, ``k``, ``v`` (the graph's own tensors before the op),
``k_rope`` (the op's ``present_key``: the keys it cached, after its norm and
rotary), ``attn_probs`` (``output_qk`` with ``qk_output = 2``: after the
softmax), ``attn_heads`` (the op's output), ``attn_branch``, ``attn_out``,
``resid_mid``. ``q_rope`` is not exposed: the op rotates Q inside its kernel
and returns no rotated query.

The rotary tables are the caller's: ``cos_cache[p, i] = cos(p * inv_freq[i]) *
attention_factor`` as the model builder makes them (builders/base.py
``make_rotary_embedding_caches``: ``cos_cache = emb.cos() * self.rope_attrs["mscale"]``).
``table`` lets a test hand the op a wrong one (tests/test_engines.py: it fails at
``k_rope``, the first probe it acts on).
"""

from __future__ import annotations

import numpy as np

from contract.candidate import LayerCall, NotExposed
from contract.layers import Unimplemented

from ..api import LayerCandidate
from . import require, said
from harness.lazy import lazy

onnx = lazy("onnx")

OP = "com.microsoft.GroupQueryAttention"
NO_Q_ROPE = (f"{OP} rotates Q inside its kernel and returns no rotated query (its outputs: output, present_key, "
             "present_value, output_qk)")


class OrtGqa(LayerCandidate):
    description = (f"ONNX Runtime's {OP} (its rotary, window, softcap, sinks, QK norm) in a one-layer ONNX graph per "
                   "decoder layer, teacher-forced (the extra .[engines])")
    engine_packages = ("onnxruntime", "onnx")

    def __init__(self, table=None):
        # table(cos, sin) -> (cos, sin): what the op is handed instead of the true
        # rotary caches (a planted bug; None: the true ones)
        self.table = table

    def validate(self, case) -> None:
        require("onnxruntime", self.name)
        require("onnx", self.name)

    def unsupported(self, run) -> str | None:
        case = run.case
        if case.dtype != "float32":
            return (f"{self.name} builds float32 graphs (GroupQueryAttention's CPU kernel takes float and float16; "
                    f"this candidate judges the float one), not {case.dtype}")
        if case.kv == "paged":
            return f"{OP}'s cache is one BNSH tensor per layer (past_key / present_key), not a page pool"
        if case.evict:
            return (f"{self.name} keeps the whole cache ({OP}'s sliding_window_cache is not used): eviction is "
                    "not what it runs")
        for i, lc in enumerate(run.layer_cfgs):
            why = _inexpressible(lc)
            if why:
                return f"layer {i}: {why}"
        # what the schema allows the kernel may still refuse: one row through each
        # distinct layer, ORT's own words if it raises
        seen = set()
        for i, lc in enumerate(run.layer_cfgs):
            if lc in seen or isinstance(lc, Unimplemented):
                continue
            seen.add(lc)
            w = run.layer_weights_for("float32", i)
            try:
                x = np.zeros((2, lc.hidden_size))
                self.run_layer(LayerCall(i, lc, w, [x], "decode", (1, 1), 16, 0, False, "numpy", "cpu", "float32",
                                         run.family.name))
            except Exception as e:
                return f"onnxruntime refuses layer {i}: {said(e)}"
        return None

    def run_layer(self, call: LayerCall) -> dict:
        ort = require("onnxruntime", self.name)
        lc = call.config
        t_max = max(x.shape[0] for x in call.inputs)
        graph = _LayerGraph(lc, call.weights, t_max, self.table)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1  # the machine's cores are shared; the kernel's result does not depend on it
        opts.log_severity_level = 4  # its refusals are raised, and said in the row
        sess = ort.InferenceSession(graph.model().SerializeToString(), opts, providers=["CPUExecutionProvider"])
        # decode: each sequence alone; batched: all of them advance together, one call
        # of each per step (the op's batch, seqlens_k per entry)
        groups = [[s] for s in range(len(call.inputs))] if call.kv == "decode" else [list(range(len(call.inputs)))]
        per_seq: dict[int, dict] = {}
        for seqs in groups:
            for s, out in zip(seqs, graph.drive(sess, [call.inputs[s] for s in seqs], call.chunks)):
                per_seq[s] = out
        probes = {p: np.stack([per_seq[s][p] for s in range(len(call.inputs))]) for p in per_seq[0]}
        probes["q_rope"] = NotExposed(NO_Q_ROPE)
        if lc.residual == "parallel":
            probes.pop("resid_mid", None)
        return probes


def _inexpressible(lc) -> str | None:
    """What of layer ``lc`` the op (its schema) has no input or attribute for, or None."""
    if isinstance(lc, Unimplemented):
        return None  # a layer kind nobody describes (linear attention): never handed to a candidate
    if getattr(lc, "kind", None) == "mla":
        return (f"a mla layer: {OP} takes per-head K and V (key / value, kv_num_heads); "
                "a latent KV cache is not one of its inputs")
    if getattr(lc, "kind", None) != "attention":
        # a hybrid's recurrent layer (jamba's mamba, lfm2's short conv, ...): judging only the
        # attention layers would leave these unchecked, and an unchecked layer fails (verdict rule 7)
        return (f"a {getattr(lc, 'kind', '?')} layer, recurrent: {OP} computes softmax attention over per-head "
                "K and V; a recurrent state is not one of its inputs")
    if lc.shape != "gqa":
        return f"a {lc.shape} layer has no attention for {OP} to compute"
    if lc.dv != lc.head_dim:
        # measured: the op's output is inferred num_heads x head_size wide (head_size from
        # Q), so a narrower V makes o_proj's MatMul "Incompatible dimensions"
        return (f"V heads {lc.dv} wide against Q/K's {lc.head_dim}: {OP} has one head_size for Q, K and V (its "
                "output is inferred num_heads x head_size)")
    if lc.alibi_max_bias is not None:
        return (f"ALiBi: {OP} has no slopes (its only additive input is attention_bias, a caller-made "
                "[batch, heads, q, total] table)")
    if lc.window is not None and lc.window.kind != "sliding":
        return f"a {lc.window.kind} window: {OP}'s only window is local_window_size, a sliding one"
    if lc.parallel_ssm is not None:
        # falcon_h1 (falcon-h1.cpp:156-160): the layer's residual sums the attention with a
        # Mamba-2 block on the same row; without it the layer's output (resid_mid) is not
        # this graph's, and a layer judged short of its output is unguarded (verdict rule 7)
        return (f"a Mamba-2 block in parallel with the attention, summed into the residual: {OP} computes "
                "the attention alone, not the layer's sum")
    if lc.temperature is not None:
        return f"llama4's per-position query temperature: {OP} has no input that scales Q by position"
    if lc.qk_norm is not None and lc.qk_norm.where == "post_rope":
        return (f"a QK norm after RoPE: {OP} rotates Q and K inside its kernel (do_rotary) and hands back no rotated "
                "query, so nothing can come between its rotary and its scores")
    return None


class _LayerGraph:
    """The ONNX graph of one layer's attention half: inputs ``x`` [B, n, hidden],
    ``past_key`` / ``past_value`` [B, Hkv, P, D], ``seqlens_k`` [B] and
    ``total_sequence_length`` (the op's own); one output per probe."""

    def __init__(self, lc, weights: dict, t_max: int, table=None):
        self.lc, self.w, self.t_max, self.table = lc, weights, t_max, table
        self.nodes, self.inits, self.outputs = [], [], []
        self.width: dict[str, int] = {}  # a tensor's last axis where it is not hidden_size (a head's)

    # ---------------------------------------------------------------- building
    def init(self, name, arr, dtype=np.float32):
        self.inits.append(onnx.numpy_helper.from_array(np.ascontiguousarray(np.asarray(arr, dtype=dtype)), name))
        return name

    def node(self, op, inputs, out, domain="", **attrs):
        outs = [out] if isinstance(out, str) else list(out)
        self.nodes.append(onnx.helper.make_node(op, list(inputs), outs, name=outs[0] + "/" + op, domain=domain, **attrs))
        return out

    def linear(self, x, wname, bname, out):
        y = self.node("MatMul", [x, self.init(out + ".W", self.w[wname].T)], out + ".mm")
        if bname in self.w:
            return self.node("Add", [y, self.init(out + ".b", self.w[bname])], out)
        return self.node("Identity", [y], out)

    def norm(self, x, spec, wname, bname, out):
        """The norm as the model builder writes it: SimplifiedLayerNormalization for
        RMS (gemma's ``1 + w`` folded into the weight, builders/gemma.py
        ``make_layernorm``: ``layernorm.weight + 1``), LayerNormalization for
        LayerNorm, ReduceL2-free RMS without weight for ``l2``."""
        kind = spec.kind
        width = self.w[wname].shape[-1] if wname in self.w else self.width.get(x, self.lc.hidden_size)
        if kind == "none":
            return self.node("Identity", [x], out)
        if wname in self.w and self.w[wname].ndim > 1:
            # one weight per head ([heads, head_dim]: HF StableLmLayerNormPerHead,
            # CohereLayerNorm((num_heads, head_dim))): the ONNX norms take a weight over the
            # normalised axis only, so normalise weight-free and apply the weight (+ 1 for
            # rms1p) and the bias after it, broadcast over [B, n, heads, head_dim]
            wt, b = self.w[wname] + (1.0 if kind == "rms1p" else 0.0), self.w.get(bname) if bname else None
            y = self.norm(x, spec, None, None, out + ".plain")
            y = self.node("Mul", [y, self.init(out + ".gh", wt)], out + (".gm" if b is not None else ""))
            return self.node("Add", [y, self.init(out + ".bh", b)], out) if b is not None else y
        if kind == "layer":
            wt = self.w.get(wname, np.ones(width)) if wname else np.ones(width)
            b = self.w.get(bname, np.zeros(width)) if bname else np.zeros(width)
            return self.node("LayerNormalization", [x, self.init(out + ".g", wt), self.init(out + ".b", b)], out,
                             axis=-1, epsilon=float(spec.eps))
        wt = (self.w[wname] + 1.0 if kind == "rms1p" and wname else
              self.w.get(wname, np.ones(width)) if kind == "rms" and wname else np.ones(width))
        return self.node("SimplifiedLayerNormalization", [x, self.init(out + ".g", wt)], out, axis=-1,
                         epsilon=float(spec.eps))

    def model(self):
        lc, w = self.lc, self.w
        h, hkv, d, dv = lc.n_heads, lc.n_kv_heads, lc.head_dim, lc.dv
        f = onnx.TensorProto.FLOAT
        inputs = [onnx.helper.make_tensor_value_info("x", f, ["B", "n", lc.hidden_size]),
                  onnx.helper.make_tensor_value_info("past_key", f, ["B", hkv, "P", d]),
                  onnx.helper.make_tensor_value_info("past_value", f, ["B", hkv, "P", dv]),
                  onnx.helper.make_tensor_value_info("seqlens_k", onnx.TensorProto.INT32, ["B"]),
                  onnx.helper.make_tensor_value_info("total_sequence_length", onnx.TensorProto.INT32, [])]
        normed = self.norm("x", lc.input_norm, "attn_norm", "attn_norm_b", "attn_in")
        a_in = normed
        if lc.attn_in_multiplier != 1.0:
            # HF FalconH1DecoderLayer.forward `self_attn(hidden_states * attention_in_multiplier)`
            a_in = self.node("Mul", [normed, self.init("attn_in_multiplier", lc.attn_in_multiplier)], "attn_in.m")
        qfull = self.node("MatMul", [a_in, self.init("wq", w["wq"].T)], "q.full")
        gate = None
        if lc.q_gate_interleaved:
            # the gate rides in wq interleaved per head (HF Qwen3NextAttention: torch.chunk
            # of q_proj(x).view(..., head_dim * 2)): split on the head's last axis
            qg = self.node("Reshape", [qfull, self.init("shape.qg", [0, 0, h, 2 * d], np.int64)], "q.gate4")
            q4, g4 = self.node("Split", [qg, self.init("split.qg", [d, d], np.int64)], ["q.q4", "q.g4"], axis=-1)
            qfull = self.node("Reshape", [q4, self.init("shape.q3", [0, 0, h * d], np.int64)], "q.split")
            gate = self.node("Reshape", [g4, self.init("shape.g3", [0, 0, h * d], np.int64)], "gate.raw")
            if "bq_gate" in w:
                gate = self.node("Add", [gate, self.init("bq_gate", w["bq_gate"])], "gate")
        q = self.node("Add", [qfull, self.init("bq", w["bq"])], "q.b") if "bq" in w else qfull
        k = self.linear(a_in, "wk", "bk", "k.b")
        v = self.linear(a_in, "wv", "bv", "v.b")
        if lc.key_multiplier != 1.0:
            # HF FalconH1Attention.forward `k_proj(hidden_states).view(...) * self.key_multiplier`
            k = self.node("Mul", [k, self.init("key_multiplier", lc.key_multiplier)], "k.m")
        if lc.qkv_clamp is not None and lc.qkv_clamp_at == "bias":
            c = float(lc.qkv_clamp)
            lo, hi = self.init("clamp.lo", -c), self.init("clamp.hi", c)
            q, k, v = (self.node("Clip", [t, lo, hi], t + ".clip") for t in (q, k, v))
        q, k, v = (self.node("Identity", [t], name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
        gqa_in = [q, k, v, "past_key", "past_value", "seqlens_k", "total_sequence_length"]
        attrs = {"num_heads": h, "kv_num_heads": hkv, "scale": float(lc.head_dim ** -0.5 if lc.scale is None
                                                                       else lc.scale), "qk_output": 2}
        qn = lc.qk_norm
        if qn is not None and qn.over == "row":
            # olmo2: the whole row normed before the heads split (builders/olmo.py: one
            # SimplifiedLayerNormalization over q_proj's output)
            gqa_in[0] = q = self.norm(q, qn.norm, "q_norm", "q_norm_b", "q.normed")
            gqa_in[1] = k = self.norm(k, qn.norm, "k_norm", "k_norm_b", "k.normed")
        if qn is not None and qn.over == "head":
            # per head, as the model builder writes it for the CPU (Reshape ->
            # SimplifiedLayerNormalization -> Reshape): the op's own q_norm_weight input is
            # refused by its CPU kernel ("GroupQueryAttention (CPU): q_norm_weight /
            # k_norm_weight inputs are not supported ... only on the CUDA and WebGPU EPs")
            for i, (t, nh) in enumerate(((q, h), (k, hkv))):
                name = ("q", "k")[i]
                r = self.node("Reshape", [t, self.init(f"shape.{name}4", [0, 0, nh, d], np.int64)], f"{name}.heads")
                self.width[r] = d
                r = self.norm(r, qn.norm, f"{name}_norm", f"{name}_norm_b", f"{name}.hnormed")
                gqa_in[i] = self.node("Reshape", [r, self.init(f"shape.{name}3", [0, 0, nh * d], np.int64)],
                                      f"{name}.normed")
        if lc.qkv_clamp is not None and lc.qkv_clamp_at == "qk_norm":
            # HF OlmoeAttention.forward: q_norm / k_norm first, THEN clamp_(-clip_qkv, clip_qkv) on q, k, v
            c = float(lc.qkv_clamp)
            lo, hi = self.init("clamp.lo", -c), self.init("clamp.hi", c)
            gqa_in[:3] = [self.node("Clip", [t, lo, hi], f"{n}.clip") for t, n in zip(gqa_in[:3], "qkv")]
        if lc.v_norm is not None:
            # HF Gemma3nTextAttention.forward: v_norm (RMS, no weight) per head before the cache
            r = self.node("Reshape", [gqa_in[2], self.init("shape.v4", [0, 0, hkv, dv], np.int64)], "v.heads")
            self.width[r] = dv
            r = self.norm(r, lc.v_norm, None, None, "v.hnormed")
            gqa_in[2] = self.node("Reshape", [r, self.init("shape.v3", [0, 0, hkv * dv], np.int64)], "v.normed")
        if lc.rope is not None:
            inv = np.asarray(lc.rope.inv_freq, dtype=np.float64)
            if lc.rope.freq_factors is not None:
                # ggml_rope_ext's freq_factors (LongRoPE's short / long set): pair i turns by
                # pos * inv_freq[i] / freq_factors[i] -- the op takes the caller's tables as they are
                inv = inv / np.asarray(lc.rope.freq_factors, dtype=np.float64)
            ang = np.arange(self.t_max, dtype=np.float64)[:, None] * inv[None, :]
            cos, sin = np.cos(ang) * lc.rope.attention_factor, np.sin(ang) * lc.rope.attention_factor
            if self.table is not None:
                cos, sin = self.table(cos, sin)
            gqa_in += [self.init("cos_cache", cos), self.init("sin_cache", sin)]
            attrs.update(do_rotary=1, rotary_interleaved=int(lc.rope.layout == "interleaved"))
        else:
            gqa_in += ["", ""]
        gqa_in += ["", ""]  # position_ids (the op derives them from seqlens_k), attention_bias
        gqa_in.append(self.init("sinks", w["sinks"]) if "sinks" in w else "")
        if lc.window is not None:
            # the op reads keys with q - k < local_window_size, the query itself counted, as
            # HF's window does (measured on its output_qk: size 4 leaves 4 keys a row); the
            # model builder passes config.sliding_window as it is (builders/base.py
            # ``self.window_size = getattr(config, "sliding_window", -1)``)
            attrs["local_window_size"] = int(lc.window.size)
        if lc.softcap is not None:
            attrs["softcap"] = float(lc.softcap)
        while gqa_in and gqa_in[-1] == "":
            gqa_in.pop()
        heads = self.node("GroupQueryAttention", gqa_in, ["attn_heads", "present_key", "present_value", "attn_probs"],
                          domain="com.microsoft", **attrs)[0]
        branch = heads
        if gate is not None:
            branch = self.node("Mul", [branch, self.node("Sigmoid", [gate], "gate.sig")], "branch.qgate")
        if lc.output_gate:
            g = self.linear(normed, "wg", "bg", "og")
            # sigmoid (afmoe.cpp attn_gated) or softplus (HF LagunaAttention.forward F.softplus(g_proj(x)))
            g = self.node("Softplus" if lc.output_gate_fn == "softplus" else "Sigmoid", [g], "og.act")
            if lc.output_gate_per_head:
                # one scalar per head over its v_head_dim channels (HF laguna gate.unsqueeze(-1))
                g = self.node("Reshape", [g, self.init("shape.og4", [0, 0, h, 1], np.int64)], "og.heads")
                b4 = self.node("Reshape", [branch, self.init("shape.b4", [0, 0, h, dv], np.int64)], "branch.heads")
                branch = self.node("Reshape", [self.node("Mul", [b4, g], "branch.ogate4"),
                                               self.init("shape.b3", [0, 0, h * dv], np.int64)], "branch.ogate")
            else:
                branch = self.node("Mul", [branch, g], "branch.ogate")
        if lc.sub_norm is not None:
            branch = self.norm(branch, lc.sub_norm, "sub_norm", None, "branch.sub")
        branch = self.node("Identity", [branch], "attn_branch")
        out = self.node("MatMul", [branch, self.init("wo", w["wo"].T)], "o.mm")
        if lc.o_scale is not None:
            out = self.node("Mul", [out, self.init("o_scale", lc.o_scale)], "o.scaled")
        if "bo" in w:
            out = self.node("Add", [out, self.init("bo", w["bo"])], "o.b")
        if lc.value_scale is not None:
            out = self.node("Mul", [out, self.init("value_scale", lc.value_scale)], "o.vs")
        if lc.post_norm is not None:
            out = self.norm(out, lc.post_norm, "post_norm", "post_norm_b", "o.post")
        if lc.attn_out_multiplier != 1.0:
            # HF FalconH1DecoderLayer.forward: the attention module's output * attn_out_multiplier
            out = self.node("Mul", [out, self.init("attn_out_multiplier", lc.attn_out_multiplier)], "o.aom")
        out = self.node("Identity", [out], "attn_out")
        names = ["attn_in", "q", "k", "v", "present_key", "present_value", "attn_probs", "attn_heads", "attn_branch",
                 "attn_out"]
        if lc.residual == "sequential":
            br = out if lc.residual_multiplier == 1.0 else self.node(
                "Mul", [out, self.init("residual_multiplier", lc.residual_multiplier)], "o.m")
            # what the branch is added to: the input, or (HF MiniMaxDecoderLayer.forward
            # `residual = input_layernorm(x)`) the normed input, times residual_alpha
            base = "x" if lc.residual_base == "input" else normed
            if lc.residual_alpha != 1.0:
                base = self.node("Mul", [base, self.init("residual_alpha", lc.residual_alpha)], "resid.base")
            self.node("Add", [base, br], "resid_mid")
            names.append("resid_mid")
        outputs = [onnx.helper.make_tensor_value_info(n, f, None) for n in names]
        g = onnx.helper.make_graph(self.nodes, "attn_half", inputs, outputs, self.inits)
        return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 21), onnx.helper.make_opsetid("com.microsoft", 1)],
                                 ir_version=10)

    # ---------------------------------------------------------------- running
    def drive(self, sess, xs: list, chunks) -> list[dict]:
        """The sequences ``xs`` (equal lengths) through the op, ``chunks`` rows a
        call, the cache carried; each sequence's probes ``{probe: [T, ...]}``."""
        lc = self.lc
        h, hkv, d, dv = lc.n_heads, lc.n_kv_heads, lc.head_dim, lc.dv
        b, t = len(xs), xs[0].shape[0]
        x = np.stack(xs).astype(np.float32)
        pk = np.zeros((b, hkv, 0, d), np.float32)
        pv = np.zeros((b, hkv, 0, dv), np.float32)
        got: dict[str, list] = {}
        probs = np.zeros((b, h, t, t), np.float64)
        p0 = 0
        for n in chunks:
            feed = {"x": x[:, p0:p0 + n], "past_key": pk, "past_value": pv,
                    "seqlens_k": np.full((b,), p0 + n - 1, np.int32),
                    "total_sequence_length": np.array(p0 + n, np.int32)}
            names = [o.name for o in sess.get_outputs()]
            out = dict(zip(names, sess.run(names, feed)))
            pk, pv = out["present_key"], out["present_value"]
            # output_qk: [B, H, n, total] after the softmax (qk_output = 2)
            probs[:, :, p0:p0 + n, :p0 + n] = out["attn_probs"][..., :p0 + n]
            for name in names:
                if name not in ("present_key", "present_value", "attn_probs"):
                    got.setdefault(name, []).append(out[name])
            p0 += n
        cat = {k: np.concatenate(v, axis=1).astype(np.float64) for k, v in got.items()}
        res = []
        for s in range(b):
            one = {
                "attn_in": cat["attn_in"][s],
                "q": cat["q"][s].reshape(t, h, d),
                "k": cat["k"][s].reshape(t, hkv, d),
                "v": cat["v"][s].reshape(t, hkv, dv),
                # the op's cache after the last call: every key it attended with, after its
                # QK norm and rotary ([Hkv, T, D] -> [T, Hkv, D])
                "k_rope": np.transpose(pk[s, :, :t], (1, 0, 2)).astype(np.float64),
                "attn_probs": probs[s],
                "attn_heads": cat["attn_heads"][s].reshape(t, h, dv),
                "attn_branch": cat["attn_branch"][s],
                "attn_out": cat["attn_out"][s],
            }
            if "resid_mid" in cat:
                one["resid_mid"] = cat["resid_mid"][s]
            res.append(one)
        return res
