"""``ort-genai``: the whole model as onnxruntime-genai's model builder writes it,
run by ONNX Runtime from the tokens (free-running).

The case's model is saved as an HF checkpoint and handed to the builder as its
documented command (``python -m onnxruntime_genai.models.builder -i CKPT -o OUT
-p fp32 -e cpu``), which writes ``model.onnx``: embeddings, per layer
``SimplifiedLayerNormalization`` / ``SkipSimplifiedLayerNormalization``, the
Q/K/V MatMuls, ``com.microsoft.GroupQueryAttention`` with its rotary, ``o_proj``,
the MLP, the head. Its own tensor names (``/model/layers.{i}/...``) locate the
probes, which are made graph outputs; nothing the builder wrote is changed but
one attribute that adds an output: ``qk_output = 2`` on each attention node, so
its ``output_qk`` (the probabilities) can be read.

Probes, per layer: ``layer_in`` (the input norm's input; the skip norm's
``input_skip_bias_sum`` output after layer 0), ``attn_in`` (the input norm's
output), ``q`` / ``k`` / ``v`` (the projections the op is fed, traced back through
any norm or reshape to the MatMul / bias Add that made them), ``k_rope`` (the
op's ``present`` key after the last call), ``attn_probs`` (``output_qk``),
``attn_heads`` (the op's output), ``attn_branch`` (what ``o_proj`` reads),
``attn_out`` (the skip input of the next skip norm: what is added to the
residual) and ``resid_mid`` (that norm's ``input_skip_bias_sum``), ``layer_out``
(the next layer's ``layer_in``; the final norm's sum for the last layer); and
``embeddings``, ``final_norm``, ``logits``. A probe the builder's graph names
no tensor for is ``not-exposed`` saying so; ``q_rope`` where the op rotates Q
inside its kernel (``do_rotary``), and read at the op's query input where the
builder rotates outside it (a ``RotaryEmbedding`` node: hunyuan's QK norm after
RoPE).

The case's schedule drives the calls (``input_ids`` rows a call, the KV cache
``past_key_values.{i}.*`` -> ``present.{i}.*`` carried), each sequence alone. A
family the builder refuses ("NotImplementedError: The ... model is not
currently supported") is ``skipped`` in its words.
"""

from __future__ import annotations

import subprocess
import sys
import re
import json

import numpy as np

from ..api import Candidate, CandidateCapture
from . import checkpoint, require, said, scratch, version
from harness.lazy import lazy
from contract.probes import LAYER_PROBES
from ...schedule import chunk_sizes

onnx = lazy("onnx")
ort = lazy("onnxruntime")

NO_Q_ROPE = "GroupQueryAttention rotates Q inside its kernel and returns no rotated query"
PASS_THROUGH = ("Reshape", "Transpose", "Identity", "SimplifiedLayerNormalization", "LayerNormalization", "Cast",
                "RMSNormalization")


class OrtGenai(Candidate):
    teacher_forced = False
    engine_packages = ("onnxruntime-genai", "onnxruntime", "onnx")
    description = ("onnxruntime-genai's model builder (fp32, cpu) run by ONNX Runtime, free-running, its named layer "
                   "tensors exposed (the extra .[engines])")

    def validate(self, case) -> None:
        require("onnxruntime", self.name)
        require("onnx", self.name)
        require("onnxruntime_genai", self.name)

    def unsupported(self, run) -> str | None:
        if run.case.dtype != "float32":
            return f"{self.name} builds with -p fp32 (float32 inputs and outputs), not {run.case.dtype}"
        ok, why = self._built(run)
        if not ok:
            return why
        # what the builder writes, ORT's kernel may still refuse (nemotron's and phi's partial
        # rotary: "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8"): the
        # run itself, ORT's own words if a node refuses it -- any other exception stays an error
        try:
            self._probes(run)
        except Exception as e:
            if type(e).__name__ == "InvalidArgument" and "Non-zero status code returned while running" in str(e):
                return f"onnxruntime {version('onnxruntime')} refuses the builder's model: {said(e)}"
        return None

    def _probes(self, run):
        def make():
            ok, model = self._built(run)
            if not ok:
                raise RuntimeError(model)
            return _run(run, model)

        return run.memo("ort_genai_probes", make)

    def _built(self, run):
        return run.memo("ort_genai_model", lambda: _build(run))

    def capture(self, run, rc) -> CandidateCapture:
        probes, hidden = self._probes(run)
        cap = CandidateCapture(self.name, "float32", dict(probes),
                               meta={"engine": f"onnxruntime {version('onnxruntime')}, onnxruntime-genai "
                                               f"{version('onnxruntime-genai')} model builder"})
        cap.not_exposed.update(hidden)
        cap.not_exposed["q_rope"] = NO_Q_ROPE
        return cap


