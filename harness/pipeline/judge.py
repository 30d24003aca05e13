"""The judge stage: one case's rows, from the captures of its sides.

``Judge`` takes a frozen ``JudgeRequest`` (the case, its layer descriptions
and config, the policy, what the candidate is) and compares: the candidate
against each reference, probe by probe and layer by layer (``compare_candidate``,
fed by a ``CandidateFeed``: the candidate's whole capture, or one layer at a
time), and the references with each other (``compare_refs``). Each comparison
is judged by the tolerance policy scaled to the case (``judge``: the RoPE
reach, the values' scale, the float64 oracle's rule where there is one), and a
failure that a finding excuses becomes ``finding`` -- matched on the
reference's own config, up to the finding's measured size. The verdict rules
(harness/verdict.py) are applied to the rows afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable
import traceback

import numpy as np

from contract.probes import LAYER_PROBES

from .. import families, kinds, references, scaling, verdict
from ..compare import absmax, all_finite, head_nmse, judge, judge_against_oracle, metrics, worst_head
from ..errors import UsageError
from ..policy import comparison_dtype, dataflow_position, pair_sides
from ..references import RefCapture
from ..schedule import mask
from .. import runlog


@dataclass(frozen=True)
class JudgeRequest:
    """What the judge stage reads of a case (made by ``harness.case.CaseRun``)."""
    case: Any  # harness.case.Case
    family: str
    config: Any  # the reference's own HF config (findings match on it)
    layer_cfgs: tuple
    policy: Any  # harness.policy.Policy
    selection: Any  # harness.select.Selection
    features: tuple
    variant: str | None
    candidate: str
    teacher_forced: bool
    weight_dtype: str  # the GGUF's weight precision (what llama.cpp's weights make of a comparison)
    plan_notes: tuple = ()
    derived: dict = field(default_factory=dict)  # (side, probe key) -> how it was derived
    # a ragged case's rows per sequence (harness/schedule.py): rows past them are not compared
    lengths: tuple | None = None
    # the rows each call carries, per sequence (BatchPlan.chunks): findings keyed on the schedule
    chunks: tuple | None = None


@dataclass(frozen=True)
class CandidateFeed:
    """How the candidate's probes reach the judge: ``whole(rc)`` (everything, or an
    empty capture for a candidate run one layer at a time) and, with ``by_layer``,
    ``layer(rc, i)`` -- one layer, its probes dropped once compared: a real-size run
    holds one layer beyond the weights."""

    whole: Callable
    layer: Callable | None = None
    by_layer: bool = False


def _family_values(req: JudgeRequest) -> dict:
    """What the family reads from the reference's config where no key says it
    (``Family.finding_values``): the policy matches a finding's ``family.NAME``
    conditions on it and asks no family itself (it sits below them)."""
    return families.get(req.family).finding_values(req.config) if req.config is not None else {}


class Judge:
    def __init__(self, req: JudgeRequest):
        self.req = req
        self.timings: dict[str, float] = {}
        self.notes: list[str] = []  # what the candidate says about how it was judged
        # (side, probe key) -> how it was derived: the references' (capture stage), then each
        # candidate capture's own (its meta's "derived")
        self.derived: dict = dict(req.derived)

    def compare_candidate(self, rc: RefCapture, feed: "CandidateFeed", oracle: RefCapture | None = None,
                          rounding: RefCapture | None = None, sizer: RefCapture | None = None,
                          guard: RefCapture | None = None) -> list[dict]:
        """The candidate against one reference. ``oracle``: a float64 run on the same
        inputs (``oracle_for``); where given and the comparison dtype has an oracle
        rule, each probe is judged by the candidate's distance to it relative to the
        reference's (``judge_against_oracle``). Otherwise (llama.cpp, a float32 graph,
        against a teacher-forced candidate: the reference is itself the better
        estimate of the truth) the candidate is judged directly, at the comparison
        dtype's bounds scaled to the case (harness/scaling.py).

        A teacher-forced candidate is given ``rc``'s own layer inputs, layer by
        layer; a free-running one is compared at every probe both sides hold,
        ``layer_in`` and the model-level probes included.

        ``rounding``: a float64 run on ``rc``'s own layer inputs (``oracle.rounding_for``:
        a float64 candidate against a float32 reference); each probe judged directly
        must then also be within ``ratio`` times ``rc``'s own distance to it -- or, given
        ``sizer`` (``oracle.dtype_sizer``: a half-precision candidate against llama.cpp's
        float32, or a float32 one against llama.cpp alone), ``ratio`` times the sizer's
        distance: HF in the candidate's dtype on
        ``rc``'s layer inputs, the oracle rule against HF on llama.cpp's inputs -- where
        ``rc`` is within float32's bound of ``guard`` (``oracle.model_guard``: HF's
        float64 run of llama.cpp's model on its inputs)."""
        req = self.req
        name, forced = req.candidate, req.teacher_forced
        sel = req.selection
        try:
            whole = feed.whole(rc)
        except UsageError:
            raise
        except Exception as e:  # the candidate crashed as a whole: one error row, the run goes on

            tb = traceback.format_exc()
            runlog.traceback_block(f"{req.case.case_id()}: candidate {name} vs {rc.name}", tb)
            return [self.row(name, rc.name, None, "*", "error",
                             f"{name} raised {type(e).__name__}: {' '.join(str(e).split())[:300]}", detail=tb)]
        self.derived.update({(name, k): how for k, how in (whole.meta.get("derived") or {}).items()})
        ref = references.get(rc.name)
        cdt = comparison_dtype(whole.dtype, rc.dtype)
        if ref.file_weights:
            cdt = comparison_dtype(cdt, req.weight_dtype)
        if "ratio" not in req.policy.tolerance(cdt, "default")[0]:
            oracle = rounding = sizer = guard = None  # no oracle rule at this precision: judged directly
        # what the memory plan gave up (harness/budget.py), said in every row against the oracle's reference
        plan_note = "; ".join(req.plan_notes) if ref.oracle else ""
        rows = []

        def compare(cap, layer, probe, expected):
            if cap.note and cap.note not in self.notes:
                self.notes.append(cap.note)
            key = f"L{layer}.{probe}" if layer is not None else probe
            if key not in cap.probes:
                hidden = cap.hidden(key)
                if hidden and (expected or key in rc.probes):
                    rows.append(self.row(name, rc.name, layer, probe, "not-exposed", f"{name}: {hidden}"))
                elif expected and not hidden:  # a probe the candidate stopped emitting is noticed, not dropped
                    lc = req.layer_cfgs[layer] if layer is not None else None
                    what = (f"({kinds.label(lc)} layers emit {', '.join(verdict.expected_probes(lc))})"
                            if lc is not None and verdict.expected_probes(lc) else f"({rc.name} holds it)")
                    rows.append(self.row(name, rc.name, layer, probe, "missing",
                                          f"{name} emitted no {probe} for this layer {what}"))
                return
            if key not in rc.probes:
                why = (rc.meta.get("not_exposed") or {}).get(probe)  # the reference says why, where it can
                rows.append(self.row(name, rc.name, layer, probe, "not-exposed",
                                     f"{rc.name} does not expose {probe} for {req.family}" + (f": {why}" if why else "")))
                return
            orc = None if oracle is None else oracle.probes.get(key)
            if oracle is not None and orc is None and not forced:
                pass  # HF computes no such tensor (MLA's absorbed query): judged directly
            elif oracle is not None and orc is None:
                rows.append(self.row(name, rc.name, layer, probe, "error",
                                      f"the float64 oracle of {rc.name} has no {probe} here"))
                return
            # a layer whose quantized matmuls the candidate rounded as ggml does is judged at
            # ggml_<act> (Build.ggml_layer_dtype)
            ldt = (comparison_dtype(comparison_dtype(cap.dtype, rc.dtype), cap.layer_dtypes[layer])
                   if layer in cap.layer_dtypes else cdt)
            rnd = None if rounding is None or ldt != cdt else rounding.probes.get(key)
            siz = None if sizer is None else sizer.probes.get(key)
            grd = None if guard is None else guard.probes.get(key)
            if sizer is not None and (siz is None or grd is None):
                rnd = siz = grd = None  # the sizing runs hold no such probe: judged at the table alone
            # the float64 run the floors below are read from: the oracle, or the one on rc's
            # inputs where a sizing run stands in for rc's own rounding
            f64 = oracle if orc is not None else rounding if siz is not None and rnd is not None else None
            # behind a recurrent layer's output norm the float32 floor grows by what the norm
            # multiplies a rounding error by on these values (scaling.output_norm_amplification)
            amp = (scaling.output_norm_amplification(req.layer_cfgs[layer], f64.probes, layer)
                   if f64 is not None and layer is not None and probe in (*scaling.NORMED_OUTPUT_PROBES, "resid_mid")
                   else 1.0)
            if probe == "resid_mid" and amp > 1.0:  # that error, added to the residual (scaling.residual_floor_scale)
                amp = scaling.residual_floor_scale(amp, f64.probes, layer)
            # behind a softmax the float32 floor is at least what rounding the scores leaves
            # there, u^2 M (scaling.score_magnitude, M from the float64 run; at resid_mid that
            # error is added to the residual unchanged)
            score = (self.score_magnitude(f64, layer)
                     if f64 is not None and layer is not None and probe in (*scaling.SOFTMAX_PROBES, "resid_mid")
                     else None)
            if score is not None and probe == "resid_mid":
                share = scaling.residual_share(f64.probes, layer)
                score = None if share is None else score * share
            row = self.judge(name, rc.name, layer, probe, cap.probes[key], rc.probes[key], ldt, orc,
                             sides={rc.name: rc}, rounding=rnd, floor_scale=amp, score_mag=score, sizer=siz,
                             guard=grd, sizer_name=None if sizer is None else f"{sizer.name} in {sizer.dtype}")
            if cap.note and not row.get("tol_reason"):
                row["tol_reason"] = cap.note  # why the bound is this dtype's
            if plan_note:
                row["reason"] = "; ".join(x for x in (row["reason"], plan_note) if x)
            rows.append(row)

        if not forced and sel.probe("embeddings"):
            compare(whole, None, "embeddings", "embeddings" in rc.probes)
        for i in sel.layers:
            lc = req.layer_cfgs[i]
            if forced and not kinds.implemented(lc):
                rows.append(self.row(name, rc.name, i, "*", "not-implemented",
                                     f"not implemented in {name}: {lc.kind} ({lc.reason})", layer_kind=lc.label))
                continue
            if forced and f"L{i}.layer_in" not in rc.probes:
                why = (rc.meta.get("not_exposed") or {}).get("layer_in")  # the reference says why, where it can
                rows.append(self.row(name, rc.name, i, "layer_in", "not-exposed",
                                      f"{rc.name} does not expose this layer's input; the layer cannot be teacher-forced"
                                      + (f" ({why})" if why else "")))
                continue
            cap = whole
            if feed.by_layer:
                t = time.perf_counter()
                cap = feed.layer(rc, i)
                self.timings[f"{name}_run_{rc.name}"] = (self.timings.get(f"{name}_run_{rc.name}", 0.0)
                                                         + time.perf_counter() - t)
            if i in cap.errors:
                rows.append(self.row(name, rc.name, i, "*", "error", cap.errors[i], detail=cap.details.get(i, "")))
                continue
            expected = set(verdict.expected_probes(lc))
            if not forced:  # the engine's graph: what the reference holds, it must hold or say why not
                expected |= {p for p in LAYER_PROBES if f"L{i}.{p}" in rc.probes}
            for probe in LAYER_PROBES:
                if (probe == "layer_in" and forced) or not sel.probe(probe):
                    continue
                compare(cap, i, probe, probe in expected)
            del cap
        if not forced:
            for probe in ("final_norm", "logits"):
                if sel.probe(probe):
                    compare(whole, None, probe, probe in rc.probes)
        return rows

    def compare_refs(self, cand: RefCapture, ref: RefCapture, drift: RefCapture | None = None,
                     drift_base: RefCapture | None = None) -> list[dict]:
        """``cand`` against ``ref`` at every probe both hold. ``drift``: ``ref``
        free-running with ``cand``'s activation rounding reproduced
        (``oracle.drift``); where the comparison dtype's table has a
        ``drift_ratio``, each probe's bound is that multiple of ``drift``'s own
        distance to ``ref`` there (``drift_bound``) -- or to ``drift_base``, the
        float run the drift was made from, where ``ref`` is the rounding side (a
        float witness judged against llama.cpp on quantized weights)."""
        cdt = comparison_dtype(comparison_dtype(cand.dtype, ref.dtype), self.req.weight_dtype)
        rows = []
        note = ""
        if drift is not None and drift.error:
            note = f"the drift run failed ({drift.error[:120]}): the table's bound"
            drift = None
        keys = [k for k in ref.probes if k in cand.probes]
        order = {p: n for n, p in enumerate(LAYER_PROBES)}

        def sort_key(k):
            if k.startswith("L"):
                layer, probe = k.split(".", 1)
                return (1, int(layer[1:]), order.get(probe, 99), probe)
            return (0 if k == "embeddings" else 2, 0, 0, k)

        for k in sorted(keys, key=sort_key):
            layer, probe = (int(k.split(".")[0][1:]), k.split(".", 1)[1]) if k.startswith("L") else (None, k)
            d = drift.probes.get(k) if drift is not None else None
            db = drift_base.probes.get(k) if drift_base is not None else None
            # past a matmul the drift run could not round (oracle.drift), the table's bound stays
            past = drift is not None and drift.meta.get("unrounded_from_layer") is not None and (
                layer is None or layer >= drift.meta["unrounded_from_layer"])
            row = self.judge(cand.name, ref.name, layer, probe, cand.probes[k], ref.probes[k], cdt, None,
                             drift=d, drift_keeps_table=past, sides={cand.name: cand, ref.name: ref},
                             drift_what=None if drift is None else drift.meta.get("drift_what"),
                             drift_base=db)
            if note and not row.get("tol_reason"):
                row["tol_reason"] = note
            rows.append(row)
        return rows

    def judge(self, cand_name, ref_name, layer, probe, a, b, cdt, oracle, drift=None,
              drift_keeps_table: bool = False, sides: dict | None = None, rounding=None,
              drift_what: str | None = None, floor_scale: float = 1.0, drift_base=None,
              score_mag: float | None = None, sizer=None, sizer_name: str | None = None, guard=None) -> dict:
        if np.shape(a) != np.shape(b):
            return self.row(cand_name, ref_name, layer, probe, "error",
                             f"shape mismatch: {cand_name} {np.shape(a)} vs {ref_name} {np.shape(b)}", cmp_dtype=cdt)
        req = self.req
        if req.lengths is not None:  # ragged: each sequence up to its own length (harness/schedule.py mask)
            a, b = mask(probe, a, req.lengths), mask(probe, b, req.lengths)
            oracle = None if oracle is None else mask(probe, oracle, req.lengths)
            rounding = None if rounding is None else mask(probe, rounding, req.lengths)
            sizer = None if sizer is None else mask(probe, sizer, req.lengths)
            guard = None if guard is None else mask(probe, guard, req.lengths)
        m = metrics(a, b, probe)
        base, why = req.policy.tolerance(cdt, probe, req.family, ref_name, cand_name)
        # the bound at this case's size: RoPE reach and the values' scale (harness/scaling.py);
        # angles are float32 in every reference below float64 (llama.cpp always)
        rope = self.rope_reach(cand_name, layer, probe)
        ref_scale = absmax(b if oracle is None else oracle)
        tol = scaling.scaled(base, rope, "float64" if cdt == "float64" else "float32", ref_scale,
                             scaling.state_width(probe, self.reduction_width(layer), req.case.tokens))
        tol = self.derived_difference(tol, layer, probe, b, sides or {})
        if floor_scale > 1.0 and tol.get("nmse_floor"):
            tol = dict(tol, nmse_floor=tol["nmse_floor"] * floor_scale)
            why = "; ".join(x for x in (why, f"the float32 floor x {floor_scale:.3g}: what the layer's output norm "
                                             "multiplies a rounding error by here") if x)
        if score_mag and tol.get("score_floor") and tol.get("nmse_floor") is not None:
            sf = tol["score_floor"] * scaling.EPS["float32"] ** 2 * score_mag
            if sf > tol["nmse_floor"]:
                tol = dict(tol, nmse_floor=sf)
                why = "; ".join(x for x in (why, f"the float32 floor {sf:.3g} = score_floor x u^2 x {score_mag:.3g}: "
                                                 "what rounding the scores leaves behind the softmax here") if x)
        dbase = b if drift_base is None else drift_base
        if drift is not None and "drift_ratio" in base and np.shape(drift) == np.shape(dbase):
            tol, why = drift_bound(base, tol, metrics(drift, dbase, probe), rope, ref_scale, why, drift_keeps_table,
                                   drift_what)
        if oracle is not None:
            cm, rm = metrics(a, oracle, probe), metrics(b, oracle, probe)
            ch, rh = head_nmse(a, oracle, probe), head_nmse(b, oracle, probe)
            heads = None if ch is None or rh is None else (ch, rh)
            status, reason, allowed = judge_against_oracle(cm, rm, tol, all_finite(oracle), heads)
            extra = {"nmse_cand_oracle": cm["nmse"], "nmse_ref_oracle": rm["nmse"],
                     "err_ratio": max(_over(cm["nmse"], allowed), _over(cm["max_abs"], tol["atol"]),
                                      0.0 if heads is None else _over(*worst_head(heads, tol)[1:]))}
            tol = dict(tol, nmse=allowed)  # the bound actually applied is what the row reports
        else:
            status, reason = judge(m, tol)
            extra = {"err_ratio": max(_over(m["nmse"], tol["nmse"]), _over(m["max_abs"], tol["atol"]))}
        rounding_failed = False
        # the reference's own rounding bounds the candidate too (oracle.rounding_for): a
        # float64 candidate is ~1e-30 from this run; a bug is as far as it moves the values.
        # A candidate below float64 against a float32 reference (oracle.dtype_sizer): the
        # allowance is a sound computation's in that dtype there, HF's on rc's inputs
        own = b if sizer is None else sizer if np.shape(sizer) == np.shape(b) else None
        if rounding is not None and sizer is not None and own is not None:
            # only where HF's float64 run of the reference's own model (its weights, its inputs:
            # ``guard``) is that model here: the reference (float32) within float32's bound of
            # it -- where the two references differ (a finding; HF's cached path's own
            # divergence) the table's bound alone stands
            oname = references.oracle_reference().name
            t32, _ = req.policy.tolerance("float32", probe, req.family, oname, cand_name)
            t32 = scaling.scaled(t32, rope, "float32", absmax(guard), self.reduction_width(layer))
            if guard is None or np.shape(guard) != np.shape(b) or judge(metrics(b, guard, probe), t32)[0] != "pass":
                own = None
        if rounding is not None and "ratio" in tol and own is not None:
            cm, rm = metrics(a, rounding, probe), metrics(own, rounding, probe)
            heads = None
            if sizer is not None:  # head by head too, as against the oracle (a state's fast heads)
                ch, rh = head_nmse(a, rounding, probe), head_nmse(own, rounding, probe)
                heads = None if ch is None or rh is None else (ch, rh)
            st2, why2, allowed = judge_against_oracle(cm, rm, tol, all_finite(rounding), heads)
            extra.update(nmse_cand_oracle=cm["nmse"], nmse_ref_oracle=rm["nmse"])
            extra["err_ratio"] = max(extra["err_ratio"], _over(cm["nmse"], allowed),
                                     0.0 if heads is None else _over(*worst_head(heads, tol)[1:]))
            if st2 == "fail":
                rounding_failed = True
                whose = (f"{ref_name}'s own rounding: its distance to the float64 oracle on its layer inputs"
                         if sizer is None else
                         f"{sizer_name}'s rounding on {ref_name}'s layer inputs: its distance to the float64 "
                         "oracle there")
                status, reason = "fail", "; ".join(x for x in (reason, f"{why2} ({whose})") if x)
            elif req.case.dtype == "float64" and rm["finite"] and rm["nmse"] <= tol["nmse"]:
                # issue 40: where the reference is within its dtype's bound of the float64 run on its
                # own layer inputs, that run computes the reference's model here in float64, and a
                # float64 candidate is held to float64's bound against it -- as against HF in float64
                # (the allowance above, ratio x the reference's own float32 rounding, let a recurrent
                # norm bug of NMSE 6e-13 pass against llama.cpp alone). Not a rounding failure: where
                # the two references' models differ below that bound, a finding still excuses it.
                oname = references.oracle_reference().name
                t64, _ = req.policy.tolerance("float64", probe, req.family, oname, cand_name)
                t64 = scaling.scaled(t64, rope, "float64", absmax(rounding), self.reduction_width(layer))
                st3, why3 = judge(cm, t64)
                lc = req.layer_cfgs[layer] if layer is not None else None
                if st3 == "fail" and req.policy.finding(
                        req.family, cand_name, oname, probe, kinds.label(lc), req.config, layer=layer,
                        nmse=cm["nmse"], dtype="float64", tokens=req.case.tokens, n_layers=len(req.layer_cfgs),
                        chunks=req.chunks, family_values=_family_values(req)):
                    # the oracle's float64 model is not exact float64 here, by a finding of its own
                    # against the candidate (minimax#5: HF's float32 decay tables): float64's bound
                    # does not apply to that run; the allowance above stands
                    st3 = "pass"
                else:
                    extra["err_ratio"] = max(extra["err_ratio"], _over(cm["nmse"], t64["nmse"]),
                                             _over(cm["max_abs"], t64["atol"]))
                if st3 == "fail":
                    status, reason = "fail", "; ".join(x for x in (
                        reason, f"{why3} to the float64 run on {ref_name}'s layer inputs, at float64's bound "
                                f"({ref_name} computes that run's model here: its own distance {rm['nmse']:.3g} is "
                                f"within {cdt}'s {tol['nmse']:.3g})") if x)
        if status == "fail" and not rounding_failed:
            # matched on the reference's own config (the HF config; a --gguf file's read back
            # from its keys), never on what impl was told to compute
            lc = req.layer_cfgs[layer] if layer is not None else None
            known = req.policy.finding(req.family, cand_name, ref_name, probe, kinds.label(lc), req.config,
                                       layer=layer, nmse=m["nmse"], dtype=cdt, tokens=req.case.tokens,
                                       n_layers=len(req.layer_cfgs), chunks=req.chunks,
                                       family_values=_family_values(req))
            if known:
                status, reason = "finding", f"{reason} -- known disagreement: {known}"
        key = f"L{layer}.{probe}" if layer is not None else probe
        notes = [f"{side}'s {probe} is {self.derived[(side, key)]}" for side in (cand_name, ref_name)
                 if (side, key) in self.derived]
        if notes:  # never silent: a derived probe is not one the reference names
            reason = "; ".join(([reason] if reason else []) + notes)
        row = self.row(cand_name, ref_name, layer, probe, status, reason, cmp_dtype=cdt, **m, **extra,
                        tol_nmse=tol.get("nmse"), tol_atol=tol.get("atol"), tol_reason=why)
        return row

    def witnesses(self, rows: list[dict]) -> list[dict]:
        """Triangulation inside the case (issue 38). A witness is a reference outside the
        HF-vs-llama.cpp pair (``policy.pair_sides``: mlx-lm). Where this case's rows excuse
        the pair at a probe by a finding, and the witness passes there against one side and
        not the other, the witness computes that side's model at that probe -- measured here,
        not looked up -- and the finding holds for it in that side's place: its failing rows
        at that probe (against the other side, and impl's against it) are re-judged with that
        evidence (``Policy.finding(measured=...)``), within the finding's own bound. The
        stored tables (fixtures/triangulation/) give the same verdict where the pair is not
        in the case (``--ref hf,mlx``); a case with all three measures it itself, so a
        configuration no table holds (the fuzz's) is judged on evidence, never excused blind.
        A row failing its reference's own rounding (oracle.rounding_for) stays a failure."""
        sides = set(pair_sides())
        present = {r["candidate"] for r in rows} | {r["reference"] for r in rows}
        wit = {w for w in references.names() if w in present and w not in sides}
        if not wit:
            return rows
        by = {(r["candidate"], r["reference"], r["layer"], r["probe"]): r for r in rows}

        def status(a, b, layer, probe):  # a pair is judged once, the later against the earlier
            r = by.get((a, b, layer, probe)) or by.get((b, a, layer, probe))
            return None if r is None else r["status"]

        excused: dict = {}  # (layer, probe) -> {(label, candidate, reference)} the pair was excused by
        for r in rows:
            if r["status"] == "finding" and r["candidate"] in sides and r["reference"] in sides:
                label = str(r["reason"]).partition("finding ")[2].partition(":")[0]
                if label:
                    excused.setdefault((r["layer"], r["probe"]), set()).add((label, r["candidate"], r["reference"]))
        req = self.req

        def upstream(key):
            # the findings that excused the pair at this probe or anywhere in front of it: past
            # the first probe a finding excuses, the pair's distance is that finding diluted (a
            # residual add), and may sit either side of the float32 bound -- the pair just under
            # it, the witness that follows one side just over (the CI fuzz's gpt_oss YaRN case:
            # llama.cpp vs HF L1 resid_mid 0.96 of the bound, mlx vs llama.cpp 1.007); the
            # finding, asked with the witness's own numbers, still decides whether it holds here
            pos = dataflow_position(key[0], key[1])
            return set().union(*(v for k, v in excused.items() if dataflow_position(*k) <= pos))

        out = []
        for r in rows:
            w = next((x for x in (r["candidate"], r["reference"]) if x in wit), None)
            key = (r["layer"], r["probe"])
            labels = upstream(key) if r["status"] == "fail" and w is not None else set()
            if not labels or "'s own rounding" in str(r["reason"]):
                out.append(r)
                continue
            measured = {}
            for label, a, b in labels:
                sa, sb = status(w, a, *key), status(w, b, *key)
                for side, mine, other in ((a, sa, sb), (b, sb, sa)):
                    if mine == "pass" and other not in (None, "pass"):
                        measured[(w, label)] = references.get(side).model_of or side
            layer = r["layer"] if r["layer"] >= 0 else None
            lc = req.layer_cfgs[layer] if layer is not None and layer < len(req.layer_cfgs) else None
            known = measured and req.policy.finding(
                req.family, r["candidate"], r["reference"], r["probe"], kinds.label(lc), req.config, layer=layer,
                nmse=r.get("nmse"), dtype=r.get("cmp_dtype"), tokens=req.case.tokens, n_layers=len(req.layer_cfgs),
                chunks=req.chunks, measured=measured, family_values=_family_values(req))
            out.append(dict(r, status="finding", reason=f"{r['reason']} -- known disagreement: {known}")
                       if known else r)
        return out

    def derived_difference(self, tol: dict, layer, probe: str, b, sides: dict) -> dict:
        """A probe a side derives as the difference of two of its float32 tensors
        (llama.cpp's ``attn_out = ffn_inp - layer_in``, references/llamacpp/capture.py)
        carries ffn_inp's float32 rounding, up to u/2 |ffn_inp| an element, which no
        longer shrinks with the difference: where |layer_in| >> |attn_out| the
        difference's NMSE is (u/2)^2 sum(layer_in^2) / sum(attn_out^2), not float32's
        (llama.cpp's random-model generator's olmo file: L1 attn_out 3.99e-10 against
        a float32 bound of 1.01e-10). The bound grows by 4x that share (``u^2 R``) and
        atol by ``u max|layer_in|``; a difference of comparable tensors is unaffected."""
        if layer is None:
            return tol
        key = f"L{layer}.{probe}"
        for name, cap in sides.items():
            how = self.derived.get((name, key), "")
            base = cap.probes.get(f"L{layer}.layer_in") if "ffn_inp - layer_in" in how else None
            if base is None or np.shape(base) != np.shape(b):
                continue
            u = 2.0 ** -24
            base = np.asarray(base, dtype=np.float64)
            den = float(np.sum(np.square(np.asarray(b, dtype=np.float64))))
            ratio = float(np.sum(np.square(base))) / den if den > 0 else 0.0
            return dict(tol, nmse=tol["nmse"] + u * u * ratio, atol=tol["atol"] + u * float(np.abs(base).max()))
        return tol

    def score_magnitude(self, oracle, layer: int) -> float | None:
        """scaling.score_magnitude of ``layer`` in the float64 run ``oracle``, once a run and layer."""
        memo = self.__dict__.setdefault("_score_memo", {})
        if (id(oracle), layer) not in memo:
            memo[(id(oracle), layer)] = scaling.score_magnitude(oracle.probes, layer)
        return memo[(id(oracle), layer)]

    def reduction_width(self, layer: int | None) -> int | None:
        """The widest reduction in front of a probe of ``layer`` (harness/scaling.py
        reduction_width), what the oracle rule's float32 floor scales by; a probe of
        no layer (the embeddings, the logits) sits behind every layer: the widest."""
        cfgs = self.req.layer_cfgs
        if layer is not None and 0 <= layer < len(cfgs):
            return scaling.reduction_width(cfgs[layer])
        widths = [w for w in map(scaling.reduction_width, cfgs) if w]
        return max(widths) if widths else None

    def rope_reach(self, cand: str, layer: int | None, probe: str):
        """The RoPE reach (harness/scaling.py) a comparison's bound must allow for, or
        None: a teacher-forced candidate carries the angle error of its own layer
        only, from q_rope on; free-running sides carry every RoPE upstream."""
        # one answer per (side, layer, probe) -- and each layer's reach computed once: every
        # row asked for it over all layers (a 30-layer file's 2169 rows: 83565 rope_size calls)
        memo = self.__dict__.setdefault("_rope_memo", {})
        if (cand, layer, probe) in memo:
            return memo[(cand, layer, probe)]
        req = self.req
        n = req.case.tokens
        if "_rope_layers" not in self.__dict__:
            self._rope_layers = [(i, kinds.of(lc), scaling.rope_size(lc, n)) for i, lc in enumerate(req.layer_cfgs)]
        pos = dataflow_position(layer, probe)
        reach = []
        for i, kind, size in self._rope_layers:
            if kind is None or size is None:
                continue
            if cand == req.candidate and req.teacher_forced and i != layer:
                continue
            if pos >= dataflow_position(i, kind.rope_probe):
                reach.append(size)
        out = (None if not reach else
               scaling.RopeSize(max(r.mean_sq for r in reach), max(r.max_weighted for r in reach)))
        memo[(cand, layer, probe)] = out
        return out

    def row(self, cand, ref, layer, probe, status, reason, **kw) -> dict:
        """One report row of this case (contract.rows.ROW_COLUMNS)."""
        req = self.req
        c = req.case
        lc = req.layer_cfgs[layer] if layer is not None and layer < len(req.layer_cfgs) else None
        row = dict(
            case_id=c.case_id(), family=req.family, features=";".join(req.features), backend=c.backend,
            device=c.device, dtype=c.dtype, kv=c.kv, schedule=c.schedule, seed=c.seed, tokens=c.tokens,
            seqs=c.n_seqs, gguf_type=c.gguf_type, weights=c.weights, ragged=c.ragged,
            overrides=";".join(f"{k}={v}" for k, v in c.overrides),
            candidate=cand, reference=ref, layer=-1 if layer is None else layer, probe=probe,
            variant=req.variant or "", layer_kind=kw.pop("layer_kind", None) or kinds.label(lc),
            status=status, reason=reason,
        )
        row.update(kw)
        return row


