"""Bisecting a divergence: to a layer and a probe, to a feature, to a commit.

- ``first_divergence``: the FIRST failing comparison in dataflow order (layer,
  then probe in the order of the probe vocabulary), with its worst element and
  metrics, and the last comparison before it that still agreed.
- ``feature_bisect``: switch the case's features off one at a time and in
  halves, and name the smallest set whose removal makes the case pass. A switch
  takes the feature away from the reference and impl alike: a config field HF
  honours (impl derives its layer configs from the same config,
  ``Family.feature_switches``), a case field (the KV backing, a family variant:
  ``Family.case_switches``), a weight neutralised in the seeded model both
  references and impl read (``Family.model_switches``: biases zeroed, sinks at
  -1e4), or -- against HF only -- an HF module replaced by the identity (or an
  equivalent) with impl's layer config told the same (a norm, the output gate).
  A feature the family cannot switch off is listed as such; every switch,
  alone on a family's clean case, passes (tests/test_feature_bisect.py).
- ``git_bisect``: ``git bisect run`` over the project's history with the case as
  the test, in a temporary worktree (the user's working tree is never touched),
  exit 125 for a commit that cannot run the case.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from contract.probes import LAYER_PROBES

from . import references
from .verdict import FAILING  # noqa: E402  (one definition of what fails)
from .case import CaseRun
from .errors import UsageError
from . import families
from .features import SPEC_DECORATIONS
_ORDER = {p: i for i, p in enumerate(LAYER_PROBES)}


def _key(r) -> tuple:
    layer = r["layer"] if r["layer"] is not None and r["layer"] >= 0 else -1
    probe = r["probe"]
    if layer == -1:  # model-level probes: embeddings before every layer, the rest after
        return (-1 if probe == "embeddings" else 10**6, 0)
    return (layer, -1 if probe == "*" else _ORDER.get(probe, 99))


def first_divergence(rows, candidate: str = "impl", reference: str | None = None) -> dict | None:
    """The first failing comparison of ``candidate`` (against ``reference``, or any)."""
    rows = [r for r in _records(rows) if r["candidate"] == candidate
            and (reference is None or r["reference"] == reference)]
    failing = [r for r in rows if r["status"] in FAILING]
    if not failing:
        return None
    first = min(failing, key=lambda r: (_key(r), r["reference"]))
    before = [r for r in rows if r["reference"] == first["reference"] and r["status"] == "pass"
              and _key(r) < _key(first)]
    last_ok = max(before, key=_key) if before else None
    return {
        "reference": first["reference"], "layer": first["layer"], "probe": first["probe"],
        "status": first["status"], "worst": first.get("worst", ""), "nmse": first.get("nmse"),
        "max_abs": first.get("max_abs"), "reason": first.get("reason", ""),
        "last_agreeing": None if last_ok is None else (last_ok["layer"], last_ok["probe"]),
    }


def describe(d: dict | None) -> str:
    if d is None:
        return "no divergence: every comparison passed"
    where = f"layer {d['layer']}" if d["layer"] is not None and d["layer"] >= 0 else "model level"
    lines = [f"first divergence vs {d['reference']}: {where}, probe {d['probe']} ({d['status']})"]
    if d.get("worst"):
        lines.append(f"  worst element: {d['worst']}  nmse={_g(d['nmse'])} max_abs={_g(d['max_abs'])}")
    if d.get("reason"):
        lines.append(f"  {d['reason']}")
    if d["last_agreeing"] is not None:
        layer, probe = d["last_agreeing"]
        lines.append(f"  last probe that still agreed: layer {layer}, {probe}")
    else:
        lines.append("  nothing before it agreed")
    return "\n".join(lines)


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _records(rows):
    if hasattr(rows, "to_dict"):
        return rows.to_dict("records")
    return list(rows)


# ----------------------------------------------------------------- features
# How a feature is switched off, strongest claim first: a config field HF honours
# (impl derives its layers from the same config), a case field (the KV backing,
# a family variant), a weight neutralised in the seeded model every side reads,
# an HF module replaced by the identity with impl told the same (HF only).
KINDS = ("config", "case", "weights", "module")
# switches that make RoPE the identity are applied after the others that set the
# same config field (rope_parameters), so that in a combination they hold
_LAST = ("rope_neox", "rope_interleaved", "mla_rope")


@dataclass
class Switch:
    tag: str
    kind: str
    what: str
    overrides: dict = field(default_factory=dict)  # config
    fields: dict = field(default_factory=dict)  # case
    removes: list = field(default_factory=list)  # the derived features the switch takes away


def switches_for(case, run, features=None) -> tuple[dict[str, Switch], dict[str, str]]:
    """Every way ``case``'s features can be switched off: ``({tag: Switch}, {tag: why unusable})``.
    One switch per feature, the strongest kind that exists."""

    fam, feats = run.family, set(run.features if features is None else features)
    found: dict[str, Switch] = {}
    for tag, o in fam.feature_switches(run.config, feats).items():
        found[tag] = Switch(tag, "config", "config " + ", ".join(f"{k}={_short(v)}" for k, v in o.items()), overrides=o)
    for tag, f in fam.case_switches(case, feats).items():
        found.setdefault(tag, Switch(tag, "case", "case " + ", ".join(f"{k}={v}" for k, v in f.items()), fields=f))
    default = fam.variants[0] if fam.variants else None
    if case.variant and case.variant != default:
        # the family's default form of the same weights takes away what only this variant brings
        base_feats = set(CaseRun(replace(case, variant=default), run.policy).features)
        for tag in sorted(feats - base_feats):
            found.setdefault(tag, Switch(tag, "case", f"case variant={default}", fields={"variant": default}))
    unusable: dict[str, str] = {}
    for tag, ms in fam.model_switches(run.config).items():
        if tag not in feats or tag in found:
            continue
        blind = [r for r in case.refs if not references.get(r).sees_modules]
        if ms.hf_only and blind:
            unusable[tag] = (f"{ms.what}: a module switch only the model's own modules see, and the case also "
                             f"compares against {', '.join(references.get(r).label for r in blind)}")
            continue
        found[tag] = Switch(tag, "module" if ms.hf_only else "weights", ms.what)
    usable = {}
    for tag, sw in found.items():
        try:  # the switched case must build: config accepted, shapes valid, something switched
            r = CaseRun(_switched(case, [sw]), run.policy)
            _ = r.layer_cfgs, r.base_model
            if sw.kind in ("weights", "module") and not r.switched.get(tag):
                unusable[tag] = f"{sw.what}: nothing in this model to switch"
                continue
            sw.removes = sorted(feats - set(r.features))
            usable[tag] = sw
        except UsageError as e:
            unusable[tag] = str(e)
        except Exception as e:  # the HF config class refused the value
            unusable[tag] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return usable, unusable


def _switched(case, sws: list[Switch]):
    overrides = dict(case.overrides)
    fields_: dict = {}
    off = list(case.switch_off)
    for sw in sorted(sws, key=lambda s: (s.tag in _LAST, s.tag)):
        for k, v in sw.overrides.items():
            # the switch's value replaces the field whole, dotted sub-keys of it included
            for key in [key for key in overrides if key.startswith(k + ".")]:
                del overrides[key]
            overrides[k] = v
        fields_.update(sw.fields)
        if sw.kind in ("weights", "module") and sw.tag not in off:
            off.append(sw.tag)
    return replace(case, overrides=tuple(sorted(overrides.items(), key=lambda kv: kv[0])),
                   switch_off=tuple(sorted(off)), **fields_)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _rank(sw: Switch) -> tuple:
    """Which of several switches that each fix the case names the cause best: one
    that removes exactly its own feature, then a neutralisation that removes
    nothing, then one that removes its own feature and others, then one that
    removes only others; fewer others first; config before case before weights
    before module."""
    others = [t for t in sw.removes if t != sw.tag]
    own = sw.tag in sw.removes
    purity = (0 if own else 1) if not others else (2 if own else 3)
    return (purity, len(others), KINDS.index(sw.kind), sw.tag)


def feature_bisect(case, policy, log=print, features=None) -> dict:
    """The smallest set of switchable features whose removal makes ``case`` pass.

    Each feature alone first: every one whose removal alone makes the case pass is
    named (the best first, the rest as alternatives). Only if none does, all of
    them together, then halves and single features dropped from that set while
    it keeps passing (switches that take other features with them dropped first).

    ``features``: the case's features where the caller knows them better than
    the run does (a mutant in the code that builds impl's configs, e.g. the RoPE
    frequency table, hides the feature it breaks from the derived tags)."""

    fam = families.get(case.family)
    run = CaseRun(case, policy)
    feats = set(run.features if features is None else features)
    usable, unusable = switches_for(case, run, feats)
    skip = {"kv_" + case.kv} - {"kv_paged"}  # the case's own contiguous backing is not a feature to switch
    unswitchable = sorted(feats & set(_decorations()) - set(usable) - skip)
    runs = {"n": 0}

    def passes(sws) -> bool:
        c = _switched(case, list(sws))
        runs["n"] += 1
        r = CaseRun(c, policy)
        rows = r.rows()
        ok = not any(x["status"] in FAILING for x in rows if x["candidate"] == r.candidate.name)
        log(f"  features off {sorted(s.tag for s in sws) or '[]'}: {'pass' if ok else 'fail'}")
        return ok

    result = {"family": fam.name, "switchable": sorted(usable), "unswitchable": unswitchable,
              "unusable": unusable, "smallest": None, "alternatives": [], "runs": 0,
              "switches": {t: {"kind": s.kind, "what": s.what, "removes": s.removes} for t, s in usable.items()}}
    if passes([]):
        result["runs"] = runs["n"]
        result["note"] = "the case passes with every feature on"
        return result
    singles = [usable[t] for t in sorted(usable) if passes([usable[t]])]
    if singles:
        singles.sort(key=_rank)
        result["smallest"] = [singles[0].tag]
        result["alternatives"] = [[s.tag] for s in singles[1:]]
        result["runs"] = runs["n"]
        return result
    if len(usable) < 2 or not passes(list(usable.values())):
        result["runs"] = runs["n"]
        result["note"] = ("switching off no feature alone, nor every switchable feature together, makes the case "
                          f"pass; the cause is elsewhere (features that cannot be switched off: "
                          f"{', '.join(unswitchable) or 'none'})")
        return result
    # shrink: drop halves, then single features, keeping "switched off => passes";
    # the switches that take most with them are tried for dropping first
    off = sorted(usable.values(), key=_rank, reverse=True)
    chunk = max(1, len(off) // 2)
    while chunk >= 1:
        i = 0
        while i < len(off) and len(off) > 1:
            trial = off[:i] + off[i + chunk:]
            if trial and passes(trial):
                off = trial
            else:
                i += chunk
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)
    result["smallest"] = sorted(s.tag for s in off)
    result["runs"] = runs["n"]
    return result


def describe_features(res: dict) -> str:
    """The feature bisection's answer, for a terminal."""
    lines = []
    sws = res.get("switches", {})

    def how(tag):
        s = sws.get(tag, {})
        extra = [r for r in s.get("removes", []) if r != tag]
        also = f"; also removes {', '.join(extra)}" if extra else ""
        return f"{tag} [{s.get('kind', '?')}: {s.get('what', '')}{also}]"

    if res["smallest"]:
        lines.append(f"smallest set of features whose removal makes the case pass: "
                     f"{', '.join(res['smallest'])} ({res['runs']} runs)")
        for t in res["smallest"]:
            lines.append(f"  {how(t)}")
        for alt in res.get("alternatives", []):
            lines.append(f"  removing {', '.join(alt)} alone also makes it pass: {'; '.join(how(t) for t in alt)}")
    else:
        lines.append(res.get("note", "no feature set found"))
    if res["unswitchable"]:
        lines.append(f"features this family cannot switch off: {', '.join(res['unswitchable'])}")
    for tag, why in sorted(res.get("unusable", {}).items()):
        lines.append(f"  {tag}: not switchable here ({why})")
    return "\n".join(lines)


