"""``conformance explain FAMILY``: one family, flat.

A family is assembled from shared mixins and bases (harness/families/base.py
and its underscored modules, sometimes another family's class); what it does is
spread over that chain. This prints it resolved, the way HF's flat modeling
file shows a model without its inheritance: which class (and file:line)
answers each hook, the tiny config, every layer's description and kind, where
each probe is read in HF and in llama.cpp's graph, the weight map, the fuzz
space, the model switches, and the family's findings with their bounds.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from ..errors import UsageError
from ..families import hookspec
from ..families.base import Family
from .. import families, kinds
from ..policy import load_policy
from contract.probes import order
from ..cli import parse_set

def register(sub) -> None:
    p = sub.add_parser("explain", help="one family, flat: its resolved hooks, layers, probe maps and findings")
    p.add_argument("family", metavar="FAMILY", help="a family name (see `conformance list`)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="an HF config override (as for run)")
    p.add_argument("--variant", help="a named variant of the family")
    p.set_defaults(fn=cmd_explain)


def _where(fn) -> str:
    try:
        f = Path(inspect.getsourcefile(fn)).resolve()
        line = inspect.getsourcelines(fn)[1]
    except (TypeError, OSError):
        return "?"
    return f"{_rel(f)}:{line}"


def _rel(path: Path) -> str:
    """``path`` relative to this checkout, where it is inside it (a plug-in family's is not)."""
    root = Path(__file__).resolve().parents[2]
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _owner(cls, name: str):
    for c in cls.__mro__:
        if name in c.__dict__:
            return c
    return None


def explain(fam, overrides: dict, variant: str | None) -> str:
    cls = type(fam)
    out = [f"# {fam.name}", "", fam.description, "",
           f"- HF model type: `{fam.hf_model_type}`; llama.cpp arch: `{fam.gguf_arch or '-'}`",
           f"- folder: `{_rel(families.folder(fam))}`",
           f"- class chain: {' -> '.join(f'{c.__name__} ({c.__module__})' for c in cls.__mro__ if c is not object)}",
           f"- variants: {', '.join(fam.variants) or '(none)'}", ""]
    # every hook the family's chain answers beyond Family's own defaults, grouped by who calls
    # it, in the hook spec's order (harness/families/hookspec.py)
    out += ["## Hooks, resolved", "", f"Beyond `Family`'s defaults; `{_rel(Path(hookspec.__file__))}` declares every hook.", "",
            "| called by | hook | answered by | where |", "|---|---|---|---|"]
    defaults = set(Family.__mro__)
    for group, hooks in hookspec.by_group().items():
        for h in hooks:
            owner = _owner(cls, h.name)
            if owner is None or owner in defaults:
                continue
            value = cls.__dict__.get(h.name) if owner is cls else owner.__dict__.get(h.name)
            fn = getattr(value, "__func__", value)
            where = f"`{_where(fn)}`" if callable(fn) else f"`{_where(owner)}` (data: {type(value).__name__})"
            out.append(f"| {group} | `{h.name}` | {owner.__name__} | {where} |")
    config = fam.make_config(overrides)
    lcs = fam.layer_configs(config, variant or (fam.variants[0] if fam.variants else None))
    out += ["", "## Tiny config", "", "```", ", ".join(f"{k}={v!r}" for k, v in sorted({**fam.tiny, **overrides}.items())),
            "```", "", "## Layers", ""]
    for i, lc in enumerate(lcs):
        kind = kinds.of(lc)
        feats = sorted(kind.features(lc, {})) if kind else []
        what = (f"{lc.label}: not implemented ({lc.reason})" if kind is None
                else f"{lc.label} [{', '.join(feats)}]")
        out.append(f"- L{i}: {what}")
    out += ["", "## Where each probe is read", "", "| layer | probe | HF (module, in/out) | llama.cpp (cb name, pick, layout) |",
            "|---|---|---|---|"]
    seen = set()
    for i in range(len(lcs)):
        hp = fam.hf_points_for(config, i)
        lp = fam.lc_points_for(config, i) if fam.gguf_arch else {}
        lin = fam.lc_layer_input(config, i) if fam.gguf_arch else None
        lsum = fam.lc_input_sum(config, i) if fam.gguf_arch and lin is None else None
        lc_in = "-"
        if lin is not None:
            # the tensor under its layer's number (lc_layer_input: the previous l_out by default)
            src = lin[0].split(".")[0]
            lc_in = f"`{lin[1].name}`" + ("" if lin[0] == "embeddings" else " of this layer" if src == f"L{i}"
                                          else " of the previous layer" if src == f"L{i - 1}" else f" of {src}")
        elif lsum:
            lc_in = " + ".join(f"`{p.name}`" for p in lsum) + " (float32 sum)"
        sig = (tuple(sorted(hp.items())), tuple(sorted(lp.items())), lc_in)
        if sig in seen:
            continue
        seen.add(sig)
        for probe in sorted(set(hp) | set(lp) | set(fam.hf_tapped) | {"layer_in"}, key=lambda p: _order(p)):
            h = hp.get(probe)
            c = lp.get(probe)
            hf_at = (f"`{h.path or '(layer)'}` {h.io}" if h else "`hf_taps`" if probe in fam.hf_tapped else "-")
            lc_at = f"`{c.name}` {c.pick} {c.layout}" if c else "-"
            if probe == "layer_in":
                lc_at = lc_in
            out.append(f"| L{i} | {probe} | {hf_at} | {lc_at} |")
    out.append(f"\n(HF's eager attention function `{fam.eager_name}` is wrapped for q_rope, k_rope, attn_probs, "
               "attn_heads; a layer not listed repeats the one above it.)")
    hidden = {**{p: ("HF", why) for p, why in fam.hf_not_exposed.items()}}
    for p, why in (fam.lc_not_exposed or {}).items():
        hidden[p] = ("HF and llama.cpp", why) if hidden.get(p, ("", ""))[1] == why else ("llama.cpp", why)
    if hidden or fam.hf_tapped:
        out += ["", "## Not exposed, and computed", ""]
        out += [f"- `{p}`: not exposed by {who}: {why}" for p, (who, why) in sorted(hidden.items())]
        out += [f"- `{p}` (HF): {how}" for p, how in sorted(fam.hf_tapped.items())]
    wm = getattr(fam, "weight_map", None)
    if wm:
        out += ["", "## Weights (HF name in the decoder layer -> impl)", ""]
        out += [f"- `{k}` -> `{v}`" for k, v in wm.items()]
    if fam.fuzz_space:
        out += ["", "## Fuzz space", "", f"`{fam.fuzz_space}`"]
    out += ["", "## Model switches (feature bisection)", ""]
    out += [f"- `{t}`: {sw.what}{' (HF only)' if sw.hf_only else ''}" for t, sw in fam.model_switches(config).items()]
    mine = [f for f in load_policy().findings
            if (f["family"] == fam.name if isinstance(f["family"], str) else fam.name in f["family"])]
    out += ["", "## Findings (harness/policy.py; bounded by their measured size)", ""]
    if not mine:
        out.append("(none: every comparison of this family must pass at the dtype's bound)")
    for f in mine:
        bounds = ", ".join(f"{k} {f[k]:g}" for k in ("max_nmse", "max_nmse_per_token", "max_nmse_per_layer") if k in f)
        cond = f" when {f['config']}" if f.get("config") else ""
        probes = f" at {', '.join(f['probes'])}" if f.get("probes") else ""
        start = f" from {f['downstream_of']}" if f.get("downstream_of") else ""
        out.append(f"- **{f['_n']}** {f['candidate']} vs {f['reference']}{cond}{probes}{start} ({bounds or 'unbounded'}): "
                   f"{f['reason']}")
    return "\n".join(out) + "\n"


def _order(probe: str) -> int:
    return order(probe)


def cmd_explain(a) -> int:
    fam = families.get(a.family)
    if a.variant is not None and a.variant not in fam.variants:
        raise UsageError(f"unknown variant {a.variant!r} for family {fam.name}; valid: "
                         f"{', '.join(fam.variants) or '(none)'}")
    print(explain(fam, dict(parse_set(a.set)), a.variant), end="")
    return 0
