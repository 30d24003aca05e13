"""scripts/device_check.sh's parts, at toy sizes: the bench's agreement check can
fail, the preflight says what is missing and skips nothing silently, and bad
input is one line, exit 2, nothing left behind. (The whole script runs in CI as
``DEVICE=cpu bash scripts/device_check.sh``.)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import impl.attention as attention_mod

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--tokens", "24",
        "--decode", "3", "--repeat", "1"]
pytestmark = pytest.mark.device


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_times_every_kv_mode_and_checks_agreement(tmp_path, capsys):
    bench = _script("bench_device")
    assert bench.main(TINY + ["--out", str(tmp_path)]) == 0
    got = json.loads((tmp_path / "bench.json").read_text())
    assert [r["kv_mode"] for r in got["results"]] == ["decode", "batched", "paged"]
    for r in got["results"]:
        assert r["nmse_prefill"] < 1e-10 and r["nmse_decode"] < 1e-10  # float32: the same computation
        assert r["impl_total_s"] > 0 and r["sdpa_total_s"] > 0
    out = capsys.readouterr().out
    assert "impl/SDPA" in out and "goal <= 1.5x" in out


def test_bench_refuses_to_time_a_different_computation(tmp_path, monkeypatch, capsys):
    bench = _script("bench_device")
    real = attention_mod.attend
    monkeypatch.setattr(attention_mod, "attend", lambda *a, scale, **k: real(*a, scale=scale * 1.05, **k))
    assert bench.main(TINY + ["--kv-modes", "paged"]) == 1
    assert "disagree" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [(["--kv-modes", "pagd"], "unknown kv mode"), (["--dtype", "float8"], "unknown dtype"),
                                      (["--heads", "3"], "not a multiple")])
def test_bench_bad_input_is_one_line(argv, msg, capsys):
    bench = _script("bench_device")
    with pytest.raises(SystemExit) as e:
        bench.main(TINY + argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1


def _preflight(tmp_path, *args):
    return _script("device_preflight").main(["--spec", str(tmp_path / "m.toml"), "--env", str(tmp_path / "env.json"),
                                              *args])


def test_preflight_writes_the_smoke_torch_cases_on_the_device(tmp_path, capsys):
    from harness.matrix import load_spec

    assert _preflight(tmp_path, "--device", "cpu") == 0
    spec = load_spec(tmp_path / "m.toml")
    env = json.loads((tmp_path / "env.json").read_text())
    assert {(c.backend, c.device, c.kv) for c in spec.cases} == {("torch", "cpu", "decode")}
    assert {c.dtype for c in spec.cases} == {"float32", "float16", "bfloat16"}
    from harness.references.llamacpp.capture import available

    assert {c.ref for c in spec.cases} == set(env["references"]) == ({"hf", "llamacpp"} if available() else {"hf"})
    assert {c.family for c in spec.cases} == set(env["families"])
    assert {c.variant for c in spec.cases if c.family == "deepseek_v2"} == {"absorbed", "naive"}  # every variant
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("preflight: python") and "torch" in line and "on cpu" in line


def test_preflight_skips_llamacpp_with_a_reason_where_it_is_missing(tmp_path, monkeypatch, capsys):
    pre = _script("device_preflight")
    real = pre.probe_modules

    def without_llamacpp():
        found, missing = real()
        found.pop("llama_cpp", None)
        return found, {**missing, "llama_cpp": pre.OPTIONAL["llama_cpp"]}

    monkeypatch.setattr(pre, "probe_modules", without_llamacpp)
    assert pre.main(["--device", "cpu", "--families", "llama", "--spec", str(tmp_path / "m.toml"),
                     "--env", str(tmp_path / "env.json")]) == 0
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["references"] == ["hf"]
    assert env["skipped"] == [{"what": "reference llamacpp",
                               "reason": "llama-cpp-python / gguf not importable here: llama_cpp"}]
    out = capsys.readouterr().out
    assert "missing: llama_cpp (the llama.cpp reference is skipped)" in out.splitlines()[0]
    assert "skipped reference llamacpp" in out


def test_preflight_skips_a_family_its_transformers_lacks(tmp_path, monkeypatch):
    from transformers.models.auto import configuration_auto

    monkeypatch.delitem(configuration_auto.CONFIG_MAPPING_NAMES, "gpt_oss")
    assert _preflight(tmp_path, "--device", "cpu", "--families", "llama,gpt_oss") == 0
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["families"] == ["llama"]
    assert env["skipped"][-1]["what"] == "family gpt_oss" and "no model type 'gpt_oss'" in env["skipped"][-1]["reason"]


@pytest.mark.parametrize("args,msg", [(["--device", "tpu"], "unknown DEVICE 'tpu'; valid: cuda, mps, cpu"),
                                      (["--device", "cpu", "--families", "lama"], "unknown family lama")])
def test_preflight_bad_input(tmp_path, capsys, args, msg):
    with pytest.raises(SystemExit) as e:
        _preflight(tmp_path, *args)
    assert e.value.code == 2 and msg in capsys.readouterr().err
    assert not (tmp_path / "env.json").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal where no cuda device is")
def test_device_check_bad_input_leaves_nothing(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, DEVICE="cuda", OUT=str(tmp_path / "out"), DEVICE_WHEELS="0")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("device_check: error: DEVICE=cuda but torch")
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh")], capture_output=True, text=True,
                       env=dict(env, DEVICE="cpu", OUT=str(tmp_path / "full")), timeout=60)
    assert r.returncode == 2 and "is not empty" in r.stderr