def _decorations():
    return SPEC_DECORATIONS


# ----------------------------------------------------------------- history
def git_bisect(good: str, bad: str, case_argv: list[str], repo: Path | None = None, log=print) -> dict:
    """Find the first commit between ``good`` and ``bad`` at which the case fails.

    Runs in a temporary ``git worktree`` of ``repo``; each step runs the case
    with THAT commit's code (its own harness/ and impl/ first on sys.path)."""
    repo = Path(repo or Path.cwd()).resolve()
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=repo, capture_output=True, text=True)
    if top.returncode != 0:
        raise RuntimeError(f"{repo} is not inside a git repository")
    repo = Path(top.stdout.strip())
    for rev in (good, bad):
        ok = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=repo, capture_output=True)
        if ok.returncode != 0:
            raise RuntimeError(f"{rev!r} is not a commit of {repo}")
    with tempfile.TemporaryDirectory(prefix="conformance-bisect-") as tmp:
        wt = Path(tmp) / "wt"
        counter = Path(tmp) / "runs"
        _git(repo, "worktree", "add", "--detach", str(wt), bad)
        try:
            step = [sys.executable, "-m", "harness.bisect", "--step", str(counter), "--", *case_argv]
            _git(wt, "bisect", "start", bad, good)
            proc = subprocess.run(["git", "bisect", "run", *step], cwd=wt, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(wt), "PYTHONSAFEPATH": ""})
            out = proc.stdout + proc.stderr
            first = None
            for line in out.splitlines():
                if line.endswith("is the first bad commit"):
                    first = line.split()[0]
            subject = ""
            if first:
                subject = _git(repo, "log", "-1", "--format=%h %s", first).strip()
            _git(wt, "bisect", "reset")
        finally:
            _git(repo, "worktree", "remove", "--force", str(wt))
        runs = len(counter.read_text().splitlines()) if counter.exists() else 0
    if first is None:
        log(out[-2000:])
    return {"first_bad": first, "subject": subject, "runs": runs}


def _git(cwd: Path, *args) -> str:
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {p.stderr.strip()[:300]}")
    return p.stdout


def _step(counter: str, argv: list[str]) -> int:
    """One ``git bisect run`` step: 0 the case passes, 1 it fails, 125 it cannot run here."""
    with open(counter, "a") as f:
        f.write("run\n")
    with tempfile.TemporaryDirectory(prefix="conformance-step-") as out:
        cmd = [sys.executable, "-c",
               "import sys; sys.path.insert(0, '.'); from harness.cli import main; sys.exit(main(sys.argv[1:]))",
               "run", *argv, "--out", out]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode == 0:
            return 0
        if p.returncode == 1 and (Path(out) / "rows.parquet").exists():
            return 1
        sys.stderr.write(f"cannot run the case at this commit (exit {p.returncode}): "
                         f"{shlex.join(cmd[3:])}\n{p.stderr[-500:]}\n")
        return 125


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--step" and sys.argv[3] == "--":
        sys.exit(_step(sys.argv[2], sys.argv[4:]))
    print("usage: python -m harness.bisect --step COUNTER -- RUN-ARGS...", file=sys.stderr)
    sys.exit(2)
