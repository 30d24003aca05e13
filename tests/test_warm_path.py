"""The warm path of one case (harness/warm.py, issue 29 finding 4): a case whose
every capture is cached runs from its record -- no HF config, no torch model --
and gives the rows the cold way gives; anything the record depends on is in its
key, so a changed config or family source takes the cold path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from harness import cache, families, warm
from harness.case import Case, CaseRun
from harness.policy import _MISSING, config_value
from harness.testing import HF_AND_LLAMACPP

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache of this test's own: no other test's record or capture is found."""
    d = tmp_path / "cache"
    monkeypatch.setenv("CONFORMANCE_CACHE", str(d))
    return d


def _rows(case, policy, warm_path):
    run = CaseRun(case, policy, warm=warm_path)
    rows = run.rows()
    return run, rows


def _same(a: list[dict], b: list[dict]) -> None:
    """Row for row, field for field (NaN equal to NaN; the JSON a report writes)."""
    dump = lambda rows: [json.dumps(r, sort_keys=True, default=str) for r in rows]  # noqa: E731
    assert dump(a) == dump(b)


CASES = [
    Case(family="llama"),
    # every reference (llama.cpp's capture replayed too), the paged backing, two sequences
    Case(family="qwen3", ref=HF_AND_LLAMACPP, kv="paged", tokens=9),
    # float64: the rounding run of llama.cpp (an HF capture forced by llama.cpp's)
    Case(family="gemma2", ref=HF_AND_LLAMACPP, dtype="float64", tokens=7),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.case_id())
def test_warm_rows_are_the_cold_rows(case, policy, own_cache, request):
    if "llamacpp" in case.refs:
        request.getfixturevalue("need_llamacpp")
    _, cold = _rows(case, policy, warm_path=False)  # the cold way, every capture now cached
    first, again = _rows(case, policy, warm_path=True)  # cold (no record yet): writes it
    assert first.record is None and first.recorder is not None and first.recorder.ok
    _same(cold, again)
    run, warm_rows = _rows(case, policy, warm_path=True)
    assert run.record is not None, "the second run found no record"
    assert "float_model" not in run.__dict__ and "request" not in run._memo  # no model built, no reference asked
    _same(cold, warm_rows)
    assert {r["status"] for r in warm_rows} & {"pass", "finding"}, "nothing compared: the identity would be empty"


def test_a_wrong_record_gives_other_rows(policy, own_cache):
    """The identity above can fail: a record whose weights are not the model's
    (one weight of layer 0 scaled) changes impl's rows -- which is why the record
    is keyed by everything the weights come from."""
    case = Case(family="llama")
    _, cold = _rows(case, policy, warm_path=False)
    _rows(case, policy, warm_path=True)
    f = next((own_cache / warm.KIND).glob("*.pkl"))
    import pickle

    data = pickle.loads(f.read_bytes())
    for (dtype, i), w in data["weights"].items():
        if i == 0:
            w["wq"] = w["wq"] * 1.01
    f.write_bytes(pickle.dumps(data))
    run, bad = _rows(case, policy, warm_path=True)
    assert run.record is not None
    assert [r["status"] for r in bad] != [r["status"] for r in cold]


def test_a_set_or_a_seed_misses_the_record(policy, own_cache):
    case = Case(family="llama")
    _rows(case, policy, warm_path=True)  # cold: writes the record
    assert CaseRun(case, policy, warm=True).record is not None
    for other in (replace(case, overrides=(("rope_parameters.rope_theta", 500.0),)), replace(case, seed=1),
                  replace(case, tokens=15)):
        run = CaseRun(other, policy, warm=True)
        assert run.record is None and run.recorder is not None, other.case_id()


def test_family_source_is_in_the_key(policy, own_cache, tmp_path, monkeypatch):
    """The family's own files key the record by content: the same text finds it, one
    changed line (a copy of the family module edited) does not."""
    case = Case(family="llama")
    _rows(case, policy, warm_path=True)
    fam = families.get("llama")
    src = cache.family_sources(fam)
    copies = []
    for f in src:
        c = tmp_path / "src" / f.parent.name / f.name
        c.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, c)
        copies.append(c)
    monkeypatch.setattr(cache, "family_sources", lambda family: copies)
    assert CaseRun(case, policy, warm=True).record is not None  # the same content
    copies[0].write_text(copies[0].read_text() + "\n# an edit\n")
    assert CaseRun(case, policy, warm=True).record is None


