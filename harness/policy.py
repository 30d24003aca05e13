"""The tolerance policy: a TOML file under fixtures/ (the cross-family tables:
keyed by dtype and probe, with overrides that each carry a written reason), and
each family folder's ``findings.toml`` (harness/families/<name>/: where the
references compute different models for that family, each bounded by the size
it was measured at), merged when the policy is loaded."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
import json
import importlib.util

from .config_values import global_value
from .errors import UsageError, suggest
from . import references
from .versions import norm, versions
from contract.probes import LAYER_PROBES
from . import plugins

DEFAULT_POLICY = Path(__file__).resolve().parent.parent / "fixtures" / "tolerance.toml"
PRECISION_ORDER = ("float64", "float32", "bfloat16", "float16", "kv_q8_0", "q8_0", "q8_1", "q8_k")
_TOL_KEYS = {"nmse", "atol", "ratio", "nmse_floor", "floor_width", "score_floor", "rope_nmse", "rope_atol",
             "drift_ratio", "drift_nmse_floor", "drift_atol_floor"}
_OVERRIDE_KEYS = {"family", "dtype", "probe", "reference", "candidate", "reason"} | _TOL_KEYS
_FINDING_KEYS = {"family", "candidate", "reference", "probes", "layer_kind", "config", "downstream_of",
                 "max_nmse", "max_nmse_per_token", "max_nmse_per_layer", "dtypes", "reason", "seen_by",
                 "tokens_at_most_key", "tokens_over_key", "tokens_at_most", "later_call_rows_at_least",
                 "layer_config", "triangulate"}
# what a [finding.seen_by] inherits from the statement it belongs to (the same disagreement,
# the same reference config; its own probes, bounds and, optionally, words)
_INHERITED = ("family", "config", "layer_kind", "dtypes", "reason", "tokens_at_most_key", "tokens_over_key",
              "tokens_at_most", "later_call_rows_at_least")
FAMILIES_DIR = Path(__file__).resolve().parent / "families"
_MISSING = object()


def _reference_names() -> tuple[str, ...]:
    return references.names()


def _names(side: str) -> tuple[str, ...]:
    """The names a finding may give one side of a comparison by: the side's own, and
    the reference whose model it computes (``Reference.model_of``: HF's cached path
    computes HF's model, so a finding of llama.cpp vs HF holds for llama.cpp vs
    hf_cached too; a finding naming hf_cached holds for it alone)."""

    ref = references.registry().get(side)
    return (side,) if ref is None or not ref.model_of else (side, ref.model_of)


TRIANGULATION_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "triangulation"
_SIDE = {"HF": "hf", "llama.cpp": "llamacpp"}


@lru_cache(maxsize=1)
def followed() -> dict[tuple[str, str], str]:
    """``{(witness, finding label): the reference whose model it computes there}``, from
    the triangulation tables (``conformance divergences --triangulate W`` writes
    fixtures/triangulation/W.json): where mlx-lm was measured to compute HF's side of an
    HF-vs-llama.cpp finding, or llama.cpp's. A table measured on another release of the
    witness than the one installed says nothing (its verdicts may have moved). An engine's
    table (``--triangulate openvino``) says nothing here either: the engine is a candidate,
    judged by these findings, and one computing llama.cpp's model is a divergence of it from
    HF -- a finding that holds for a judged engine is a ``[[finding]]`` naming it."""

    have = {norm(k): v for k, v in versions().items()}
    out = {}
    for path in sorted(TRIANGULATION_DIR.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        w = data.get("witness", path.stem)
        if w not in references.names():
            continue
        pinned = {norm(k): v for k, v in (data.get("versions") or {}).items() if k.startswith(w)}
        if not pinned or any(have.get(k) != v for k, v in pinned.items()):
            continue
        for label, e in (data.get("findings") or {}).items():
            side = _SIDE.get(e.get("verdict"))
            if side:
                out[(w, label)] = side
    return out


def _names_for(side: str, f: dict, measured: dict | None = None) -> tuple[str, ...]:
    """``_names(side)``, and for a witness that computes one reference's model on this
    finding (``followed``; or ``measured``, the same verdict measured in the case at hand)
    that reference too: the finding holds for it in that place."""
    base = _names(side)
    label = finding_label(f)
    follows = (measured or {}).get((side, label)) or followed().get((side, label))
    return base if follows is None or follows in base else (*base, follows)


def finding_label(f: dict) -> str:
    """A finding's label (``gemma2#1``), its ``[finding.seen_by]`` counted as the statement's."""
    return str(f.get("_n", "")).split(" (seen by", 1)[0]


def pair_sides() -> tuple[str, ...]:
    """The references a finding's pair is drawn from: HF and llama.cpp (``_SIDE``) and the
    references computing one of their models (``Reference.model_of``: HF's cached path).
    Every other reference is a witness (issue 38's triangulation)."""

    sides = set(_SIDE.values())
    return tuple(n for n, r in references.registry().items() if n in sides or r.model_of in sides)


def config_value(config, dotted: str, family_values: dict | None = None):
    """A value of the reference's own config by dotted path (``rope_parameters.truncate``,
    ``attn_config.alibi_bias_max``: a table or an attribute at each step; a number
    indexes a list, ``layer_types.0``). ``family.NAME``: what the family reads from that
    config where no key says it (``Family.finding_values``, which the caller hands in as
    ``family_values``: gemma3n's KV sharing as llama.cpp's fixed start makes it). The
    policy asks no family itself: the rules sit below the families (the pipeline, which
    holds the family, passes its values)."""
    if dotted.startswith("family."):
        if family_values is None:
            return _MISSING
        return family_values.get(dotted[len("family."):], _MISSING)
    obj = config
    for part in dotted.split("."):
        if isinstance(obj, (list, tuple)):
            obj = obj[int(part)] if part.isdigit() and int(part) < len(obj) else _MISSING
        elif isinstance(obj, dict):
            obj = obj.get(part, _MISSING)
        else:
            # a per-layer key of a heterogeneous config (gemma4's head_dim): no one value to
            # match on, as the recorded snapshot has none
            obj = global_value(obj, part, _MISSING, per_layer=_MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def config_matches(config, conditions: dict, family_values: dict | None = None) -> bool:
    """Every condition of a finding's ``config`` table holds for ``config``: a plain
    value must equal the config's; ``{ ne_key = "head_dim" }`` means the value
    differs from the config's own ``head_dim``; a ``family.NAME`` key is a value the family
    reads from the config (``config_value``); ``{ set = true }`` means the value is
    present and not None / false (``{ set = false }``: absent, None or false);
    ``{ lt = 256 }`` means a number below 256 (a threshold a reference compares
    with: phi3's original_max_position_embeddings against llama.cpp's context)."""
    for key, want in conditions.items():
        have = config_value(config, key, family_values)
        if isinstance(want, dict):
            if "ne_key" in want:
                other = config_value(config, want["ne_key"], family_values)
                if have is _MISSING or other is _MISSING or have == other:
                    return False
            if "ne" in want and (have is _MISSING or have is None or have == want["ne"]):
                return False
            if "set" in want:
                is_set = have is not _MISSING and have is not None and have is not False
                if is_set != bool(want["set"]):
                    return False
            if "lt" in want and not (isinstance(have, (int, float)) and not isinstance(have, bool)
                                     and have < want["lt"]):
                return False
        elif have is _MISSING or have != want:
            return False
    return True


def dataflow_position(layer: int | None, probe: str) -> tuple:
    """Where a probe sits in the model's dataflow: model-level ``embeddings``
    first, then layer by layer in probe order, then ``final_norm`` / ``logits``."""

    if layer is None or layer < 0:
        return (-1, 0) if probe == "embeddings" else (float("inf"), 0)
    return (layer, LAYER_PROBES.index(probe) if probe in LAYER_PROBES else len(LAYER_PROBES))


def _depth(layer: int | None, n_layers: int | None) -> int | None:
    """How many layers a probe is past: layer i's probes i + 1, the model-level
    ``final_norm`` / ``logits`` all of them, ``embeddings`` none (counted as 1)."""
    if layer is not None and layer >= 0:
        return layer + 1
    return n_layers


def _parse_point(text: str) -> tuple:
    """``"L3.layer_out"`` or a model-level probe name -> its dataflow position."""
    layer, _, probe = text.partition(".")
    if probe and layer.startswith("L") and layer[1:].isdigit():
        return dataflow_position(int(layer[1:]), probe)
    return dataflow_position(None, text)


def comparison_dtype(a: str, b: str) -> str:
    """The less precise of two sides (f16 and bf16 count as equally coarse; a
    quantized weight type is coarser than both)."""
    # quantized weights: the type ggml quantizes the activations to (harness/ggml_types.py
    # activation_dtype); a 256-wide Q8_K block is coarser than a 32-wide Q8_0 / Q8_1 one
    # ggml_<act>: impl with ggml's activation rounding reproduced (the oracle) against
    # llama.cpp -- float32 summation order is what is left, coarser than float32 only just
    rank = {"float64": 0, "float32": 1, "f32": 1, "ggml_f16": 1.5, "ggml_bf16": 1.5, "ggml_q8_0": 1.5,
            "ggml_q8_1": 1.5, "ggml_q8_k": 1.5,
            "bfloat16": 2, "float16": 2, "bf16": 2, "f16": 2, "kv_q8_0": 3, "q8_0": 3, "q8_1": 3, "q8_k": 4}
    norm = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
    a, b = norm.get(a, a), norm.get(b, b)
    return a if rank[a] >= rank[b] else b


@dataclass
class Policy:
    path: str
    dtypes: dict
    overrides: list = field(default_factory=list)
    regression_factor: float = 4.0
    findings: list = field(default_factory=list)

    def finding(self, family: str, candidate: str, reference: str, probe: str, layer_kind: str,
                config=None, layer: int | None = None, nmse: float | None = None, bounded: bool = True,
                dtype: str | None = None, tokens: int | None = None, n_layers: int | None = None,
                chunks: tuple | None = None, measured: dict | None = None,
                family_values: dict | None = None) -> str | None:
        """The written reason when a failing comparison is a KNOWN disagreement of
        the references (a finding, reported as such), else None. Matched on the
        reference's own ``config`` (the HF config the case built, or read back from a
        GGUF's keys) -- never on what impl was told to compute, so an impl bug that
        switches a feature on cannot switch its excuse on -- and only up to the
        finding's measured size (``max_nmse``). ``chunks``: the case's rows per call,
        one tuple per sequence (harness/schedule.py ``BatchPlan.chunks``). ``family_values``:
        ``Family.finding_values(config)``, for a finding's ``family.NAME`` conditions."""
        for f in self.findings:
            fam = f.get("family", family)
            # a list: one disagreement of several families' llama.cpp archs (the same cause)
            if (family not in fam) if isinstance(fam, list) else fam != family:
                continue
            fc, fr = f.get("candidate", candidate), f.get("reference", reference)
            cn, rn = _names_for(candidate, f, measured), _names_for(reference, f, measured)
            # a finding between two references holds for the pair either way round (a witness
            # in the place of the side it follows stands where that side stood)
            if not (fc in cn and fr in rn) and not (fc in rn and fr in cn and candidate in _reference_names()
                                                     and fc in _reference_names()):
                continue
            if "probes" in f and probe not in f["probes"]:
                continue
            if f.get("layer_kind", layer_kind) != layer_kind:
                continue
            if "config" in f and (config is None or not config_matches(config, f["config"], family_values)):
                continue
            # layer_config: a condition on the layer's own entry of a per-layer list of the
            # config (layer_types = "sliding_attention": only gemma2's sliding layers), so a
            # disagreement of some layers excuses nothing on the others
            if "layer_config" in f and (config is None or layer is None or layer < 0 or not config_matches(
                    config, {f"{k}.{layer}": v for k, v in f["layer_config"].items()}, family_values)):
                continue
            # dtypes: the comparison dtypes it is known at (e.g. q8_k: quantized weights
            # only -- a disagreement the float comparison of the same case does not have)
            if "dtypes" in f and dtype not in f["dtypes"]:
                continue
            # tokens_at_most_key: it holds only for sequences no longer than that config value
            # (phi3's LongRoPE: HF switches factor sets past original_max_position_embeddings)
            if "tokens_at_most_key" in f:
                limit = config_value(config, f["tokens_at_most_key"]) if config is not None else _MISSING
                if tokens is None or not isinstance(limit, (int, float)) or tokens > limit:
                    continue
            # tokens_over_key: it holds only for sequences longer than that config value (mistral4's
            # query temperature: HF scales the queries from original_max_position_embeddings on;
            # a shorter case has no such disagreement to excuse)
            if "tokens_over_key" in f:
                start = config_value(config, f["tokens_over_key"]) if config is not None else _MISSING
                if tokens is None or not isinstance(start, (int, float)) or tokens <= start:
                    continue
            # tokens_at_most: it holds only up to the length it was measured at (a disagreement
            # that grows with the calls, as HF's bfloat16 lightning decay per row does: past it,
            # nothing here says how large it is)
            if "tokens_at_most" in f and (tokens is None or tokens > f["tokens_at_most"]):
                continue
            # later_call_rows_at_least: it holds only where some sequence has a call after its
            # first carrying at least that many rows (HF Mamba-1's cached multi-row scan, which
            # restarts from a zero state: a prefill alone, or one row per later call, is excused
            # nothing)
            if "later_call_rows_at_least" in f:
                need = f["later_call_rows_at_least"]
                if not chunks or not any(len(c) > 1 and max(c[1:]) >= need for c in chunks):
                    continue
            # downstream_of: "L0.layer_out" -- the disagreement starts there and is carried
            # by every later probe of a free-running reference (e.g. an FFN difference)
            if "downstream_of" in f and dataflow_position(layer, probe) < _parse_point(f["downstream_of"]):
                continue
            # max_nmse: the known disagreement has a size (a rounding-level MLP difference
            # carried downstream); a larger one at the same probes is not excused by it
            # bounded=False: which finding WOULD excuse this, whatever its size (measuring a
            # finding's size: scripts/measure_cpu_variants.py)
            if bounded and (nmse is None or not nmse <= self.finding_bound(f, tokens, _depth(layer, n_layers))):
                continue
            via = next((s for s in (candidate, reference) if len(_names_for(s, f, measured)) > len(_names(s))), None)
            if via is not None:
                where = ("in this case: it passes against that reference at this probe, and the finding's "
                         "pair was excused at this probe or in front of it" if (via, finding_label(f)) in (measured or {})
                         else f"on this finding (fixtures/triangulation/{via}.json)")
                return (f"finding {f['_n']}: {f['reason']} -- held for {via}, measured to compute "
                        f"{_names_for(via, f, measured)[-1]}'s model {where}")
            return f"finding {f['_n']}: {f['reason']}"
        return None

    @staticmethod
    def finding_bound(f: dict, tokens: int | None, depth: int | None = None) -> float:
        """The largest NMSE a finding excuses in a case of ``tokens`` tokens per
        sequence, at a probe ``depth`` layers deep. ``max_nmse``: a size that does not
        grow. ``max_nmse_per_token``: a disagreement whose NMSE grows with the sequence
        (a window one reference ignores: the full-attention side's output is a mean
        over ~t keys, its energy ~1/t, so the NMSE normalised by it grows ~t).
        ``max_nmse_per_layer``: a rounding every layer adds once and a free-running
        reference carries on (ggml's fp16 GELU table: each FFN adds its own), so the
        bound grows with the layers the probe is past. Given together: the largest."""
        scaled = {"max_nmse_per_token": ("tokens", tokens), "max_nmse_per_layer": ("layers", depth)}
        bound = f.get("max_nmse", float("inf") if not any(k in f for k in scaled) else 0.0)
        for key, (what, n) in scaled.items():
            if key in f:
                if n is None:
                    raise ValueError(f"finding {f.get('_n')} is bounded per {what[:-1]}: the case's {what} are needed")
                bound = max(bound, f[key] * n)
        return bound

    def tolerance(self, dtype: str, probe: str, family: str = "", reference: str = "",
                  candidate: str = "") -> tuple[dict, str]:
        """``(tolerance, reason_if_overridden)`` for one comparison (``candidate``: its
        candidate side, which an override may select)."""
        if dtype not in self.dtypes:
            raise UsageError(f"tolerance policy {self.path} has no dtype {dtype!r}; {suggest(dtype, self.dtypes)}")
        table = self.dtypes[dtype]
        tol = dict(table["default"])
        tol.update(table.get(probe, {}))
        reason = ""
        for o in self.overrides:
            if o.get("family", family) != family or o.get("dtype", dtype) != dtype:
                continue
            if o.get("probe", probe) != probe or o.get("reference", reference) != reference:
                continue
            if o.get("candidate", candidate) != candidate:
                continue
            tol.update({k: v for k, v in o.items() if k in _TOL_KEYS})
            reason = o["reason"]
        return tol, reason


def _check_finding(p, n, f) -> None:
    """One finding, refused in one line where it could not be applied as written."""
    _known_keys(p, f"finding {n}", {k: v for k, v in f.items() if k != "_n"}, _FINDING_KEYS)
    for key in ("max_nmse", "max_nmse_per_token", "max_nmse_per_layer"):
        v = f.get(key)
        # a bound is compared and multiplied at judging time: a string or NaN there would
        # be a traceback mid-run (or excuse nothing / everything), so it is refused here
        if key in f and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")):
            raise UsageError(f"tolerance policy {p}: finding {n} ({f.get('family')}) {key} must be a positive "
                             f"number, got {v!r}")
    for key, least, what in (("later_call_rows_at_least", 2, "rows in one call after a sequence's first"),
                             ("tokens_at_most", 1, "the longest sequence it was measured at")):
        v = f.get(key)
        if key in f and (isinstance(v, bool) or not isinstance(v, int) or v < least):
            raise UsageError(f"tolerance policy {p}: finding {n} ({f.get('family')}) {key} must be an integer "
                             f">= {least} ({what}), got {v!r}")
    if not str(f.get("reason", "")).strip() or "family" not in f:
        raise UsageError(f"tolerance policy {p}: every finding needs a family and a written reason (finding {n})")
    fam = f["family"]
    if not (isinstance(fam, str) and fam) and not (
            isinstance(fam, list) and fam and all(isinstance(x, str) and x for x in fam)):
        raise UsageError(f"tolerance policy {p}: finding {n} family must be a family name or a list of them, "
                         f"got {fam!r}")
    if "candidate" not in f or "reference" not in f:
        raise UsageError(f"tolerance policy {p}: finding {n} ({f['family']}) must name its pair "
                         "(candidate and reference)")
    # an excuse of a candidate (impl or another engine, not a reference) is bounded: the
    # reference config it holds under, the probes it names, the size it was measured at
    if f["candidate"] not in _reference_names() and (
            not any(k in f for k in ("max_nmse", "max_nmse_per_token", "max_nmse_per_layer"))
            or not f.get("probes") or not isinstance(f.get("config"), dict) or not f["config"]):
        raise UsageError(f"tolerance policy {p}: finding {n} ({f['family']}, {f['candidate']} vs "
                         f"{f['reference']}) excuses the candidate, so it needs config (the reference's "
                         "settings it holds under), probes and max_nmse")


def _expand(p, label: str, f: dict) -> list[dict]:
    """A finding as the matcher reads it: the statement, and its ``seen_by`` (the same
    disagreement as a candidate sees it) as a finding of its own. ``label`` names it
    in every row it excuses."""
    f = dict(f)
    seen = f.pop("seen_by", None)
    f["_n"] = label
    _check_finding(p, label, f)
    out = [f]
    if seen is not None:
        if not isinstance(seen, dict):
            raise UsageError(f"tolerance policy {p}: finding {label} seen_by must be a table, got {seen!r}")
        g = {**{k: f[k] for k in _INHERITED if k in f}, "candidate": "impl", **seen}
        g["_n"] = f"{label} (seen by {g['candidate']})"
        _check_finding(p, g["_n"], g)
        out.append(g)
    return out


def family_finding_files() -> list[Path]:
    """Every family folder's findings.toml: the built-in folders
    (harness/families/<name>/findings.toml), then the folder of each family
    another package registers (entry point group ``attn_conformance.families``)."""

    files = sorted(FAMILIES_DIR.glob("*/findings.toml"))
    for name, ep in plugins.entry_points("families").items():
        # the folder of the module the entry point names, found without importing it
        spec = importlib.util.find_spec(str(getattr(ep, "value", "")).partition(":")[0] or "-")
        if spec is None or not spec.origin:
            continue
        f = Path(spec.origin).resolve().parent / "findings.toml"
        if f.is_file() and f not in files:
            files.append(f)
    return files


def _family_findings(path: Path) -> list[dict]:
    """A family folder's findings, ``family`` defaulting to the folder's name."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"findings file {path} is not valid TOML: {e}") from None
    bad = set(data) - {"finding"}
    if bad:
        raise UsageError(f"findings file {path}: unknown tables {sorted(bad)}; valid: finding")
    fam = path.parent.name
    out = []
    for k, f in enumerate(data.get("finding", []), 1):
        f = {"family": fam, **f}
        out += _expand(path, f"{fam}#{k}", f)
    return out


def _known_keys(p, what: str, table: dict, valid: set) -> None:
    bad = set(table) - valid
    if bad:
        raise UsageError(f"tolerance policy {p}: {what} has unknown keys {sorted(bad)}; "
                         f"valid: {', '.join(sorted(valid))}")


def load_policy(path: str | Path | None = None) -> Policy:
    p = Path(path) if path else DEFAULT_POLICY
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"tolerance policy {p} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"tolerance policy {p} is not valid TOML: {e}") from None
    known = {"dtype", "override", "regression", "finding"}
    for key in data:
        if key not in known:
            raise UsageError(f"tolerance policy {p}: unknown table {key!r}; {suggest(key, sorted(known))}")
    dtypes = data.get("dtype", {})
    for dt, table in dtypes.items():
        if "default" not in table:
            raise UsageError(f"tolerance policy {p}: [dtype.{dt}] needs a 'default' entry")
        for probe, tol in table.items():
            _known_keys(p, f"[dtype.{dt}].{probe}", tol, _TOL_KEYS)
            fw = tol.get("floor_width", 1)
            # a divisor of the floor at judging time (scaling.floor_for): refused here, not mid-run
            if isinstance(fw, bool) or not isinstance(fw, (int, float)) or not 0 < fw < float("inf"):
                raise UsageError(f"tolerance policy {p}: [dtype.{dt}].{probe} floor_width {fw!r} is not valid; "
                                 f"valid: a positive number of terms (the reduction width the floor holds at)")
            sf = tol.get("score_floor", 0)
            if isinstance(sf, bool) or not isinstance(sf, (int, float)) or not 0 <= sf < float("inf"):
                raise UsageError(f"tolerance policy {p}: [dtype.{dt}].{probe} score_floor {sf!r} is not valid; "
                                 f"valid: a number >= 0 (times u^2 x the score magnitude: harness/scaling.py)")
    overrides = data.get("override", [])
    for o in overrides:
        _known_keys(p, "an override", o, _OVERRIDE_KEYS)
        if not str(o.get("reason", "")).strip():
            raise UsageError(f"tolerance policy {p}: every override needs a written reason ({o})")
    findings = []
    for n, f in enumerate(data.get("finding", []), 1):
        findings += _expand(p, f"shared#{n}", f)
    for fp in family_finding_files():
        findings += _family_findings(fp)
    reg = data.get("regression", {})
    return Policy(str(p), dtypes, overrides, float(reg.get("factor", 4.0)), findings)
