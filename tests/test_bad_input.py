"""What a new user trips on (issue 16, "What a new user trips on", items 1-10).

Every bad input: exit status 2, exactly one line on stderr naming what was
wrong and what is valid, no traceback, nothing left behind (no --out
directory, no ./reports/). The rest of each item -- a whole number taken for a
float, the default matrix announced, third-party noise in the run's log, a
fast `list`, embedded plots, "missing" apart from regressions, a prompt
Ctrl-C -- is checked beside it. Tiny configs, no llama.cpp except where named.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main

ROOT = Path(__file__).resolve().parent.parent
BIG = "100000000"
MUTANT = "sink-dropped"  # 1e8 tokens: ~1e9 GiB of attention probabilities


def _spec(tmp_path, text, name="spec.toml") -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def _file(tmp_path) -> str:
    p = tmp_path / "a-file"
    p.write_text("x")
    return str(p)


def _nonempty(tmp_path) -> str:
    d = tmp_path / "full"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    return str(d)


# (item, argv builder given tmp_path, what the one line must say). OUT stands for a
# fresh --out directory that must not exist afterwards.
OUT = "<out>"
BAD = [
    # 1. a value HF's strict dataclasses refuse: the key, the value, what is valid
    (1, lambda t: ["run", "--family", "llama", "--set", "rms_norm_eps=abc", "--out", OUT],
     "config key 'rms_norm_eps' = 'abc': expected float"),
    (1, lambda t: ["run", "--family", "llama", "--set", "attention_bias=3", "--out", OUT],
     "config key 'attention_bias' = 3: expected bool"),
    (1, lambda t: ["matrix", _spec(t, 'families = ["gemma2"]\noverrides = [{ attn_logit_softcapping = "x" }]'),
                   "--out", OUT], "config key 'attn_logit_softcapping' = 'x': expected float or null"),
    # 2. --out that cannot be written, refused before any work; an existing run is not overwritten
    (2, lambda t: ["run", "--family", "llama", "--out", _file(t)], "is a file"),
    (2, lambda t: ["run", "--family", "llama", "--out", _file(t) + "/sub"], "cannot be made"),
    (2, lambda t: ["run", "--family", "llama", "--out", "/proc/conformance-x"], "is not writable"),
    (2, lambda t: ["run", "--family", "llama", "--out", _nonempty(t)], "is not empty; give another --out"),
    (2, lambda t: ["matrix", _spec(t, 'families = ["llama"]'), "--out", _file(t)], "is a file"),
    (2, lambda t: ["mla-cache", "--out", _file(t)], "is a file"),
    (2, lambda t: ["diff", str(t), str(t), "--md", str(t)], "--md"),
    # 3. dotted keys checked against the table; numbers must be finite numbers
    (3, lambda t: ["run", "--family", "llama", "--set", "rope_parameters.rope_thetaa=5000", "--out", OUT],
     "unknown key rope_parameters.rope_thetaa for rope_type 'default' of family llama; did you mean 'rope_theta'?"),
    (3, lambda t: ["run", "--family", "llama", "--set", "rope_parameters.factor=2", "--out", OUT],
     "unknown key rope_parameters.factor for rope_type 'default'"),
    (3, lambda t: ["run", "--family", "llama", "--set", "rope_parameters.rope_type=yrn", "--out", OUT],
     "did you mean 'yarn'?"),
    (3, lambda t: ["run", "--family", "llama", "--set", "rope_parameters.rope_theta=abc", "--out", OUT],
     "config key 'rope_parameters.rope_theta' = 'abc': expected float"),
    (3, lambda t: ["run", "--family", "llama", "--set", "rope_parameters.rope_theta=nan", "--out", OUT],
     "expected a finite number"),
    (3, lambda t: ["run", "--family", "llama", "--set", "rms_norm_eps=inf", "--out", OUT], "expected a finite number"),
    (3, lambda t: ["run", "--family", "gemma3", "--set", "rope_parameters.full_attn={}", "--out", OUT],
     "unknown layer type rope_parameters.full_attn for family gemma3; did you mean 'full_attention'?"),
    (3, lambda t: ["run", "--family", "gemma3", "--set", 'rope_parameters.full_attention={"rope_thetaa": 5}',
                   "--out", OUT], "unknown key rope_parameters.full_attention.rope_thetaa"),
    (3, lambda t: ["run", "--family", "mpt", "--set", "attn_config.alibi_max=4", "--out", OUT],
     "unknown key attn_config.alibi_max for family mpt; did you mean 'alibi_bias_max'?"),
    (3, lambda t: ["matrix", _spec(t, 'families = ["llama"]\noverrides = [{ "rope_parameters.rope_thetaa" = 1.0 }]'),
                   "--out", OUT], "unknown key rope_parameters.rope_thetaa"),
    # 4. ranges, before any work
    (4, lambda t: ["run", "--family", "llama", "--seed", "-1", "--out", OUT], "--seed must be a non-negative integer"),
    (4, lambda t: ["run", "--family", "llama", "--tokens", "300", "--out", OUT],
     "--tokens 300 is past family llama's max_position_embeddings=256; use at most 256"),
    (4, lambda t: ["run", "--family", "mpt", "--tokens", "65", "--out", OUT], "max_seq_len=64"),
    (4, lambda t: ["run", "--family", "llama", "--tokens", BIG, "--set", f"max_position_embeddings={BIG}",
                   "--out", OUT], "GB is available"),
    (4, lambda t: ["run", "--family", "bloom", "--tokens", BIG, "--out", OUT], "this case needs about"),
    (4, lambda t: ["matrix", _spec(t, 'families = ["llama"]\ntokens = [300]'), "--out", OUT],
     "--tokens 300 is past family llama's max_position_embeddings=256"),
    # 5. an empty spec is not "every family"
    (5, lambda t: ["matrix", _spec(t, ""), "--out", OUT], "has no [[group]] and no axes"),
    (5, lambda t: ["features", _spec(t, 'name = "x"\ndescription = "nothing"'), "--out", OUT], "no axes"),
    (5, lambda t: ["mutate", _spec(t, ""), "--out", OUT], "no axes"),
    # 7. one prefix, "did you mean" for a subcommand
    (7, lambda t: ["runn"], "unknown command 'runn'; did you mean 'run'?"),
    (7, lambda t: ["run", "--tokens", "x"], "argument --tokens: invalid int value: 'x' (see conformance run --help)"),
    (7, lambda t: ["run", "--family", "llama", "--variant", "wo_scal", "--out", OUT], "did you mean 'wo_scale'?"),
    # 10. mla-cache refuses before making its directory
    (10, lambda t: ["mla-cache", "--tokens", "0", "--out", OUT], "--tokens must be a positive integer"),
    # a recurrent setting impl or a reference cannot express: the field, what is valid
    (0, lambda t: ["run", "--family", "qwen3_next", "--set", "linear_conv_kernel_dim=0", "--out", OUT],
     "linear_conv_kernel_dim=0: the delta-net's causal conv needs a kernel of at least 1 row; valid: an integer >= 1"),
    (0, lambda t: ["run", "--family", "qwen3_5_text", "--set", "linear_num_key_heads=3", "--out", OUT],
     "linear_num_key_heads=3 does not divide linear_num_value_heads=4; valid: a divisor of 4 (1, 2, 4)"),
    (0, lambda t: ["run", "--family", "qwen3_next", "--ref", "all", "--set", "linear_key_head_dim=8", "--out", OUT],
     "linear_key_head_dim=8 != linear_value_head_dim=16: llama.cpp's delta net asserts equal widths"),
    (0, lambda t: ["run", "--family", "lfm2", "--set", "conv_L_cache=0", "--out", OUT],
     "conv_L_cache=0: the short conv needs a kernel of at least 1 row; valid: an integer >= 1"),
    (0, lambda t: ["run", "--family", "lfm2", "--ref", "llamacpp", "--set", "conv_L_cache=1", "--out", OUT],
     "conv_L_cache=1: llama.cpp's short conv asserts a kernel of at least 2 rows"),
    (0, lambda t: ["run", "--family", "lfm2", "--ref", "hf,bogus", "--out", OUT], "unknown reference 'bogus'"),
    (0, lambda t: ["run", "--family", "mistral4", "--ref", "hf", "--set", "rope_parameters.rope_type=default",
                   "--out", OUT], "valid rope_type: yarn"),
]


@pytest.mark.parametrize("item,argv,message", BAD, ids=[f"{i}-{n}" for n, (i, _, _) in enumerate(BAD)])
def test_bad_input_is_one_line_exit_2_nothing_left(item, argv, message, tmp_path, monkeypatch, capsys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # the default report directory is ./reports: must not appear either
    out = tmp_path / "out"
    args = [str(out) if a == OUT else a for a in argv(tmp_path)]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    rc = main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("conformance: error: ") and lines[0].count("conformance:") == 1, lines[0]
    assert message in lines[0], lines[0]
    assert not out.exists()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing left behind


def test_bad_input_from_the_shell_has_no_traceback(tmp_path):
    # what was a 57-line traceback (huggingface_hub's strict-dataclass validation)
    p = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--family", "gemma2", "--set", "attention_bias=3"],
                       capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- 1. whole numbers for floats
def test_a_whole_number_for_a_float_field_is_that_float(tmp_path, capsys):
    """--set, a matrix spec (and so the pytest plugin, which collects through
    the same load_spec: tests/test_matrix.py runs one such item)."""
    from harness import families

    cfg = families.get("gemma2").make_config({"attn_logit_softcapping": 30, "rms_norm_eps": 1})
    assert cfg.attn_logit_softcapping == 30.0 and isinstance(cfg.attn_logit_softcapping, float)
    assert isinstance(cfg.rms_norm_eps, float)
    cfg = families.get("llama").make_config({"rope_parameters.rope_theta": 5000})
    assert cfg.rope_parameters["rope_theta"] == 5000.0
    # the same from a matrix spec
    s = _spec(tmp_path, 'families = ["gemma2"]\noverrides = [{ attn_logit_softcapping = 30, rms_norm_eps = 1 }]')
    assert main(["matrix", s, "--list"]) == 0
    assert "attn_logit_softcapping=30" in capsys.readouterr().out


# ---------------------------------------------------------------- 5. the default matrix is said
@pytest.mark.parametrize("command", ["features", "mutate"])
def test_no_spec_says_it_runs_the_default_matrix(command, tmp_path, monkeypatch, capsys):
    from harness.commands import matrix as mcmd
    from harness.commands import mutate

    monkeypatch.setattr(mcmd, "run_dir", lambda d, jobs, plots: (0, pd.DataFrame(columns=["status"])))
    monkeypatch.setattr(mutate, "run_mutation", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    main([command, "--out", str(tmp_path / "r"), *(["--mutants", MUTANT] if command == "mutate" else [])])
    err = capsys.readouterr().err
    assert re.search(rf"conformance {command}: no SPEC given: the default matrix fixtures/matrix/default.toml "
                     r"\([1-9][0-9]* cases\)", err), err


# ---------------------------------------------------------------- 6. third-party noise
def test_default_configs_raise_no_transformers_warnings():
    from harness import families

    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(f"{record.name}: {record.getMessage()}")

    from transformers.utils import logging as hf_logging

    # warning_once is lru-cached per process: without this the outcome depends on which
    # test ran first in the worker
    hf_logging.warning_once.cache_clear()
    # HF's advice for Phi-3's own config shape (modeling_rope_utils.py
    # _validate_longrope_parameters: no rope_parameters["factor"] beside
    # original_max_position_embeddings). Real Phi-3 checkpoints have that shape, and
    # following the advice would CHANGE the model under `--set max_position_embeddings=...`
    # (HF then uses the stale factor, the converter the ratio: conversion/phi.py); it
    # reaches the run log only (harness/runlog.py)
    # MiniCPM3's released config has the same LongRoPE shape (conversion/minicpm.py reads it so)
    expected = {f: "rope_parameters['original_max_position_embeddings']" for f in ("phi3", "minicpm3")}
    lg = logging.getLogger("transformers")
    h = Catch(level=logging.WARNING)
    lg.addHandler(h)
    unexpected = []
    try:
        for name, fam in families.registry().items():
            seen.clear()
            fam.make_config({})
            unexpected += [f"{name}: {m}" for m in seen if not (name in expected and expected[name] in m)]
    finally:
        lg.removeHandler(h)
    assert not unexpected, unexpected  # e.g. "bos_token_id ... got 50256" from HF's own default Starcoder2Config


def test_third_party_lines_go_to_the_log_and_to_stderr_only_with_v(tmp_path, capsys):
    """In a subprocess: the routing is process-wide."""
    code = textwrap.dedent("""
        import sys, warnings, numpy as np
        from harness import runlog
        runlog.setup(sys.argv[2] == "-v")
        runlog.attach(sys.argv[1])
        from transformers.utils import logging as hf_logging
        hf_logging.get_logger("transformers.integrations.hub_kernels").warning("kernel falls back")
        np.exp(np.array([1e308])) * 10  # overflow: a numpy RuntimeWarning
        print("tool line", file=sys.stderr)
    """)
    for flag in ("", "-v"):
        log = tmp_path / f"log{flag}.txt"
        p = subprocess.run([sys.executable, "-c", code, str(log), flag], capture_output=True, text=True,
                           cwd=ROOT, timeout=120)
        assert p.returncode == 0, p.stderr
        text = log.read_text()
        assert "kernel falls back" in text and "RuntimeWarning" in text
        if flag:
            assert "kernel falls back" in p.stderr and "RuntimeWarning" in p.stderr
        else:
            assert p.stderr.strip() == "tool line"


def test_a_run_prints_only_its_own_lines(tmp_path):
    # starcoder2: HF's default config class used to warn "got 50256" twice on every run
    out = tmp_path / "r"
    p = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--family", "starcoder2", "--out", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=300)
    assert p.returncode == 0, p.stderr
    # not a terminal: no progress display, only the phases as they begin (harness/progress.py
    # Phases), nothing from the references; nothing but the tool's own report on stdout
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert err and all(re.match(r"run: \[ *\d+\.\ds\] [a-z]", ln) for ln in err), p.stderr
    assert p.stdout.splitlines()[-1].startswith("PASS: 1 of 1 case pass"), p.stdout


# ---------------------------------------------------------------- 7. discovery
def test_list_shows_variants_features_and_gguf_without_importing_torch(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, "-m", "harness.cli", "list"], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    out = first.stdout
    llama = out.split("\n  llama ")[1].split("\n  llama4 ")[0]
    assert "variants: plain, wo_scale" in llama and "features (plain): gqa, rope_neox" in llama
    assert "--gguf: reads llama files" in llama
    # --gguf reads every family the harness has (issue 12): each entry says which arch
    from harness.families import registry

    assert out.count("--gguf: reads ") == len(registry()) and "--gguf: no (" not in out
    # once derived, the features are read back: no torch, no transformers, well under a second of work
    code = ("import sys; from harness.cli import main; rc = main(['list']); assert rc == 0; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout == out


def test_help_gives_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    seed, tokens = (text.split(opt)[2].split(" --")[0] for opt in ("--seed SEED", "--tokens TOKENS"))
    assert seed.endswith("(default 0)") and "(default 16;" in tokens


# ---------------------------------------------------------------- 8. report.html
def _rows(**kw):
    r = dict(case_id="llama/a", family="llama", features="gqa;kv_decode", candidate="impl", reference="hf",
             layer=0, probe="q", status="pass", reason="", nmse=1e-14, max_abs=1e-7, err_ratio=1e-3, tol_nmse=1e-10)
    r.update(kw)
    return r


def test_report_html_embeds_its_plots_and_lists_families_as_rows(tmp_path):
    from harness import views

    df = pd.DataFrame([_rows(), _rows(case_id="qwen2/b", family="qwen2", features="qkv_bias;kv_decode")])
    views.plot_case(df[df["case_id"] == "llama/a"], tmp_path / "plots" / views.plot_name("llama/a"))
    views.write_all(tmp_path, df, {"spec": {"name": "t"}})
    page = (tmp_path / "report.html").read_text()
    assert "plots/" not in page and '"llama/a":"data:image/png;base64,iVBORw0KGgo' in page
    # the families x features table (after the candidates table, which has families as columns)
    heat = page.split("<h2>Families × features</h2>")[1].split("<table class='heat'>")[1].split("</table>")[0]
    assert "<tr><th>llama</th>" in heat and "<tr><th>qwen2</th>" in heat  # a row per family
    assert "<span>qkv_bias</span>" in heat  # a (narrow) column per feature


def test_plot_keeps_its_y_axis_label_inside(tmp_path):
    from harness import views

    df = pd.DataFrame([_rows(probe=p) for p in ("q", "k", "v")])
    fig = views._draw(df, tmp_path / "p.png")
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    assert ax.yaxis.label.get_window_extent(renderer).x0 >= 0
    assert min(t.get_window_extent(renderer).x0 for t in ax.get_yticklabels() if t.get_text()) >= 0


# ---------------------------------------------------------------- 9. diff: missing is not a regression
def test_diff_lists_missing_apart_from_regressions(tmp_path, capsys):
    from harness import report

    base, new = tmp_path / "base", tmp_path / "new"
    report.write_rows(base, [_rows(), _rows(case_id="qwen2/b", family="qwen2")])
    report.write_rows(new, [_rows()])
    assert main(["diff", str(base), str(new)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Conformance diff: no regression (1 cases of base missing")
    assert "- missing (in base, not run in new; not a regression): 1" in out and "`qwen2/b`" in out
    assert main(["diff", "--fail-missing", str(base), str(new)]) == 1
    capsys.readouterr()
    report.write_rows(new, [_rows(status="fail", nmse=1.0)])
    assert main(["diff", str(base), str(new)]) == 1
    assert capsys.readouterr().out.startswith("# Conformance diff: REGRESSION")


# ---------------------------------------------------------------- 10. Ctrl-C, where reports go
def test_interrupted_matrix_says_one_line_and_what_is_kept(tmp_path, monkeypatch, capsys):
    from harness import matrix

    def interrupted(d, jobs, on_start, on_done, plots):
        raise KeyboardInterrupt

    monkeypatch.setattr(matrix, "complete", interrupted)
    s = _spec(tmp_path, 'families = ["llama"]\nvariants = "default"')
    assert main(["matrix", s, "--out", str(tmp_path / "r"), "-j1"]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"conformance: interrupted; no case had finished; conformance matrix --resume "
                     f"{tmp_path / 'r'} completes the run"]


SLEEPY = """
import sys, time
from pathlib import Path
from harness import matrix
from harness.case import Case

