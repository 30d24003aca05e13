"""``openvino``: the HF model converted by OpenVINO's own converter and run by its
CPU plugin, free-running from the tokens.

``openvino.convert_model`` traces the case's model (``input_ids`` and an
all-ones ``attention_mask``: without a mask transformers' packed-sequence check
emits ``aten::diff``, which the converter has no rule for -- "No conversion rule
found for operations: aten::diff") and its transformations fuse what they
recognise (the eager attention becomes its ``ScaledDotProductAttention`` op);
the CPU plugin compiles it at ``INFERENCE_PRECISION_HINT = f32``. The whole
sequence runs in one call: the converted graph has no cache inputs (a stateful
KV cache is optimum-intel's export, not the converter's), so the case's
schedule is not what it runs -- prefill only.

Probes are read where the graph names a module boundary (the converter names
every op ``__module.<HF module path>/<aten op>``): per layer ``layer_in`` (what
the input norm reads), ``attn_in`` (its output), ``q`` / ``k`` / ``v`` (the
``q_proj`` / ``k_proj`` / ``v_proj`` outputs), ``attn_branch`` (what ``o_proj``
reads; and ``attn_heads``, the same tensor, where the layer has no gate or
sub-norm between), ``attn_out`` (``o_proj``'s output, where nothing follows it
before the residual), ``resid_mid`` (the decoder layer's first residual add),
``layer_out`` (its last op); ``embeddings`` (the token embedding's output, where it is layer 0's input),
``final_norm``, ``logits``. ``q_rope`` / ``k_rope`` (ops inside the attention
module, no boundary of their own) and ``attn_probs`` (inside the fused
``ScaledDotProductAttention``) are ``not-exposed``. A model the converter
cannot convert is ``skipped`` in its words.
"""

from __future__ import annotations

import numpy as np

from ..api import Candidate, CandidateCapture
from . import require, said, version
from harness.lazy import lazy
from contract.probes import LAYER_PROBES

torch = lazy("torch")
ov = lazy("openvino")

INSIDE = ("the converted graph names it by no module boundary (RoPE's ops lie inside the attention module: "
          "__module.<path>.self_attn/aten::...)")
FUSED = "inside OpenVINO's fused ScaledDotProductAttention op (the softmax never leaves it)"


class OpenVino(Candidate):
    teacher_forced = False
    engine_packages = ("openvino",)
    description = ("OpenVINO: the HF model through openvino.convert_model, its CPU plugin at f32, free-running, "
                   "layer boundaries as outputs (the extra .[engines])")

    def validate(self, case) -> None:
        require("openvino", self.name)

    def unsupported(self, run) -> str | None:
        if run.case.dtype != "float32":
            return f"{self.name} compiles at INFERENCE_PRECISION_HINT=f32, not {run.case.dtype}"
        ok, why = self._converted(run)
        return None if ok else why

    def _converted(self, run):
        return run.memo("openvino_model", lambda: _convert(run))

    def capture(self, run, rc) -> CandidateCapture:
        def make():
            ok, conv = self._converted(run)
            if not ok:
                raise RuntimeError(conv)
            return _run(run, *conv)

        probes, hidden = run.memo("openvino_probes", make)
        cap = CandidateCapture(self.name, "float32", dict(probes),
                               meta={"engine": f"openvino {version('openvino')}"})
        cap.not_exposed.update(hidden)
        cap.not_exposed["q_rope"] = INSIDE
        cap.not_exposed["k_rope"] = INSIDE
        cap.not_exposed["attn_probs"] = FUSED
        return cap


def _convert(run):
    ov = require("openvino", "openvino")

    model = run.base_model

    class Causal(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    ids = torch.as_tensor(run.tokens)
    try:
        with torch.no_grad():
            # one forward first: HF's LongRoPE caches its long-factor table on the module in its
            # first call (modeling_rope_utils.py longrope_frequency_update, `setattr(self,
            # f"{prefix}long_inv_freq", ...)`), so the tracer's two runs of a fresh model build
            # different graphs and it refuses ("Tracing failed sanity checks! ERROR: Graphs
            # differed across invocations!": phi3, minicpm3); the same values either way
            Causal(model).eval()(ids, torch.ones_like(ids))
            ovm = ov.convert_model(Causal(model).eval(), example_input=(ids, torch.ones_like(ids)))
    except Exception as e:  # the converter's own refusal
        return False, f"openvino {version('openvino')} convert_model: {said(e)}"
    return True, (ovm,)


NORM = ("norm", "ln_")
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "dense", "out_proj", "Wqkv", "c_attn", "query_key_value")