def _build(run):
    """Run the builder on the case's checkpoint: ``(True, onnx ModelProto with the
    probes as outputs, and where each lies)`` or ``(False, the builder's own words)``."""

    out = scratch(run, "ort-genai")
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint(run)), "-o", str(out),
           "-p", "fp32", "-e", "cpu", "-c", str(scratch(run, "ort-genai-cache"))]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0 or not (out / "model.onnx").exists():
        lines = [ln.strip() for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln or "not" in ln), lines[-1] if lines
                    else f"exit {p.returncode}")
        # the builder names the model by its input path: say the architecture instead (a
        # row's reason is the same on every machine)
        last = last.replace(str(checkpoint(run)), run.config.architectures[0] if getattr(
            run.config, "architectures", None) else type(run.base_model).__name__)
        return False, f"onnxruntime-genai {version('onnxruntime-genai')} model builder refuses it: {last[:300]}"

    model = onnx.load(str(out / "model.onnx"), load_external_data=True)
    return True, model


def _layer_of(name: str):
    m = re.match(r"/model/layers\.(\d+)/", name)
    return int(m.group(1)) if m else None


def _locate(model, layer_cfgs):
    """``{probe key: (tensor name, how to read it)}`` from the builder's node names,
    and ``{probe key: why not}`` for the ones its graph names no tensor for."""
    g = model.graph
    n_layers = len(layer_cfgs)
    producer = {o: n for n in g.node for o in n.output if o}
    found, hidden = {}, {}
    by_layer: dict[int, list] = {}
    for n in g.node:
        i = _layer_of(n.name)
        if i is not None:
            by_layer.setdefault(i, []).append(n)

    def source(t):
        """``(the tensor the op's input comes from before any reshape, norm or rotary --
        the projection's output, the contract's q / k / v --, whether a rotary lay on the
        way)``. A RotaryEmbedding node lies there where the builder rotates outside the op
        (``use_rope_in_attn`` False: builders/base.py ``make_attention_qk_rope``), in either
        order with the QK norm -- hunyuan's norm after RoPE (builders/hunyuan.py
        ``make_attention_qk_rope_and_norm``, as HF's ``HunYuanDenseV1Attention.forward``,
        modeling_hunyuan_v1_dense.py:194-201, projects, rotates, then norms). Stopping at it
        read the rotated, normed query as ``q`` (hunyuan_v1_dense L0 q NMSE 0.59, k 0.66,
        every later probe passing)."""
        rotated = False
        while t in producer and producer[t].op_type in PASS_THROUGH + ("RotaryEmbedding",):
            rotated = rotated or producer[t].op_type == "RotaryEmbedding"
            t = producer[t].input[0]
        return t, rotated

    for i in range(n_layers):
        nodes = by_layer.get(i, [])
        norm = next((n for n in nodes if "input_layernorm" in n.name), None)
        gqa = next((n for n in nodes if n.op_type == "GroupQueryAttention"), None)
        if norm is not None:
            found[f"L{i}.attn_in"] = norm.output[0]
            if "Skip" in norm.op_type:
                found[f"L{i}.layer_in"] = ("sum", norm)
                if i > 0:
                    found[f"L{i - 1}.layer_out"] = ("sum", norm)
            else:
                found[f"L{i}.layer_in"] = norm.input[0]
                if i == 0:
                    found["embeddings"] = norm.input[0]
        if gqa is None:
            continue
        found[f"L{i}.attn_heads"] = gqa.output[0]
        found[f"L{i}.k_rope"] = ("present", gqa)
        windowed = any(a.name == "sliding_window_cache" and a.i == 1 for a in gqa.attribute)
        if windowed:
            hidden[f"L{i}.attn_probs"] = ("GroupQueryAttention's output_qk on a window-sized cache: 'GroupQueryAttention "
                                          "(CPU): qk_output is not implemented with sliding_window_cache=1'")
        else:
            found[f"L{i}.attn_probs"] = ("qk", gqa)
        if gqa.input[1] and gqa.input[2]:
            (q, rotated), (k, _), (v, _) = (source(t) for t in gqa.input[:3])
            found[f"L{i}.q"], found[f"L{i}.k"], found[f"L{i}.v"] = q, k, v
            rotary_in_op = any(a.name == "do_rotary" and a.i == 1 for a in gqa.attribute)
            if rotated and not rotary_in_op:
                # the query the op is fed is already rotated (and normed, where a norm
                # follows RoPE): what enters the score product, the contract's q_rope
                found[f"L{i}.q_rope"] = gqa.input[0]
        else:
            found[f"L{i}.qkv"] = source(gqa.input[0])[0]  # packed: split by the op's head counts
        after = nodes[nodes.index(gqa) + 1:]
        o = next((n for n in after if n.op_type == "MatMul" and "o_proj" in n.name), None)
        if o is not None:
            found[f"L{i}.attn_branch"] = o.input[0]
        skip = next((n for n in after if "Skip" in n.op_type), None)
        if skip is not None and "input_layernorm" not in skip.name:
            t = skip.input[1]
            lc = layer_cfgs[i]
            if getattr(lc, "residual_multiplier", 1.0) != 1.0 and t in producer and producer[t].op_type == "Mul":
                # granite: the branch times residual_multiplier is what the skip norm adds
                # (builders/granite.py); attn_out is the branch before it
                t = next(x for x in producer[t].input if x in producer and producer[x].op_type != "Constant")
            found[f"L{i}.attn_out"] = t
            found[f"L{i}.resid_mid"] = ("sum", skip)
    final = next((n for n in g.node if "final_norm" in n.name), None)
    if final is not None:
        found["final_norm"] = final.output[0]
        if "Skip" in final.op_type:
            found[f"L{n_layers - 1}.layer_out"] = ("sum", final)
    return found, hidden


