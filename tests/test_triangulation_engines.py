"""Engines as witnesses (issue 38, harness/commands/triangulate.py): a candidate engine
re-runs a finding's worst case judged against each side, and its verdict comes from its
rows by the rule the mlx column uses -- at the first probe the finding excused that it
exposes, the side it agrees with by the pair's own bound. Synthetic rows stand in for the
engines here (no engine runs); the stored tables are checked against the policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands import triangulate
from harness.commands.divergences import DEFAULT_RUN, divergences
from harness.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
LABEL = "qwen2#1"  # a finding the default baseline reaches: its worst case is what the fakes answer
BOUND = 1e-10


def row(cand, ref, layer, probe, status, nmse=None, reason=""):
    return {"candidate": cand, "reference": ref, "layer": layer, "probe": probe, "status": status,
            "nmse": nmse, "tol_nmse": BOUND, "reason": reason}


def pair_rows(first_layer=1, probes=("attn_probs", "attn_heads", "attn_out")):
    """llama.cpp against HF, the finding excused from ``first_layer`` on (what the re-run's pair rows say)."""
    out = [row("llamacpp", "hf", 0, p, "pass", 1e-14) for p in probes]
    for layer in range(first_layer, 2):
        out += [row("llamacpp", "hf", layer, p, "finding", 0.3, f"nmse 0.3 > 1e-10 -- known disagreement: "
                                                                 f"finding {LABEL}: ...") for p in probes]
    return out


def measure_with(monkeypatch, w: triangulate.Witness, rows_of):
    """``measure`` over qwen2 with ``w`` as the witness and ``rows_of(case)`` as the re-run."""
    import harness.case

    seen = []

    def fake_run_case(case, policy, progress=None):
        seen.append(case)
        return rows_of(case), {}

    monkeypatch.setattr(triangulate, "as_witness", lambda name: w)
    monkeypatch.setattr(harness.case, "run_case", fake_run_case)
    table = triangulate.measure(DEFAULT_RUN, w.name, ["qwen2"])
    return table, seen


ENGINE = triangulate.Witness("some-engine", candidate=True, teacher_forced=False, packages=())


def test_an_engine_is_the_case_s_candidate_against_each_side(monkeypatch):
    table, seen = measure_with(monkeypatch, ENGINE, lambda case: pair_rows())
    assert seen and all(c.candidate == "some-engine" and c.refs == ["hf", "llamacpp"] for c in seen)
    e = table["findings"][LABEL]
    assert "--candidate some-engine --ref hf,llamacpp" in e["case"], e
    assert table["families"] == ["qwen2"]  # a narrowed table says what it was measured over


@pytest.mark.parametrize("vs_hf,vs_lc,want", [
    # computes HF's model; against llama.cpp its row passes anyway -- judged through the
    # float64 oracle, HF's model (ctranslate2 on falcon#1) -- and its distance says otherwise
    ((1e-14, "pass"), (0.3, "pass"), "HF"),
    # computes llama.cpp's model to 1e-13, and the oracle rule fails it against llama.cpp
    # too (ctranslate2 on qwen2#1): by its distances it follows llama.cpp
    ((0.3, "fail"), (1e-13, "fail"), "llama.cpp"),
    ((0.2, "fail"), (0.2, "fail"), "neither"),
    ((1e-12, "pass"), (1e-12, "pass"), "both"),
])
def test_an_engine_s_verdict_is_its_distance_to_each_side_by_the_pair_s_bound(monkeypatch, vs_hf, vs_lc, want):
    def rows_of(case):
        w = [row("some-engine", ref, 1, "q_rope", "not-exposed") for ref in ("hf", "llamacpp")]  # skipped over
        w += [row("some-engine", "hf", 1, "attn_probs", vs_hf[1], vs_hf[0]),
              row("some-engine", "llamacpp", 1, "attn_probs", vs_lc[1], vs_lc[0])]
        return pair_rows() + w

    e = measure_with(monkeypatch, ENGINE, rows_of)[0]["findings"][LABEL]
    assert (e["verdict"], e["at"]) == (want, "L1.attn_probs"), e
    assert e["vs_hf"].startswith(("pass", "fail")) and "1e-10" in e["vs_hf"], e


def test_a_reference_witness_keeps_its_rows_statuses(monkeypatch):
    """mlx's rows against each side are already the pair's rule (reference against reference):
    read as they are, from the re-run with it beside the pair and impl as the candidate."""
    mlx = triangulate.Witness("mlx", candidate=False, teacher_forced=False, packages=())

    def rows_of(case):
        return pair_rows() + [row("mlx", "hf", 1, "attn_probs", "fail", 1e-14),  # the status, not the number
                              row("mlx", "llamacpp", 1, "attn_probs", "pass", 0.3)]

    table, seen = measure_with(monkeypatch, mlx, rows_of)
    assert all(c.candidate == "impl" and c.refs == ["hf", "llamacpp", "mlx"] for c in seen)
    assert table["findings"][LABEL]["verdict"] == "llama.cpp"


def test_a_teacher_forced_engine_is_read_only_where_the_pair_starts_to_differ(monkeypatch):
    """Fed each side's own input to every layer, it agrees with both past the layer where the
    pair starts to differ: "both" there would be a verdict on its inputs. The finding starts in
    layer 0's FFN half (layer_out), which the engine does not compute: not covered."""
    tf = triangulate.Witness("layer-engine", candidate=True, teacher_forced=True, packages=())

    def rows_of(case):
        pair = pair_rows(first_layer=0, probes=("layer_out",)) + pair_rows(first_layer=1, probes=("attn_probs",))
        return pair + [row("layer-engine", ref, 1, "attn_probs", "pass", 1e-14) for ref in ("hf", "llamacpp")]

    e = measure_with(monkeypatch, tf, rows_of)[0]["findings"][LABEL]
    assert e["verdict"] == "not covered" and "teacher-forced" in e["why"], e

    def rows_at_origin(case):  # the same engine where the pair starts to differ at a probe it computes
        return pair_rows() + [row("layer-engine", "hf", 1, "attn_probs", "pass", 1e-14),
                              row("layer-engine", "llamacpp", 1, "attn_probs", "fail", 0.3)]

    assert measure_with(monkeypatch, tf, rows_at_origin)[0]["findings"][LABEL]["verdict"] == "HF"


@pytest.mark.parametrize("status", ["skipped", "not-implemented", "error"])
def test_an_engine_that_cannot_run_the_case_is_not_covered_in_its_words(monkeypatch, status):
    words = "the engine's own words"
    e = measure_with(monkeypatch, ENGINE, lambda case: [row("some-engine", "-", None, "*", status, None, words)]
                     )[0]["findings"][LABEL]
    assert (e["verdict"], e["why"]) == ("not covered", words)


def test_an_engine_s_usage_error_is_not_covered(monkeypatch):
    import harness.case

    def refuse(case, policy, progress=None):
        raise UsageError("candidate some-engine cannot run this")

    monkeypatch.setattr(triangulate, "as_witness", lambda name: ENGINE)
    monkeypatch.setattr(harness.case, "run_case", refuse)
    e = triangulate.measure(DEFAULT_RUN, "some-engine", ["qwen2"])["findings"][LABEL]
    assert (e["verdict"], e["why"]) == ("not covered", "candidate some-engine cannot run this")


@pytest.mark.parametrize("name", ["impl", "hf-sdpa", "no-such-engine"])
def test_what_is_no_witness_is_refused_in_one_line(tmp_path, name):
    """impl is what is judged; hf-sdpa runs HF's own code (it would side with HF by
    construction). The line names the valid ones: the references outside the pair, then the
    engines."""
    p = subprocess.run([sys.executable, "-m", "harness.cli", "divergences", "--triangulate", name],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "not a witness; valid: " in lines[0], p.stderr
    valid = lines[0].split("valid: ", 1)[1].split(", ")
    assert valid == triangulate.witness_names() and "impl" not in valid and "mlx" in valid
    assert {"ort-gqa", "ort-genai", "openvino", "ctranslate2"} <= set(valid)


def engine_tables() -> dict[str, dict]:
    from harness import references

    return {w: t for w, t in triangulate.load_tables().items() if w not in references.names()}


def test_the_stored_engine_tables_hold_the_policy_s_findings():
    """Every label an engine's table holds is an HF-vs-llama.cpp finding of the policy that the
    baseline reached; a whole table holds every such finding (a narrowed one, those of its
    families); verdicts as the rule names them, each with its probe or its reason."""
    import pandas as pd

    from harness.policy import load_policy

    tables = engine_tables()
    assert tables, "fixtures/triangulation holds the engines' tables (conformance divergences --triangulate NAME)"
    pol = load_policy()
    df = pd.read_parquet(DEFAULT_RUN / "rows.parquet")
    reasons = " ".join(df.loc[df["status"] == "finding", "reason"].astype(str))
    pair = {f["_n"]: f for f in pol.findings if f["candidate"] == "llamacpp" and f["reference"] in ("hf", "hf_cached")}
    reached = {n for n in pair if f"finding {n}:" in reasons}
    for w, t in tables.items():
        assert t["witness"] == w and w in triangulate.witness_names(), w
        labels = set(t["findings"])
        assert labels <= reached, (w, sorted(labels - reached))
        want = reached
        if t.get("families"):
            want = {n for n in reached if set(pair[n]["family"] if isinstance(pair[n]["family"], list)
                                              else [pair[n]["family"]]) & set(t["families"])}
        assert labels == want, (w, sorted(labels ^ want))
        for label, e in t["findings"].items():
            assert e["verdict"] in {"HF", "HF (cached)", "llama.cpp", "neither", "both", "not covered"}, (w, label)
            assert (e.get("why") if e["verdict"] == "not covered" else e.get("at")), (w, label, e)
            assert f"--candidate {w} " in e["case"], (w, label, e["case"])
        # the engine's own releases, which the page sets beside the lock's
        from harness import candidates

        assert set(candidates.get(w).engine_packages) <= set(t["versions"]), (w, t["versions"])


def test_an_engine_s_table_excuses_nothing():
    """The policy reads a reference's table (mlx computing llama.cpp's model is excused against
    HF there), never an engine's: the engine is judged, and its table is a measurement of it."""
    from harness.policy import followed

    assert not {w for w, _ in followed()} & set(engine_tables())


def test_the_page_has_a_column_per_stored_table():
    tables = triangulate.load_tables()
    page = divergences(DEFAULT_RUN)
    header = next(ln for ln in page.splitlines() if ln.startswith("| finding |"))
    assert header.endswith("".join(f" {w} computes |" for w in tables)), header
    assert list(tables)[0] == "mlx"  # the third reference first, then the engines
    rows = [ln for ln in page.splitlines() if ln.startswith("| `")]
    assert rows and all(ln.count("|") == header.count("|") for ln in rows)
    assert "an engine judged as the case's candidate" in page
    for w in engine_tables():
        assert f"**{w} computes**" in page and f"`{w}`: measured" in page


def test_a_narrowed_table_says_not_measured_outside_its_families():
    from harness.commands.divergences import _verdict

    f = {"candidate": "llamacpp", "reference": "hf", "family": "gemma2"}
    assert _verdict({"findings": {}, "families": ["qwen2"]}, f, "gemma2#1") == "not measured"
    assert _verdict({"findings": {}}, f, "gemma2#1") == "not reached"
    assert _verdict({"findings": {}, "families": ["gemma2"]}, f, "gemma2#1") == "not reached"


def test_write_keeps_a_whole_table_whole_and_a_narrowed_one_narrowed(tmp_path, monkeypatch):
    monkeypatch.setattr(triangulate, "TABLES", tmp_path)
    e = {"case": "c", "verdict": "not covered", "why": "w"}
    triangulate.write({"witness": "x", "versions": {}, "findings": {"a#1": e}}, None)
    triangulate.write({"witness": "x", "versions": {}, "findings": {"b#1": e}, "families": ["b"]}, ["b"])
    whole = json.loads((tmp_path / "x.json").read_text())
    assert set(whole["findings"]) == {"a#1", "b#1"} and "families" not in whole
    triangulate.write({"witness": "y", "versions": {}, "findings": {"b#1": e}, "families": ["b"]}, ["b"])
    triangulate.write({"witness": "y", "versions": {}, "findings": {"c#1": e}, "families": ["c"]}, ["c"])
    assert json.loads((tmp_path / "y.json").read_text())["families"] == ["b", "c"]
