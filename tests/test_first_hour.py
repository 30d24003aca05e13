"""A newcomer's first hour (issue 29): bad input a user meets first is refused
as bad input -- one line, exit 2, nothing left behind -- before any capture;
commands print only their own lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def one_line_exit_2(p) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    return lines[0]


def test_prompt_on_a_seeded_vocabulary_is_refused_before_any_capture(tmp_path):
    """Finding 6: --prompt on a built-in family killed llama.cpp's tokenizer (signal 6,
    unordered_map::at) after HF was captured. The seeded export's 128 tokens hold no
    text; the refusal says what would (a file's tokenizer, or a byte vocabulary)."""
    from harness.case import Case, CaseRun
    from harness.errors import UsageError
    from harness.policy import load_policy

    out = tmp_path / "r"
    line = one_line_exit_2(cli("run", "--family", "llama", "--ref", "all", "--prompt", "hello", "--out", str(out)))
    assert "--prompt needs a tokenizer" in line and "128-token" in line and "--gguf FILE" in line
    assert "vocab_size=260" in line and not out.exists()
    run = CaseRun(Case(family="llama", ref="all", prompt="hello"), load_policy(None))
    with pytest.raises(UsageError):
        _ = run.tokens
    # refused before the GGUF export and before any capture
    assert "gguf_path" not in run.__dict__ and not any(k.startswith("capture") for k in run.timings)


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("case") / "case"
    p = cli("export-case", "--family", "llama", "--ref", "hf", "--out", str(d))
    assert p.returncode == 0, p.stderr
    # finding 9: HF's "Writing model shards" tqdm bar went to a non-tty stderr
    assert p.stderr.strip() == "", p.stderr
    return d


def writer(case, dump, *extra):
    return subprocess.run([sys.executable, str(ROOT / "examples" / "dump_writer.py"), str(case), str(dump), *extra],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_dump_writer_refuses_a_probe_it_does_not_write(case_dir, tmp_path):
    """Finding 7: --plant-error L1.qrope (a typo) exited 0 and wrote a clean dump."""
    p = writer(case_dir, tmp_path / "dump", "--plant-error", "L1.qrope")
    line = one_line_exit_2(p)
    assert "'L1.qrope' names no tensor" in line and "q_rope" in line and not (tmp_path / "dump").exists()
    assert writer(case_dir, tmp_path / "ok", "--plant-error", "L1.q_rope").returncode == 0


def test_judge_refuses_a_wrong_shaped_dump(case_dir, tmp_path):
    """Finding 7: a dump with a wrong-shaped probe was judged (an error row, exit 1)
    instead of refused as bad input naming the probe and both shapes."""
    from safetensors.numpy import load_file, save_file

    dump = tmp_path / "dump"
    assert writer(case_dir, dump).returncode == 0
    ok = cli("judge", str(dump), "-q", "--out", str(tmp_path / "ok"))
    assert ok.returncode == 0 and ok.stdout.startswith("PASS: "), ok.stdout + ok.stderr
    f = dump / "hf" / "L1.safetensors"
    t = load_file(str(f))
    good = t["L1.q_rope"].shape
    t["L1.q_rope"] = np.ascontiguousarray(np.swapaxes(t["L1.q_rope"], 1, 2))  # [S, H, T, D]: heads and tokens swapped
    save_file(t, str(f))
    out = tmp_path / "bad"
    line = one_line_exit_2(cli("judge", str(dump), "--out", str(out)))
    assert "L1.q_rope has shape" in line and str(tuple(t["L1.q_rope"].shape)) in line and str(tuple(good)) in line
    assert not out.exists()
    t["L1.qrope"] = t.pop("L1.q_rope")  # a name that is no probe
    save_file(t, str(f))
    assert "'L1.qrope' names no probe" in one_line_exit_2(cli("judge", str(dump), "--out", str(out)))