def _cache_dims(lc, name: str, windowed: dict) -> tuple:
    """A first call's cache input, [Hkv, rows, D] (the builder's dims are symbolic):
    empty, or for a layer the builder gave a window-sized cache
    (``sliding_window_cache = 1``; genai_config.json ``sliding_window``) that
    capacity, as onnxruntime-genai's runtime sizes it (``window_size`` +
    ``cache_slack``) -- the op refuses less ("KV cache capacity (0) must be at
    least local_window_size")."""
    layer = int(name.split(".")[1])
    return (lc.n_kv_heads, windowed.get(layer, 0), lc.dv if name.endswith(".value") else lc.head_dim)


def _windowed(model_dir) -> dict:
    """``{layer: cache capacity}`` of the layers with a window-sized cache (genai_config.json)."""
    try:
        cfg = json.loads((model_dir / "genai_config.json").read_text())
    except (OSError, ValueError):
        return {}
    sw = cfg.get("model", {}).get("decoder", {}).get("sliding_window")
    if not sw:
        return {}
    cap = int(sw.get("window_size", 0)) + int(sw.get("cache_slack", 0) or 0)
    return {int(i): cap for i in sw.get("layers", [])}


def _run(run, model):
    """Run ``model`` from the case's tokens on its schedule; ``(probes, not_exposed)``."""
    found, hidden = _locate(model, run.layer_cfgs)
    g = model.graph
    outs = {o.name for o in g.output}
    want: dict[str, str] = {}  # probe key -> tensor name read
    for key, where in found.items():
        if isinstance(where, str):
            want[key] = where
        elif where[0] == "sum":  # a skip norm's input_skip_bias_sum (its output 3)
            node = where[1]
            while len(node.output) < 4:
                node.output.append("")
            if not node.output[3]:
                node.output[3] = node.name + "/input_skip_bias_sum"
            want[key] = node.output[3]
        elif where[0] == "qk":
            node = where[1]
            for a in node.attribute:
                if a.name == "qk_output":
                    node.attribute.remove(a)
                    break
            node.attribute.append(onnx.helper.make_attribute("qk_output", 2))
            while len(node.output) < 4:
                node.output.append("")
            node.output[3] = node.name + "/output_qk"
            want[key] = node.output[3]
        elif where[0] == "present":
            want[key] = where[1].output[1]
    for t in sorted(set(want.values()) - outs):
        g.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 4
    # as the builder wrote it, no further fusion: the probes' tensors must survive
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    names = sorted(set(want.values()) | {"logits"})
    tokens = run.tokens
    t_all = tokens.shape[1]
    windowed = _windowed(scratch(run, "ort-genai"))
    per_seq = []
    for row in tokens:
        past = {n: np.zeros([1, *_cache_dims(run.layer_cfgs[int(n.split(".")[1])], n, windowed)], np.float32)
                for n in inputs if n.startswith("past_key_values.")}
        # a recurrent layer's state (lfm2's short conv: `past.{i}.conv` -> `present.{i}.conv`, the
        # builder's names), zero at the start, carried like the KV cache; its dims but the batch are static
        past.update({n: np.zeros([1, *(d if isinstance(d, int) else 1 for d in inputs[n].shape[1:])], np.float32)
                     for n in inputs if n.startswith("past.")})
        got: dict[str, list] = {}
        probs = {}
        p0 = 0
        for n in chunk_sizes(run.case.schedule, t_all):
            feed = {"input_ids": row[None, p0:p0 + n].astype(np.int64)}
            if "attention_mask" in inputs:
                feed["attention_mask"] = np.ones((1, p0 + n), np.int64)
            if "position_ids" in inputs:
                feed["position_ids"] = np.arange(p0, p0 + n, dtype=np.int64)[None]
            feed.update(past)
            res = dict(zip(names + [o.name for o in sess.get_outputs() if o.name.startswith("present.")],
                           sess.run(names + [o.name for o in sess.get_outputs() if o.name.startswith("present.")],
                                    feed)))
            for pn in past:
                past[pn] = res[pn.replace("past_key_values.", "present.") if pn.startswith("past_key_values.")
                               else "present." + pn[len("past."):]]
            for key, t in want.items():
                if key.endswith(".attn_probs"):
                    full = probs.setdefault(key, np.zeros(res[t].shape[:2] + (t_all, t_all)))
                    full[:, :, p0:p0 + n, :p0 + n] = res[t][..., :p0 + n]
                elif not key.endswith(".k_rope"):
                    got.setdefault(key, []).append(res[t])
            got.setdefault("logits", []).append(res["logits"])
            p0 += n
        one = {k: np.concatenate(v, axis=1)[0].astype(np.float64) for k, v in got.items()}
        one.update({k: v[0] for k, v in probs.items()})
        for key, t in want.items():
            if key.endswith(".k_rope") and int(key[1:].split(".")[0]) not in windowed:
                # the cache after the last call, [1, Hkv, T, D]
                one[key] = np.transpose(res[t][0], (1, 0, 2)).astype(np.float64)
        per_seq.append(one)
    probes = {k: np.stack([s[k] for s in per_seq]) for k in per_seq[0]}
    # canonical layouts (contract.probes): heads split off
    for i, lc in enumerate(run.layer_cfgs):
        h, hkv, d, dv = (getattr(lc, a, 0) for a in ("n_heads", "n_kv_heads", "head_dim", "dv"))
        qkv = probes.pop(f"L{i}.qkv", None)
        if qkv is not None:
            probes[f"L{i}.q"], probes[f"L{i}.k"], probes[f"L{i}.v"] = np.split(qkv, [h * d, h * d + hkv * d], -1)
        for p, heads, width in (("q", h, d), ("q_rope", h, d), ("k", hkv, d), ("v", hkv, dv), ("attn_heads", h, dv)):
            key = f"L{i}.{p}"
            if key in probes:
                probes[key] = probes[key].reshape(probes[key].shape[:2] + (heads, width))
        if i in windowed:
            hidden[f"L{i}.k_rope"] = (f"the builder gave layer {i} a window-sized cache (sliding_window_cache = 1: "
                                      "its present_key holds only the most recent positions)")
        for p in LAYER_PROBES:
            key = f"L{i}.{p}"
            if key not in probes and key not in hidden and p != "q_rope":
                hidden[key] = f"the model builder's graph names no tensor for {p} in layer {i}"
    for p in ("embeddings", "final_norm"):
        if p not in probes:
            hidden[p] = f"the model builder's graph names no tensor for {p}"
    return probes, hidden
