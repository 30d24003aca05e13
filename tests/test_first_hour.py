"""A newcomer's first hour (issue 29): bad input a user meets first is refused
as bad input -- one line, exit 2, nothing left behind -- before any capture;
commands print only their own lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from harness.testing import HF_AND_LLAMACPP

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


PROGRESS = re.compile(r"^\w+: \[ *\d+\.\ds\] ")  # harness/progress.py's phase lines off a terminal


def one_line_exit_2(p) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not PROGRESS.match(ln)]
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
    run = CaseRun(Case(family="llama", ref=HF_AND_LLAMACPP, prompt="hello"), load_policy(None))
    with pytest.raises(UsageError):
        _ = run.tokens
    # refused before the GGUF export and before any capture
    assert "gguf_path" not in run.__dict__ and not any(k.startswith("capture") for k in run.timings)


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("case") / "case"
    p = cli("export-case", "--family", "llama", "--ref", "hf", "--out", str(d))
    assert p.returncode == 0, p.stderr
    (d.parent / "export-stderr.txt").write_text(p.stderr)
    return d


def test_export_case_prints_only_its_own_lines(case_dir):
    """Finding 9: export-case printed HF's "Writing model shards" tqdm bar to a non-tty stderr."""
    err = (case_dir.parent / "export-stderr.txt").read_text()
    assert err.strip() == "", err


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
    ok = cli("judge", str(dump), "--out", str(tmp_path / "ok"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
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


def test_bad_input_is_refused_before_the_heavy_imports():
    """Finding 4: a bad --set took 4-10 s to be refused (transformers' config classes,
    torch, pandas imported first). Now it is refused from the cached config schema;
    --help imports none of them either. (Times are scripts/bench_startup.py's; this
    holds the cause: what the refusal imports.)"""
    probe = ("import sys\nfrom harness.cli import main\ntry:\n    rc = main(sys.argv[1:])\n"
             "except SystemExit as e:\n    rc = e.code\n"
             "print('IMPORTED', rc, *[m for m in ('torch', 'transformers', 'pandas') if m in sys.modules])")
    cli("run", "--family", "llama", "--set", "hiden_size=1")  # the schema cached, as after any first run
    for args in (["run", "--family", "llama", "--set", "rope_parameters.rope_theta=-5"],
                 ["run", "--family", "llama", "--set", "hiden_size=64"],
                 ["run", "--family", "llama", "--set", "rope_parameters.rope_theta=abc"], ["--help"]):
        p = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("IMPORTED")][-1]
        assert line == f"IMPORTED {0 if args == ['--help'] else 2}", (args, line, p.stderr)


def test_matrix_k_selects_cases_as_pytest_does():
    """Finding 9: no way to run a subset of a matrix. -k takes pytest's grammar over case ids."""
    from harness.commands.matrix import keyword_matcher
    from harness.errors import UsageError

    ids = ["llama/numpy-cpu-float32/paged/mixed/all/s0/t16", "qwen2/torch-cpu-bfloat16/decode/prefill/hf/s0/t16",
           "qwen2/numpy-cpu-float64/decode/prefill/hf/s0/t16"]
    sel = lambda e: [i for i in ids if keyword_matcher(e)(i)]  # noqa: E731
    assert sel("qwen2") == ids[1:] and sel("QWEN2 and not bfloat16") == ids[2:]
    assert sel("(llama or float64) and not torch") == [ids[0], ids[2]] and sel("not qwen2") == ids[:1]
    for bad in ("", "qwen2 and", "(qwen2", "and llama", "llama qwen2"):
        with pytest.raises(UsageError):
            keyword_matcher(bad)
    # as pytest's -k, a bare name matches as a substring: "qwen2" also selects qwen2_moe's cases
    assert keyword_matcher("qwen2")("qwen2_moe/numpy-cpu-float64/decode/prefill/hf/s0/t16")
    p = cli("matrix", "fixtures/matrix/smoke.toml", "--list", "-k", "qwen2 and numpy-cpu-float64")
    assert p.returncode == 0 and p.stdout.split() == ["qwen2/numpy-cpu-float64/decode/prefill/hf/s0/t16",
                                                      "qwen2_moe/numpy-cpu-float64/decode/prefill/hf/s0/t16"], p.stdout
    p = cli("matrix", "fixtures/matrix/smoke.toml", "--list", "-k", "qwen2/ and numpy-cpu-float64")  # the family alone
    assert p.returncode == 0 and p.stdout.split() == ["qwen2/numpy-cpu-float64/decode/prefill/hf/s0/t16"], p.stdout
    assert "selects none of the" in one_line_exit_2(cli("matrix", "fixtures/matrix/smoke.toml", "-k", "zzz"))


def test_matrix_reports_worker_start_up_apart_and_ends_with_the_verdict(tmp_path):
    """Findings 3 and 4: each worker's first case reported ~17 s because the worker's
    start-up was counted in it; the matrix's last line is the verdict with counts."""
    import json

    out = tmp_path / "m"
    p = cli("matrix", "fixtures/matrix/smoke.toml", "-k", "qwen2/torch-cpu-float32/decode or qwen2/numpy-cpu-float64",
            "-j", "2", "--no-plots", "--out", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1].startswith("PASS: 2 of 2 cases pass"), p.stdout
    info = json.loads((out / "meta.json").read_text())["case_info"]
    ups = [i["worker_startup_s"] for i in info.values() if "worker_startup_s" in i]
    assert len(ups) >= 1 and all(u > 0 for u in ups), info
    assert "worker start-up" in p.stdout and "worker start-up" in p.stderr  # said apart, per case and in total