def _is_norm(name: str, module) -> bool:
    return any(k in type(module).__name__.lower() or k in name for k in NORM)


def _module_tree(model, n_layers: int) -> dict:
    """Where the probes' modules lie in the HF model (their paths name the
    converted ops): the ModuleList of ``n_layers`` decoder layers, in each the
    norm registered before the attention module, the attention module's
    q/k/v/o projections (``q_proj`` ... ``o_proj``, ``dense``, ``out_proj``), and
    the model's final norm (the norm registered after the layers, beside them)."""

    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers]
    path, layers = lists[0] if lists else (None, [])
    # the token embedding: what HF's capture records as `embeddings` (a multiplier the
    # model's forward applies after it, afmoe's muP, is layer 0's input, not this)
    embed = next((n for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)), None)
    out = {"layers": [], "final_norm": None, "embed": embed}
    for i, layer in enumerate(layers):
        kids = list(layer.named_children())
        # the attention module (it has modules of its own), not a norm or a dropout named
        # after it: gpt_neox registers
        # `post_attention_layernorm` and `post_attention_dropout` before `attention` (HF
        # GPTNeoXLayer.__init__), which the name alone picked (no projection found, every
        # attention probe not-exposed)
        attn = next(((n, m) for n, m in kids if ("attn" in n or "attention" in n.lower())
                     and next(m.children(), None) is not None), (None, None))
        before = kids[:kids.index(attn)] if attn[0] else []
        inner = list(attn[1].named_children()) if attn[1] is not None else []
        sub = next(((n, m) for n, m in inner if "attn" in n or "attention" in n.lower()), None)
        if sub is not None and not any(n in dict(inner) for n in PROJ):
            # the attention one module deeper, its norms beside it: dbrx's block holds
            # `norm_attn_norm` (HF DbrxNormAttentionNorm: norm_1, attn, norm_2,
            # modeling_dbrx.py:355-393); read at the container, no norm and no projection
            # was found (every probe of its attention not-exposed)
            kids = [(f"{attn[0]}.{n}", m) for n, m in inner]
            before = before + kids[:inner.index(sub)]
            attn = kids[inner.index(sub)]
        # HF's usual name wherever it is registered (afmoe registers it after self_attn),
        # else the first norm registered before the attention (bloom's ln_1, mpt's norm_1)
        norm = "input_layernorm" if "input_layernorm" in dict(kids) else next(
            (n for n, m in before if _is_norm(n, m)), None)
        proj = dict(attn[1].named_children()) if attn[1] is not None else {}
        at = f"{path}.{i}.{attn[0]}"
        pick = lambda *names: next((f"{at}.{n}" for n in names if n in proj), None)  # noqa: E731
        o_mod = next((proj[n] for n in ("o_proj", "dense", "out_proj") if n in proj), None)
        # a parallel SSM branch's output projection (falcon_h1's `mamba.out_proj`: FalconH1Mixer
        # returns its output, modeling_falcon_h1.py:824)
        ssm = next((f"{path}.{i}.{n}.out_proj" for n, m in layer.named_children()
                    if "mamba" in n and hasattr(m, "out_proj")), None)
        out["layers"].append({"path": f"{path}.{i}", "norm": f"{path}.{i}.{norm}" if norm else None, "ssm_out": ssm,
                              "o_bias": getattr(o_mod, "bias", None) is not None,
                              "q": pick("q_proj"), "k": pick("k_proj"), "v": pick("v_proj"),
                              "o": pick("o_proj", "dense", "out_proj")})
    if path:
        parent, _, name = path.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        kids = [n for n, _ in owner.named_children()]
        after = kids[kids.index(name) + 1:] if name in kids else []
        fn = next((n for n in after if any(k in n for k in NORM)), None)
        out["final_norm"] = f"{parent}.{fn}" if fn and parent else fn
    return out


