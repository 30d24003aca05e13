"""What a case's rows must show before the case may pass (DESIGN.md: "A pass
must mean a check"), in one place: the statuses and which of them fail, the
probes each layer kind must emit, and the guard over a case's rows.

The rules (README "Verdict rules"):

1. A row's status says what its comparison showed: ``pass`` / ``fail`` under
   the tolerance, ``finding`` (a known, bounded disagreement of the
   references), ``not-exposed`` / ``not-implemented`` (nothing was compared --
   never a pass), ``error`` (a reference or the candidate crashed),
   ``skipped``.
2. ``missing``: a probe the layer's kind must emit (``expected_probes``, read
   from the layer's description, not from what the candidate chose to record)
   that the candidate did not emit. It fails: a probe that silently stops
   being recorded would otherwise just stop being checked.
3. ``unguarded``: a finding excuses the candidate against one reference only
   where ANOTHER reference passes the candidate at the same probe; a finding
   with no such guard becomes ``unguarded``. And every layer the candidate
   implements needs a passing comparison of its last attention probe
   (``attn_out``: everything the layer's attention computes flows into it)
   against some reference; a layer without one gets an ``unguarded`` row, and
   so does a case in which no layer at all was compared. Reference-vs-
   reference rows guard nothing.
4. A case's status is the first of ``CASE_ORDER`` its rows have: one failing
   row fails the case; ``unguarded`` is listed first.
"""

from __future__ import annotations

from contract.layers import guard_probe  # noqa: F401 (re-exported)
from contract.rows import CASE_ORDER, FAILING, STATUSES  # noqa: F401 (re-exported)
from . import references


def candidate_rows(rows) -> list[dict]:
    """The rows that judge a case's candidate (not the references against each
    other). Every case has one candidate; rows made before candidates were a
    choice name impl."""

    return [r for r in rows if r["candidate"] not in references.names()]


def expected_probes(lc) -> list[str]:
    """The probes a layer of this description must emit (after ``layer_in``), in
    dataflow order -- from the layer's kind and shape (the description's own
    ``expected_probes``, contract.layers), independent of the candidate. ``[]``
    for a layer the candidate does not implement."""
    return list(lc.expected_probes()) if hasattr(lc, "expected_probes") else []


def guard(rows: list[dict], layer_cfgs, candidate: str, make_row, fallback: str | None = None,
          layers=None) -> list[dict]:
    """Apply rule 3 to one case's rows (in place where a finding loses its guard;
    the unguarded layer rows appended). ``make_row(layer, probe, reason)`` builds
    an ``unguarded`` row for this case. ``fallback``: for a free-running candidate
    whose engine names no tensor for a layer's guard probe (``not-exposed`` against
    every reference), a passing ``fallback`` probe of that layer guards it instead
    (``layer_out``: the layer's attention flows into it, and into the next layer's
    input, which is judged too); where ``fallback`` is hidden too (an engine that
    exposes only logits), a passing ``logits`` guards the layer. ``layers``: the layer indices the case compared
    (``--layers``; None: all) -- each of them needs its guard."""

    mine = [r for r in rows if r["candidate"] == candidate]
    in_case = {r["reference"] for r in mine} - {"-"}
    passing = {(r["layer"], r["probe"], r["reference"]) for r in mine if r["status"] == "pass"}
    hidden = {(r["layer"], r["probe"], r["reference"]) for r in mine if r["status"] == "not-exposed"}
    last = {i: guard_probe(lc) for i, lc in enumerate(layer_cfgs)}
    for r in mine:
        if r["status"] != "finding":
            continue
        i, probe = r["layer"], r["probe"]
        # guarded: another reference passes the candidate at this probe -- or, where that
        # reference cannot expose this probe (MLA's absorbed query: HF computes the naive
        # form), at the layer's last attention probe, which everything here flows into
        others = [ref for (layer, p, ref) in passing if layer == i and ref != r["reference"]
                  and (p == probe or ((i, probe, ref) in hidden and p == last.get(i)))]
        if not others:
            seen = sorted({f"{x['reference']}: {x['status']}" for x in mine if x["layer"] == r["layer"]
                           and x["probe"] == r["probe"] and x["reference"] != r["reference"]})
            r["status"] = "unguarded"
            r["reason"] = (f"{r['reason']} -- but no other reference passes {candidate} at this probe "
                           f"({'; '.join(seen) or 'no other reference in this case'}), so nothing checks it here")
            missing = [n for n in references.names() if n not in in_case]
            if missing:  # the reference that computes the setting is not in the case: say where it is judged
                r["reason"] += (f"; {r['reference']} alone cannot judge this setting: run it with "
                                + " or ".join(f"--ref {n}" for n in missing) + " (or --ref all)")
    out = list(rows)
    if any(r["status"] == "error" or (r["status"] == "skipped" and r["reference"] == "-") for r in mine):
        return out  # a crash (or a device absent) already decides the case and says why
    # (a reference left out of the case -- Reference.schedule_refusal -- decides nothing: the others guard it)
    chosen = set(range(len(layer_cfgs))) if layers is None else set(layers)
    layers = [(i, guard_probe(lc)) for i, lc in enumerate(layer_cfgs) if i in chosen]
    layers = [(i, p) for i, p in layers if p is not None]
    if not layers:
        out.append(make_row(None, "*", f"no layer of this case is implemented by {candidate}: only the references "
                                       "were compared with each other, which checks nothing of the candidate"))
        return out
    refs = {r["reference"] for r in mine}
    judged_bad = {(r["layer"], r["probe"]) for r in mine if r["status"] in ("fail", "error", "missing")}
    for i, probe in layers:
        if any((i, probe, ref) in passing for ref in refs):
            continue
        if fallback and all((i, probe, ref) in hidden for ref in refs) and \
                any((i, fallback, ref) in passing for ref in refs):
            continue
        # an engine that names no tensor inside its decoder at all (CTranslate2: logits
        # only): every layer flows into its logits, so a passing logits guards the layer
        # -- weaker (a bug is found at the logits, not at its layer) but a check. The
        # model's own probes carry layer -1 in the judged rows (pipeline/judge.py); None
        # is taken too, for rows a caller built by hand
        if fallback and all((i, p, ref) in hidden for ref in refs for p in (probe, fallback)) and \
                any((m, "logits", ref) in passing for ref in refs for m in (-1, None)):
            continue
        if (i, probe) in judged_bad:
            continue  # it was checked, and failed: that row already says where and by how much
        seen = sorted({f"{x['reference']}: {x['status']}" for x in mine
                       if x["layer"] == i and x["probe"] in (probe, "*", "layer_in")})
        why = f"no reference passed {candidate}'s {probe} on this layer ({'; '.join(seen) or 'nothing compared'})"
        # a finding that lost its guard there says what the references disagree on, and where to judge it
        lost = next((x["reason"] for x in mine if x["layer"] == i and x["probe"] == probe
                     and x["status"] == "unguarded"), "")
        hint = lost[lost.index("known disagreement:"):] if "known disagreement:" in lost else ""
        out.append(make_row(i, probe, f"{why}: the layer is unchecked" + (f" -- {hint}" if hint else "")))
    return out
