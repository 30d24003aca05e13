"""Engines outside Python: a case exported for them, and their dumps judged.

``conformance export-case CASE-ARGS --out DIR`` writes what an engine needs to
run one case (``case.json`` says where everything is):

- ``case.json``: the case (family, its HF model type and llama.cpp arch, the
  tokens, KV mode, rows per call), every layer's description (impl's
  ``LayerConfig`` / ``MlaConfig`` as plain data) with the probes the layer must
  emit and their shapes, and the dump format below;
- ``hf/``: the model as an HF checkpoint (``config.json``, ``model.safetensors``);
- ``layers.safetensors``: each layer's weights by impl's names, ``L{i}.{weight}``
  in HF ``nn.Linear`` layout ([out, in]), float32;
- ``model.gguf``: the GGUF the llama.cpp reference runs (families with an arch);
- ``inputs-{ref}.safetensors``: per reference, ``L{i}.layer_in`` [S, T, hidden]
  (float64): each layer's input in that reference's run, for teacher forcing;
  and ``tokens`` [S, T].

The engine writes a dump directory::

    DUMP/manifest.json           {"format": "attn-conformance-dump/1",
                                  "engine": {"name": ..., "version": ...},
                                  "case": <case.json's "case", verbatim>,
                                  "family": ..., "config": <case.json's "hf_config">,
                                  "weights": "which file the engine loaded",
                                  "tokens": [[...]], "dtype": "float32",
                                  "runs": {"hf": "hf", "llamacpp": "llamacpp"}
                                       or {"free": "free"},
                                  "not_exposed": {"attn_probs": "why"}}
    DUMP/<run>/L{i}.safetensors  tensors "L{i}.{probe}" in the canonical layout
                                 (harness/candidates/api.py PROBE_SHAPES)

A run named after a reference was teacher-forced with that reference's
``inputs-{ref}.safetensors``; ``free`` ran from the tokens (then ``layer_in``
and ``embeddings`` / ``final_norm`` / ``logits`` in ``free/model.safetensors``
are judged too). ``conformance judge DUMP`` rebuilds the case from the
manifest and judges the dump like any other candidate.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np

from ..errors import UsageError
from .. import kinds, references
from .api import Candidate, CandidateCapture
from harness.lazy import lazy
from contract.probes import LAYER_PROBES
from .. import verdict
from ..schedule import chunk_sizes
from .api import PROBE_SHAPES
from impl.backend import DTYPES
from contract.probes import PROBES

safetensors_numpy = lazy("safetensors.numpy")

CASE_FORMAT = "attn-conformance-case/1"
DUMP_FORMAT = "attn-conformance-dump/1"
FREE = "free"


def _plain(obj):
    """A layer description as JSON data (tuples as lists, nested dataclasses as tables)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    return obj


def save(path: Path, tensors: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors_numpy.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))


def load(path: Path) -> dict:
    try:
        return safetensors_numpy.load_file(str(path))
    except Exception as e:
        raise UsageError(f"{path} is not a readable safetensors file: {' '.join(str(e).split())[:200]}") from None


# ---------------------------------------------------------------- export-case
def export_case(run, out: Path) -> dict:
    """Write ``run``'s case for an outside engine into ``out``; returns case.json's data."""
    case = run.case
    out.mkdir(parents=True, exist_ok=True)
    layers = []
    for i, lc in enumerate(run.layer_cfgs):
        if not kinds.implemented(lc):
            layers.append({"index": i, "kind": lc.kind, "implemented": False, "reason": lc.reason})
            continue
        layers.append({"index": i, "kind": lc.kind, "implemented": True, "config": _plain(lc),
                       "expected_probes": verdict.expected_probes(lc)})
    weights = run.weights_for("float32")
    save(out / "layers.safetensors", {f"L{i}.{k}": np.asarray(v, dtype=np.float32)
                                      for i, w in enumerate(weights) for k, v in w.items() if v is not None})
    run.base_model.save_pretrained(str(out / "hf"), safe_serialization=True)
    gguf = None
    if run.family.gguf_arch or run.source is not None:
        if any(r.file_weights and r.available() for r in references.registry().values()):
            # the file llama.cpp runs: the user's, or the export at the case's weight type
            # (quantized by llama_model_quantize; run.base_model then holds its weights)
            shutil.copyfile(run.gguf_path, out / "model.gguf")
            gguf = "model.gguf"
    refs = {}
    for ref in case.refs:
        if ref in run.schedule_refusals:  # several references: one that cannot run the schedule sits out
            continue
        rc = run.capture(ref)
        if rc.error:
            raise UsageError(f"reference {ref} failed, so its layer inputs cannot be exported: {rc.error}")
        inputs = {k: v for k, v in rc.probes.items() if k.endswith(".layer_in")}
        inputs["tokens"] = run.tokens
        save(out / f"inputs-{ref}.safetensors", inputs)
        refs[ref] = {"inputs": f"inputs-{ref}.safetensors", "dtype": rc.dtype}
    data = {
        "format": CASE_FORMAT,
        "case": case.to_dict(),
        "case_id": case.case_id(),
        "family": run.family.name, "hf_model_type": run.family.hf_model_type, "gguf_arch": run.family.gguf_arch,
        "hf_config": run.config.to_dict(),
        "tokens": run.tokens.tolist(),
        "kv": case.kv, "page_size": case.page_size, "evict": case.evict,
        "chunks": [] if run.batch_plan.ragged else chunk_sizes(case.schedule, case.tokens),
        # the batch's calls in order, each [[seq, rows], ...]; a ragged case's sequences differ in
        # length ("lengths"), first call and arrival -- write each probe padded to the longest
        # (rows past a sequence's length are not compared)
        "steps": [[list(x) for x in call] for call in run.batch_plan.steps()],
        "lengths": list(run.batch_plan.lengths),
        "dtype": case.dtype,
        "layers": layers,
        "weights": {"hf": "hf/", "layers": "layers.safetensors", **({"gguf": gguf} if gguf else {})},
        "references": refs,
        "probe_order": list(LAYER_PROBES),
        "probe_shapes": PROBE_SHAPES,
        "dump": {"format": DUMP_FORMAT, "runs": {r: r for r in refs},
                 "files": "<run>/L{layer}.safetensors with tensors 'L{layer}.{probe}'"},
    }
    (out / "case.json").write_text(json.dumps(data, indent=1))
    return data