def _run(run, ovm):
    ops = list(ovm.get_ordered_ops())
    names = [op.get_friendly_name() for op in ops]
    tree = _module_tree(run.base_model, len(run.layer_cfgs))

    def in_module(path):
        if path is None:
            return []
        key = "__module.m." + path
        return [op for op, n in zip(ops, names) if n.split("/")[0] == key]

    def in_tree(path):
        """The ops of the module at ``path`` and of every module under it."""
        key = "__module.m." + path
        return [op for op, n in zip(ops, names) if n.split("/")[0] == key or n.startswith(key + ".")]

    def same(a, b):
        return (a.get_node().get_friendly_name(), a.get_index()) == (b.get_node().get_friendly_name(), b.get_index())

    def scaled(out, value):
        """The tensor HF's forward makes of module output ``out`` by multiplying it by the
        constant ``value`` on its next line, with no module boundary after it (falcon_h1:
        ``k_proj(h).view(..).transpose(1, 2) * self.key_multiplier``, modeling_falcon_h1.py:209;
        ``attention_hidden_states * self.attn_out_multiplier``, :935): ``out``'s consumers
        followed through the view / transpose to the Multiply by a Constant of that value.
        ``(tensor, heads_first)`` -- heads_first where a Transpose was crossed ([S, H, T, D]) --
        or None where the graph holds no such Multiply (a transformation folded it)."""
        frontier, heads_first = [out], False
        for _ in range(4):
            nxt = []
            for o in frontier:
                for inp in o.get_target_inputs():
                    node = inp.get_node()
                    kind = node.get_type_name()
                    if kind == "Multiply":
                        c = node.input_value(1 - inp.get_index()).get_node()
                        if c.get_type_name() == "Constant" and np.allclose(c.get_data(), value, rtol=1e-6, atol=0):
                            return node.output(0), heads_first
                    elif kind in ("Reshape", "Transpose"):
                        heads_first = heads_first or kind == "Transpose"
                        nxt.append(node.output(0))
            frontier = nxt
        return None

    def last(path):
        got = in_module(path)
        return got[-1].output(0) if got else None

    def first_input(path):
        """What the module reads: the first input of its ops that comes from outside it."""
        mine = in_module(path)
        inside = {op.get_friendly_name() for op in mine}
        for op in mine:
            for j in range(op.get_input_size()):
                src = op.input_value(j)
                node = src.get_node()
                if node.get_friendly_name() not in inside and node.get_type_name() != "Constant":
                    if node.get_type_name() == "MVN" and not any(m.get_type_name() == "MVN" for m in mine):
                        # the norm's own MVN was merged into another norm's by OpenVINO's
                        # common-subexpression pass: gpt_neox's parallel block normalizes the same
                        # x twice (HF GPTNeoXLayer.forward, use_parallel_residual:
                        # input_layernorm(x), post_attention_layernorm(x)), and input_layernorm's
                        # scale reads post_attention_layernorm's MVN -- its input is what the
                        # norm reads (read there, layer_in was the normalized row: NMSE 0.017)
                        return node.input_value(0)
                    return src
        return None

    want, hidden = {}, {}
    heads_first: set = set()  # probes read as [S, H, T, D] (after the forward's transpose)
    n = len(run.layer_cfgs)
    if len(tree["layers"]) != n:
        # no module list holds one module per layer: a model that re-runs its layers
        # (hrm_text's L and H stacks, Family.invocation_order: 12 invocations of 4 modules in
        # the tiny config) -- the converter names each invocation's ops by the module's one
        # path (`...L_module.layers.0/aten::add/Add`, `Add_2`, ...), so no boundary is one layer's
        why = ("the model re-runs its decoder-layer modules (each invocation a layer) and the converted graph names "
               "every invocation's ops by the module's one path" if run.family.invocation_order(run.config)
               else "no module list of the model holds one decoder layer per layer")
        hidden.update({f"L{i}.{p}": why for i in range(n) for p in LAYER_PROBES})
        n = 0
    for i, lc in enumerate(run.layer_cfgs[:n]):
        t = tree["layers"][i]
        if t["norm"] is not None:
            want[f"L{i}.layer_in"] = first_input(t["norm"])
            want[f"L{i}.attn_in"] = last(t["norm"])
        for p in ("q", "k", "v"):
            if getattr(lc, "qkv_clamp", None) is not None:
                # the clamp (HF OlmoAttention.forward: clamp_(-clip_qkv, clip_qkv)) is no
                # module: the projection's boundary is before it, the probe after it
                hidden[f"L{i}.{p}"] = (f"the QKV clamp follows {p}_proj in the forward with no module "
                                       f"boundary after it (layer {i})")
                continue
            want[f"L{i}.{p}"] = last(t[p])
        if getattr(lc, "key_multiplier", 1.0) != 1.0 and want.get(f"L{i}.k") is not None:
            # the contract's k is k_proj's output times key_multiplier (HF FalconH1Attention.forward,
            # modeling_falcon_h1.py:209); read at k_proj's boundary it failed at NMSE 1 (key_multiplier
            # 0.5: (1 - 0.5)^2 / 0.5^2) while every later probe passed
            got = scaled(want[f"L{i}.k"], lc.key_multiplier)
            if got is None:
                del want[f"L{i}.k"]
                hidden[f"L{i}.k"] = (f"key_multiplier follows k_proj in the forward and the compiled graph holds no "
                                     f"Multiply by it (layer {i})")
            else:
                want[f"L{i}.k"], first = got
                if first:
                    heads_first.add(f"L{i}.k")
        if getattr(lc, "parallel_ssm", None) is not None and t["ssm_out"] is not None:
            # the contract's ssm_out is the mixer's output times ssm_out_multiplier
            # (FalconH1DecoderLayer.forward, modeling_falcon_h1.py:924)
            m = getattr(lc, "ssm_out_multiplier", 1.0)
            got = last(t["ssm_out"])
            got = got if got is None or m == 1.0 else (scaled(got, m) or (None,))[0]
            if got is not None:
                want[f"L{i}.ssm_out"] = got
        o = in_module(t["o"])
        want[f"L{i}.attn_branch"] = o[0].input_value(0) if o else None
        plain = getattr(lc, "kind", "") == "attention" and not (lc.q_gate_interleaved or lc.output_gate
                                                                 or lc.sub_norm)
        if getattr(lc, "value_scale", None) is not None:
            # mimo_v2_flash: HF scales V at its projection (modeling_mimo_v2_flash.py:380
            # `v_proj(hidden_states)... * self.v_scale`), so o_proj reads heads * value_scale
            # where the contract's attn_heads / attn_branch are before the scale (it applies
            # value_scale after wo, mimo2.cpp); read there they failed at NMSE (1 - 0.707)^2
            why = (f"o_proj reads the heads times value_scale (HF MiMoV2FlashAttention scales V at v_proj); the "
                   f"probe is before the scale and no boundary holds it (layer {i})")
            hidden[f"L{i}.attn_branch"] = hidden[f"L{i}.attn_heads"] = why
            del want[f"L{i}.attn_branch"]
            plain = False
        if plain:
            want[f"L{i}.attn_heads"] = want[f"L{i}.attn_branch"]
        if plain and lc.post_norm is None and lc.value_scale is None and lc.o_scale is None:
            o_last = in_module(t["o"])[-1] if in_module(t["o"]) else None
            if o_last is not None and t["o_bias"] and o_last.get_type_name() == "MatMul":
                # granite: the transformations moved o_proj's bias past the residual
                # multiplier (one Add of x.W*m and b*m, named after the layer's aten::mul), so
                # no tensor holds x.W + b
                hidden[f"L{i}.attn_out"] = ("OpenVINO's transformations folded o_proj's bias into the next op "
                                            "(the residual multiplier): no tensor of the compiled graph holds it")
            else:
                want[f"L{i}.attn_out"] = last(t["o"])
            m = getattr(lc, "attn_out_multiplier", 1.0)
            if m != 1.0 and want.get(f"L{i}.attn_out") is not None:
                # the contract's attn_out is the attention's output times attention_out_multiplier
                # (HF FalconH1DecoderLayer.forward, modeling_falcon_h1.py:935); read at o_proj's
                # boundary it failed at NMSE 0.0123 ((1 - 0.9)^2 / 0.9^2)
                got = scaled(want[f"L{i}.attn_out"], m)
                if got is None:
                    del want[f"L{i}.attn_out"]
                    hidden[f"L{i}.attn_out"] = ("attention_out_multiplier follows the attention in the forward and "
                                                f"the compiled graph holds no Multiply by it (layer {i})")
                else:
                    want[f"L{i}.attn_out"] = got[0]
        # the layer's own residual adds: Adds the trace named aten::add (a bias folded
        # into an Add keeps the name of the op it replaced, granite's aten::mul)
        own = [op for op in in_module(t["path"]) if op.get_type_name() == "Add"
               and "/aten::add" in op.get_friendly_name()]
        if getattr(lc, "residual", "sequential") == "sequential":
            # resid_mid is the layer's input plus the attention branch: the first aten::add
            # anywhere under the layer that reads the layer's input, wherever the model's
            # forward does it -- dbrx adds it inside a submodule (DbrxNormAttentionNorm.forward,
            # modeling_dbrx.py:388 `hidden_states + residual_states`), and the one add under
            # the block's own name is the second residual (:427; read as resid_mid it failed
            # at NMSE 0.095 while layer_out passed). Else, the first of the layer's own adds
            # where it has two (a residual on another tensor: minimax's normed input)
            x = want.get(f"L{i}.layer_in")
            reads_x = [op for op in in_tree(t["path"]) if op.get_type_name() == "Add"
                       and "/aten::add" in op.get_friendly_name() and x is not None
                       and any(same(op.input_value(j), x) for j in range(op.get_input_size()))]
            if reads_x:
                want[f"L{i}.resid_mid"] = reads_x[0].output(0)
            elif len(own) >= 2:
                want[f"L{i}.resid_mid"] = own[0].output(0)
        if own:
            want[f"L{i}.layer_out"] = own[-1].output(0)
    # layer_out is what the next layer's input norm reads (the final norm's input after the
    # last layer), where the graph names that norm: the layer's own last aten::add is not
    # always its output -- mpt's second residual add lies inside its MLP module
    # (modeling_mpt.py MptMLP.forward `output = output + residual`), so the last add under
    # the layer's own name was the first residual (read there, layer_out failed at NMSE 0.228
    # while the next layer's layer_in passed)
    for i in range(n):
        nxt = (tree["layers"][i + 1]["norm"] if i + 1 < n else tree["final_norm"])
        src = first_input(nxt) if nxt is not None else None
        if src is not None:
            want[f"L{i}.layer_out"] = src
    want["final_norm"] = last(tree["final_norm"])
    # `embeddings` where the token embedding IS layer 0's input; where the model's forward
    # scales it between (granite's embedding_multiplier, afmoe's muP) the families' probe
    # sits on either side of the multiplier, so it is not read here (layer 0's input is)
    emb, l0 = last(tree["embed"]), want.get("L0.layer_in")
    if emb is not None and l0 is not None and emb.get_node().get_friendly_name() == l0.get_node().get_friendly_name():
        want["embeddings"] = emb
    elif emb is not None and l0 is not None:
        hidden["embeddings"] = ("the model scales its token embedding before layer 0 (a multiplier in its forward); "
                                "layer 0's input is compared instead")
    want = {k: v for k, v in want.items() if v is not None}
    # one model output per distinct tensor (attn_heads is attn_branch; embeddings is L0.layer_in)
    slots: dict = {}
    for v in want.values():
        slots.setdefault((v.get_node().get_friendly_name(), v.get_index()), v)
    n0 = len(ovm.outputs)
    ovm.add_outputs(list(slots.values()))
    where = {k: n0 + j for j, k in enumerate(slots)}
    compiled = ov.Core().compile_model(ovm, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
    tokens = np.asarray(run.tokens, dtype=np.int64)
    res = compiled([tokens, np.ones_like(tokens)])
    probes = {"logits": np.asarray(res[compiled.outputs[0]], dtype=np.float64)}
    for key, v in want.items():
        probes[key] = np.asarray(res[compiled.outputs[where[(v.get_node().get_friendly_name(), v.get_index())]]],
                                 dtype=np.float64)
    for i, lc in enumerate(run.layer_cfgs):
        h, hkv, d, dv = (getattr(lc, a, 0) for a in ("n_heads", "n_kv_heads", "head_dim", "dv"))
        for t, heads, width in (("q", h, d), ("k", hkv, d), ("v", hkv, dv), ("attn_heads", h, dv)):
            key = f"L{i}.{t}"
            if key in probes and not (heads and width):
                # a layer with no attention heads in its description (a recurrent layer:
                # kimi_linear's KDA, qwen3_next's delta-net) names q_proj / k_proj / v_proj
                # modules too, but their outputs are not the [token, head, ch] probes the
                # layer kind compares
                del probes[key]
                hidden[key] = (f"layer {i} is a {type(lc).__name__} with no attention heads: its module "
                               f"boundary for {t} is not the per-head probe")
            elif key in probes:
                if key in heads_first:
                    probes[key] = np.swapaxes(probes[key], 1, 2)
                probes[key] = probes[key].reshape(probes[key].shape[:2] + (heads, width))
        for p in LAYER_PROBES:
            key = f"L{i}.{p}"
            if key not in probes and key not in hidden and p not in ("q_rope", "k_rope", "attn_probs"):
                hidden[key] = f"the converted graph has no module boundary for {p} in layer {i}"
    for p in ("embeddings", "final_norm"):
        if p not in probes and p not in hidden:
            hidden[p] = f"the converted graph has no module boundary for {p}"
    return probes, hidden