def drift_bound(base: dict, tol: dict, dm: dict, rope, ref_scale: float, why: str,
                keep_table: bool = False, what: str | None = None) -> tuple[dict, str]:
    """The bound of a free-running reference against a float one where the first
    rounds its activations (llama.cpp on quantized weights): ``drift_ratio`` times
    the drift ``dm`` -- the metrics of the float reference run with that rounding
    reproduced against itself, at this probe and layer -- floored at
    ``drift_nmse_floor`` / ``drift_atol_floor`` (float32's own: where nothing has
    been rounded yet, the two are float32 computations of one model). Why it
    holds at any depth and weight type: the rounding llama.cpp applies IS the
    rounding the drift run applies (ggml_matmul reproduces it per matmul to
    float32 order); what the drift run cannot share with llama.cpp is which
    element an ulp flips and float32 summation order, each far below the rounding
    itself -- so the two distances to the float run are two draws of the same
    process, grown by the same layers in front of the probe. A non-finite drift
    run leaves the table's bound.

    The same rule bounds two float32 paths of one model against each other
    (``oracle.own_rounding``: HF's cached path against its full forward), the
    drift then being the reference's own float32 rounding, free-running, against
    itself in float64 (``what`` says which drift the row's bound came from)."""
    if not dm["finite"]:
        return tol, why
    ratio = float(base["drift_ratio"])
    floor = scaling.scaled(dict(base, nmse=base.get("drift_nmse_floor", 0.0), atol=base.get("drift_atol_floor", 0.0)),
                           rope, "float32", ref_scale)
    out = dict(tol, nmse=max(floor["nmse"], ratio * dm["nmse"]), atol=max(floor["atol"], ratio * dm["max_abs"]))
    what = what or "ggml's activation rounding reproduced in the float reference"
    note = (f"{ratio:g} x the drift of {what} "
            f"(nmse {dm['nmse']:.3g}, max_abs {dm['max_abs']:.3g})")
    if keep_table:  # downstream of a matmul the drift run does not round: the larger of the two
        out = dict(out, nmse=max(out["nmse"], tol["nmse"]), atol=max(out["atol"], tol["atol"]))
        note += ", or the table's where larger: downstream of a matmul the drift run does not round (MoE experts)"
    return out, "; ".join(x for x in (why, note) if x)


def _over(err: float, limit: float) -> float:
    """How far ``err`` is from the tolerance that judged it (> 1 fails): the
    number the report's heatmap colours by, comparable across dtypes."""
    return err / limit if limit > 0 else (0.0 if err == 0 else float("inf"))