# ---------------------------------------------------------------- a dump
def read_manifest(d: Path) -> dict:
    p = Path(d) / "manifest.json"
    if not Path(d).is_dir():
        raise UsageError(f"dump {str(d)!r} is not a directory")
    try:
        m = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"dump {d} has no manifest.json") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"dump {d}: manifest.json is not valid JSON: {e}") from None
    if m.get("format") != DUMP_FORMAT:
        raise UsageError(f"dump {d}: manifest format {m.get('format')!r}; expected {DUMP_FORMAT!r}")
    for key in ("engine", "case", "tokens", "dtype", "runs"):
        if key not in m:
            raise UsageError(f"dump {d}: manifest.json lacks {key!r} (see harness/candidates/dump.py)")
    name = str((m["engine"] or {}).get("name", "")).strip()
    if not name or name in (*references.names(), "-") or name == "impl":
        raise UsageError(f"dump {d}: engine name {name!r} must be set and must not be impl or a reference's")
    runs = m["runs"]
    if not isinstance(runs, dict) or not runs:
        raise UsageError(f"dump {d}: 'runs' must name at least one run, e.g. {{\"hf\": \"hf\"}}")
    refs = references.names()
    bad = [r for r in runs if r not in (*refs, FREE)]
    if bad or (FREE in runs and len(runs) > 1):
        raise UsageError(f"dump {d}: runs {sorted(runs)}; valid: {' and/or '.join(refs)} (teacher-forced), "
                         f"or {FREE} alone")
    for r, sub in runs.items():
        if not (Path(d) / sub).is_dir():
            raise UsageError(f"dump {d}: run {r!r} names {sub!r}, which is not a directory of the dump")

    if m["dtype"] not in DTYPES:
        raise UsageError(f"dump {d}: dtype {m['dtype']!r}; valid: {', '.join(DTYPES)}")
    return m


class DumpCandidate(Candidate):
    """The engine that wrote a dump directory."""
    ragged = True  # export-case gave it the case's steps and lengths (case.json)

    def __init__(self, path: str):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.engine_name = self.name = str(self.manifest["engine"]["name"])
        self.teacher_forced = FREE not in self.manifest["runs"]
        self.description = (f"dump of {self.engine_name} {self.manifest['engine'].get('version', '')} "
                            f"({self.path})").replace("  ", " ")

    def unsupported(self, run) -> str | None:
        tokens = np.asarray(self.manifest["tokens"])
        if tokens.shape != run.tokens.shape or not (tokens == run.tokens).all():
            raise UsageError(f"dump {self.path}: its tokens are not the case's ({tokens.shape} vs "
                             f"{run.tokens.shape}); dump the case conformance export-case wrote")
        return None

    def _run_dir(self, ref: str) -> Path | None:
        runs = self.manifest["runs"]
        sub = runs.get(FREE if not self.teacher_forced else ref)
        return None if sub is None else self.path / sub

    def capture(self, run, rc) -> CandidateCapture:
        cap = CandidateCapture(self.engine_name, self.manifest["dtype"],
                               not_exposed=dict(self.manifest.get("not_exposed") or {}))
        d = self._run_dir(rc.name)
        if d is None:
            raise RuntimeError(f"the dump holds no run teacher-forced with {rc.name}'s inputs "
                               f"(runs: {', '.join(self.manifest['runs'])})")
        for f in sorted(d.glob("*.safetensors")):
            for k, v in load(f).items():
                if k in cap.probes:
                    raise UsageError(f"dump {self.path}: tensor {k!r} appears in two files of run {d.name}")
                cap.probes[k] = np.asarray(v, dtype=np.float64)
        if not cap.probes:
            raise RuntimeError(f"the dump's run {d.name} holds no tensors")
        self._check_shapes(cap.probes, rc, d.name)
        return cap

    def _check_shapes(self, probes: dict, rc, run_name: str) -> None:
        """A tensor that names no probe, or whose shape is not the case's, is a dump
        written wrong -- bad input (exit 2) naming the tensor, the expected and the
        found shape, not a judged ``error`` row (issue 29, finding 7). The expected
        shape is the reference's own probe of the same name (the canonical layout
        the judge compares in)."""

        for k, v in probes.items():
            probe = k.split(".", 1)[1] if re.fullmatch(r"L\d+\..+", k) else k
            if probe not in PROBES:
                raise UsageError(f"dump {self.path}: run {run_name}: tensor {k!r} names no probe; tensors are "
                                 f"L{{layer}}.{{probe}} or a model probe, probes: {', '.join(PROBES)}")
            if k in rc.probes and tuple(np.shape(v)) != tuple(np.shape(rc.probes[k])):
                raise UsageError(f"dump {self.path}: run {run_name}: {k} has shape {tuple(np.shape(v))}; the case's "
                                 f"{k} is {tuple(np.shape(rc.probes[k]))} (case.json probe_shapes gives the layout)")