def sleepy(case_dict, policy_path, plot_dir):
    Path(sys.argv[1], f"started-{case_dict['seed']}").write_text("")
    time.sleep(600)

if __name__ == "__main__":
    matrix.execute([Case(family="llama", seed=s) for s in (0, 1)], 2, None, None, lambda c: None,
                   lambda c, r: None, task=sleepy)
"""


def test_sigint_to_the_parent_stops_the_workers_promptly(tmp_path):
    script = tmp_path / "sleepy.py"
    script.write_text(SLEEPY)
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 240
        while len(list(tmp_path.glob("started-*"))) < 2:
            assert time.time() < deadline and p.poll() is None, "the workers never started"
            time.sleep(0.2)
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        workers = [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]
        assert len(workers) == 2, kids
        t = time.time()
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)  # before: every worker slept its 600 s out
        took = time.time() - t
    finally:
        p.kill()
    assert took < 20, took
    assert not [w for w in workers if Path(f"/proc/{w}").exists() and "zombie" not in
                Path(f"/proc/{w}/status").read_text().lower()], workers


def test_default_report_directory_is_under_the_current_directory(tmp_path, monkeypatch):
    from harness import report

    monkeypatch.chdir(tmp_path)
    assert report.run_dir(None, "x") == tmp_path / "reports" / "x"
    assert report.check_out(None, "x") == tmp_path / "reports" / "x" and not (tmp_path / "reports").exists()
