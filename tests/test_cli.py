"""The command line: exit statuses, one-line errors, no partial reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, tmp_path=None):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


BAD = [
    (["run", "--family", "lama"], "unknown family 'lama'; did you mean 'llama'?"),
    (["run", "--family", "llama", "--backend", "jax"], "unknown backend 'jax'; valid: numpy, torch"),
    (["run", "--family", "llama", "--dtype", "float8"], "unknown dtype 'float8'"),
    (["run", "--family", "llama", "--kv", "pagd"], "unknown kv mode 'pagd'"),
    (["run", "--family", "llama", "--ref", "vllm"], "unknown reference 'vllm'"),
    (["run", "--family", "llama", "--set", "hidden_size"], "malformed --set 'hidden_size': expected KEY=VALUE"),
    (["run", "--family", "llama", "--set", "hiden_size=64"], "unknown config key 'hiden_size'"),
    (["run", "--family", "llama", "--set", "num_attention_heads=6"], "num_attention_heads=6 does not divide hidden_size=64"),
    (["run", "--family", "llama", "--set", "num_key_value_heads=3"], "num_key_value_heads=3 does not divide"),
    (["run", "--family", "llama", "--set", "num_hidden_layers=0"], "num_hidden_layers must be a positive integer"),
    (["run", "--family", "llama", "--tokens", "0"], "--tokens must be a positive integer"),
    (["run", "--family", "llama", "--tokens", "x"], "invalid int value"),
    (["run", "--family", "llama", "--schedule", "3,1"], "must be positive chunk sizes summing to 16"),
    (["run", "--family", "llama", "--backend", "numpy", "--dtype", "bfloat16"], "backend numpy has no bfloat16"),
    (["run", "--family", "llama", "--kv", "decode", "--seqs", "2"], "kv mode decode holds one sequence"),
    (["run", "--family", "llama", "--hf-model", "/nonexistent"], "is not a directory"),
    (["run", "--family", "llama", "--policy", "/nonexistent.toml"], "does not exist"),
    (["run"], "--family is required"),
    # a typed HF config field refusing a value (transformers 5 strict dataclasses; found by conformance fuzz)
    (["run", "--family", "glm_moe_dsa", "--set", "q_lora_rank=null"], "config key 'q_lora_rank' = None: expected int"),
    (["run", "--family", "llama", "--kv", "paged", "--kv-evict"], "--kv-evict applies to the contiguous KV"),
    (["run", "--family", "deepseek_v3", "--set", "rope_interleave=false", "--ref", "llamacpp"], "interleaved pairs"),
    *([(["run", "--family", "llama", "--backend", "torch", "--device", "cuda"],
        "device 'cuda' is not available on this machine")] if not __import__("torch").cuda.is_available() else []),
    (["frobnicate"], "unknown command 'frobnicate'"),
    # issue 29, finding 5: settings every side turns into NaN are bad input, never the candidate's failure
    (["run", "--family", "llama", "--set", "rope_parameters.rope_theta=-5"],
     "config key 'rope_parameters.rope_theta' = -5: must be a positive number (RoPE's base"),
    (["run", "--family", "llama", "--set", "rms_norm_eps=0"], "config key 'rms_norm_eps' = 0: must be a positive"),
    (["run", "--family", "gemma2", "--set", "attn_logit_softcapping=0"],
     "config key 'attn_logit_softcapping' = 0: must be a positive number (a softcap"),
    (["run", "--family", "gemma3", "--set", "query_pre_attn_scalar=-1"], "'query_pre_attn_scalar' = -1: must be"),
    (["run", "--family", "llama", "--set", "rope_parameters.partial_rotary_factor=0"],
     "'rope_parameters.partial_rotary_factor' = 0: must be in (0, 1]"),
    (["run", "--family", "llama", "--set", "rope_parameters.rope_type=linear", "--set", "rope_parameters.factor=0"],
     "config key 'rope_parameters.factor' = 0: must be a positive number"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_no_report(args, message, tmp_path, capsys):
    from harness.cli import main

    out = tmp_path / "run"
    rc = main([*args, *(["--out", str(out)] if args and args[0] == "run" else [])])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert message in lines[0]
    assert not out.exists()


def test_bad_input_from_the_shell_has_no_traceback(tmp_path):
    out = tmp_path / "run"
    p = cli("run", "--family", "llama", "--set", "num_key_value_heads=3", "--out", str(out))
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_run_passes_and_writes_a_report(tmp_path):
    out = tmp_path / "run"
    p = cli("run", "--family", "qwen3", "--kv", "paged", "--set", "num_key_value_heads=1", "--out", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "attn_probs" in p.stdout and "totals: pass" in p.stdout
    # finding 8 of issue 29: one case is a page too (summary.md, report.html with its plot)
    for f in ("rows.parquet", "rows.csv", "meta.json", "summary.md", "report.html", "junit.xml"):
        assert (out / f).exists(), f
    page = (out / "report.html").read_text()
    assert "Conformance run" in page and "<span class='verdict PASS'>PASS</span>" in page
    assert "data:image/png;base64," in page  # the case's plot, embedded
    import json

    meta = json.loads((out / "meta.json").read_text())
    assert {"python", "numpy", "torch", "transformers", "llama_cpp_python", "gguf", "git_commit"} <= set(meta["versions"])


def test_list():
    p = cli("list")
    assert p.returncode == 0
    for word in ("llama", "qwen2", "qwen3", "attn_probs", "paged", "torch"):
        assert word in p.stdout


def test_run_says_pass_last_and_shows_progress_only_on_a_terminal(tmp_path):
    """Issue 29, finding 3: a passing `run` printed 81 lines and never PASS or FAIL, had
    no -q, and nothing moved while it worked. Now: the verdict line last; -q leaves only
    it; on a terminal the phases show on stderr, off one nothing does."""
    import os
    import pty

    p = cli("run", "--family", "llama", "-q", "--out", str(tmp_path / "q"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["PASS: 1 of 1 case pass (cases: pass 1; rows: pass 22)"], p.stdout
    assert p.stderr.strip() == ""
    # the same case on a terminal: stderr a pty, the phases drawn there
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm", "COLUMNS": "120"}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "--family", "llama", "--out",
                             str(tmp_path / "tty")], stdout=subprocess.PIPE, stderr=slave, text=True, env=env,
                            cwd=tmp_path)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    out, _ = proc.communicate(timeout=300)
    os.close(master)
    assert proc.returncode == 0
    assert b"capturing hf" in seen and b"judging impl vs hf" in seen, seen[-500:]
    assert out.splitlines()[-1].startswith("PASS: ") and "report.html" in out