def test_every_module_of_the_project_keys_the_record():
    files = {p.relative_to(ROOT).as_posix() for p in warm._tree_files()}
    for tree in ("harness", "contract", "impl"):
        for p in (ROOT / tree).rglob("*.py"):
            assert p.relative_to(ROOT).as_posix() in files
    assert "pyproject.toml" in files


def test_a_record_short_of_a_capture_runs_cold(policy, own_cache):
    """A record that lacks what the run asks for (here: every capture) is a Miss: the
    case runs the cold way and its rows are the cold rows."""
    case = Case(family="llama")
    _, cold = _rows(case, policy, warm_path=False)
    _rows(case, policy, warm_path=True)
    run = CaseRun(case, policy, warm=True)
    assert run.record is not None
    run.record.captures.clear()
    rows = run.rows()
    assert run.record is None and "float_model" in run.__dict__
    _same(cold, rows)


def test_a_record_whose_capture_is_gone_is_not_used(policy, own_cache):
    case = Case(family="llama")
    _rows(case, policy, warm_path=True)
    shutil.rmtree(own_cache / "hf")
    assert CaseRun(case, policy, warm=True).record is None


def test_the_snapshot_reads_as_the_config(policy):
    """Every config key a finding matches on (its ``config`` table, ``ne_key``,
    ``tokens_at_most_key``) reads the same from the recorded snapshot as from the
    HF config, for every family; and the memory estimate is the same."""
    from harness import budget

    keys = set()
    for f in policy.findings:
        for k, want in (f.get("config") or {}).items():
            keys.add(k)
            if isinstance(want, dict) and "ne_key" in want:
                keys.add(want["ne_key"])
        if f.get("tokens_at_most_key"):
            keys.add(f["tokens_at_most_key"])
    keys |= set(budget.POSITION_KEYS) | {"vocab_size", "intermediate_size", "final_logit_softcapping"}
    assert len(keys) > 10
    for name in families.registry():
        fam = families.get(name)
        config = fam.make_config({})
        snap = warm.ConfigSnapshot.of(config)
        for k in sorted(keys):
            real, got = config_value(config, k), config_value(snap, k)
            assert (real is _MISSING) == (got is _MISSING), (name, k)
            if real is not _MISSING and isinstance(real, (type(None), bool, int, float, str, list, tuple, dict)):
                assert type(real) is type(got) and real == got, (name, k, real, got)
        assert snap.to_json_string(use_diff=False) == config.to_json_string(use_diff=False)


def test_the_warm_run_imports_neither_torch_nor_transformers(own_cache):
    """`conformance run` of a recorded case on impl's NumPy backend: torch and
    transformers are never imported (what makes it a second, not ten)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CONFORMANCE_CACHE=str(own_cache))
    probe = ("import sys; from harness.cli import main; rc = main(sys.argv[1:]); "
             "print('IMPORTED', sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules)); "
             "sys.exit(rc)")
    out = []
    for i in range(2):
        p = subprocess.run([sys.executable, "-c", probe, "run", "--family", "llama", "-q", "--no-plots",
                            "--out", str(own_cache.parent / f"run{i}")], capture_output=True, text=True, cwd=ROOT,
                           env=env, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        out.append(p.stdout.splitlines()[-1])
    assert "torch" in out[0]  # the cold run builds the model
    assert out[1] == "IMPORTED []", out[1]
    a = [json.loads(json.dumps(r)) for r in _csv(own_cache.parent / "run0")]
    b = [json.loads(json.dumps(r)) for r in _csv(own_cache.parent / "run1")]
    assert a == b


def _csv(d: Path) -> list[dict]:
    import csv

    with open(d / "rows.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_weights_recorded_as_made(policy, own_cache):
    """The recorded weights are float64, bit for bit those the model gives."""
    case = Case(family="llama")
    run, _ = _rows(case, policy, warm_path=True)
    assert run.recorder is not None
    again = CaseRun(case, policy, warm=True)
    assert again.record is not None
    for i in range(len(run.layer_cfgs)):
        a, b = run.layer_weights_for("float32", i), again.layer_weights_for("float32", i)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (i, k)
