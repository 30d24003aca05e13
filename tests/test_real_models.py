"""Real-model inputs: a local HF checkpoint (``--hf-model DIR``) and a user's GGUF
(``--gguf FILE``), each run through the same comparison as the tiny models.

The GGUFs under test are written by llama.cpp's OWN converter
(``convert_hf_to_gguf.py`` of the llama.cpp that llama-cpp-python vendors), not
by this project: the reverse mapping (harness/pipeline/gguf/reader.py) must read a
file it did not write. The converter comes from the llama-cpp-python sdist
(``pip download``; set CONFORMANCE_LLAMA_CPP_SRC to a llama.cpp tree to skip
the download), SentencePiece -- which the converter needs for the tiny
tokenizer -- from its wheel when it is not installed; both are unpacked once
under the session cache, and the conversions run once per session.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import bad_rows, run
from harness.testing import HF_AND_LLAMACPP

ROOT = Path(__file__).resolve().parent.parent
FOUNDATION = ["llama", "qwen2", "qwen3"]
CKPT_SEED = 5  # not the case seed: the checkpoint's weights are not the family's seeded ones


def save_checkpoint(dest: Path, family: str, seed: int = CKPT_SEED, overrides: dict | None = None):
    from harness import families

    fam = families.get(family)
    config = fam.make_config(overrides or {})
    model = fam.build_model(config, seed)
    model.save_pretrained(dest)  # safetensors (transformers' default)
    assert any(dest.glob("*.safetensors")) and not any(dest.glob("*.bin"))
    return model, config


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {f: (root / f, *save_checkpoint(root / f, f)) for f in FOUNDATION}


def cli(args, capsys):
    from harness.cli import main

    rc = main(args)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# ---------------------------------------------------------------- --hf-model

@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("family", FOUNDATION)
def test_hf_model_three_way(policy, checkpoints, family):
    from harness.case import Case, CaseRun
    from harness.checkpoint import family_of

    d, model, config = checkpoints[family]
    assert family_of(d) == family  # from config.json's model_type
    rows = run(policy, family=family, hf_model=str(d), ref=HF_AND_LLAMACPP)
    assert not bad_rows(rows, ok=("pass", "not-exposed"))
    pairs = {(r["candidate"], r["reference"]) for r in rows if r["status"] == "pass"}
    # --ref all also runs hf_cached, adding its pairs: the three pairs this test is about must be among the
    # passing ones (any failing pair, hf_cached's included, is caught by bad_rows above)
    assert {("impl", "hf"), ("impl", "llamacpp"), ("llamacpp", "hf")} <= pairs
    # the weights compared are the checkpoint's, not the family's seeded ones
    from harness import families

    fam = families.get(family)
    cr = CaseRun(Case(family=family, hf_model=str(d)), policy)
    seeded = fam.build_model(config, 0)
    for i in range(config.num_hidden_layers):
        got, want, other = (cr.weights_for("float32")[i], fam.layer_weights(model, config, i),
                            fam.layer_weights(seeded, config, i))
        assert got.keys() == want.keys()
        assert all(np.array_equal(got[k], want[k]) for k in got)
        assert not np.array_equal(got["wq"], other["wq"])


@pytest.mark.usefixtures("need_llamacpp")
def test_hf_model_rewritten_checkpoint_is_not_served_stale(policy, tmp_path):
    """One checkpoint directory saved over with other weights (same config, same
    path, same file sizes): the GGUF export and the captures key on the files'
    stamps, so the second run is not served the first one's GGUF (impl, fed the
    new weights, would fail against llama.cpp if it were)."""
    d = tmp_path / "ckpt"
    for seed in (11, 12):
        save_checkpoint(d, "llama", seed=seed)
        rows = run(policy, family="llama", hf_model=str(d), ref="llamacpp", kv="batched")
        assert not bad_rows(rows, ok=("pass", "not-exposed")) and any(r["status"] == "pass" for r in rows)


def test_hf_model_set_non_shape_field(policy, checkpoints):
    """--set with --hf-model changes a field that shapes no weight: applied."""
    from harness.case import Case, CaseRun

    d = checkpoints["qwen2"][0]
    case = Case(family="qwen2", hf_model=str(d), overrides=(("rope_parameters.rope_theta", 5000.0),))
    cr = CaseRun(case, policy)
    assert cr.config.rope_parameters["rope_theta"] == 5000.0
    assert cr.layer_cfgs[0].rope.theta == 5000.0
    rows = run(policy, family="qwen2", hf_model=str(d), ref="hf", overrides=case.overrides)
    assert not bad_rows(rows, ok=("pass", "not-exposed")) and any(r["status"] == "pass" for r in rows)


def _bad_dirs(tmp: Path, checkpoints) -> list[tuple[list[str], str]]:
    empty = tmp / "empty"
    empty.mkdir()
    only_cfg = tmp / "only_cfg"
    only_cfg.mkdir()
    shutil.copy(checkpoints["llama"][0] / "config.json", only_cfg)
    pickled = tmp / "pickled"
    pickled.mkdir()
    shutil.copy(checkpoints["llama"][0] / "config.json", pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    bert = tmp / "bert"
    shutil.copytree(checkpoints["llama"][0], bert)
    cfg = json.loads((bert / "config.json").read_text())
    cfg["model_type"] = "bert"
    (bert / "config.json").write_text(json.dumps(cfg))
    garbled = tmp / "garbled"
    shutil.copytree(checkpoints["llama"][0], garbled)
    (garbled / "config.json").write_text("{not json")
    ok = str(checkpoints["llama"][0])
    return [
        (["--hf-model", str(tmp / "nope")], "is not a directory"),
        (["--hf-model", str(empty)], "no config.json"),
        (["--hf-model", str(only_cfg)], "no *.safetensors"),
        (["--hf-model", str(pickled)], "only pickle weights (pytorch_model.bin)"),
        (["--hf-model", str(bert)], "model_type 'bert' belongs to no family"),
        (["--hf-model", str(garbled)], "config.json is not readable JSON"),
        (["--hf-model", ok, "--family", "qwen2"], "holds model_type 'llama'; family qwen2 reads 'qwen2'"),
        (["--hf-model", ok, "--set", "num_attention_heads=2"], "changes the parameters of the --hf-model checkpoint"),
        (["--hf-model", ok, "--set", "attention_bias=true"], "changes the parameters of the --hf-model checkpoint"),
        (["--hf-model", ok, "--set", "hiden_size=3"], "unknown config key 'hiden_size'"),
    ]


def test_hf_model_bad_input_is_one_line_exit_2(checkpoints, tmp_path, capsys):
    for args, message in _bad_dirs(tmp_path, checkpoints):
        out = tmp_path / "report"
        rc, stdout, err = cli(["run", *args, "--out", str(out)], capsys)
        assert rc == 2, (args, err)
        assert message in err, (args, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert not out.exists()
    # the valid ones name every model_type a family reads
    rc, _, err = cli(["run", "--hf-model", str(tmp_path / "bert")], capsys)
    assert "llama" in err and "qwen2" in err and "qwen3" in err


# ---------------------------------------------------------------- llama.cpp's converter

def _llama_cpp_tree(tools: Path) -> Path:
    """convert_hf_to_gguf.py + conversion/ + gguf-py/ (and src/, which
    scripts/llamacpp_keys.py reads) of the llama.cpp that the installed
    llama-cpp-python vendors (its sdist, from PyPI, unpacked once)."""
    env = os.environ.get("CONFORMANCE_LLAMA_CPP_SRC")
    if env:
        return Path(env)
    version = importlib.metadata.version("llama_cpp_python")
    tree = tools / f"llama.cpp-{version}-src"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    dl = tools / f"download-{os.getpid()}"  # per process: parallel workers never share a half-written file
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
                    f"llama-cpp-python=={version}", "-d", str(dl)], check=True, timeout=900)
    sdist = next(dl.glob(f"llama_cpp_python-{version}.tar.gz"))
    tmp = tools / f"tmp-{os.getpid()}"
    wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "src/")
    with tarfile.open(sdist) as tf:
        members = []
        for m in tf.getmembers():
            _, sep, rest = m.name.partition("/vendor/llama.cpp/")
            if sep and rest.startswith(wanted):
                m.name = rest
                members.append(m)
        tf.extractall(tmp, members=members, filter="data")
    try:
        os.rename(tmp, tree)  # atomic; a parallel worker that won the race leaves its tree
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(dl, ignore_errors=True)
    return tree


def _sentencepiece_path(tools: Path) -> str | None:
    """Where the converter finds sentencepiece: installed, or its wheel unpacked."""
    try:
        import sentencepiece  # noqa: F401
        return None
    except ImportError:
        pass
    dest = tools / "sentencepiece"
    if not (dest / "sentencepiece").is_dir():
        dl = tools / f"download-{os.getpid()}"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
                        "sentencepiece>=0.2", "-d", str(dl)], check=True, timeout=600)
        wheel = sorted(dl.glob("sentencepiece-*.whl"))[-1]
        tmp = tools / f"tmp-sp-{os.getpid()}"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(dl, ignore_errors=True)
    return str(dest)


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """{(family, outtype): (gguf path, original HF model, its config)} written by
    llama.cpp's convert_hf_to_gguf.py, once per session."""
    from harness import cache

    tools = cache.cache_dir() / "tools"
    tools.mkdir(parents=True, exist_ok=True)
    tree = _llama_cpp_tree(tools)
    sp = _sentencepiece_path(tools)
    root = tmp_path_factory.mktemp("converted")
    out, jobs = {}, []
    for fam, outtypes in (("llama", ("f32", "q8_0")), ("qwen2", ("f32",)), ("qwen3", ("f32",))):
        d = root / fam
        model, config = save_checkpoint(d, fam)
        for t in outtypes:
            path = root / f"{fam}-{t}.gguf"
            out[(fam, t)] = (path, model, config)
            jobs.append([str(d), str(path), t])
    (root / "jobs.json").write_text(json.dumps(jobs))
    env = dict(os.environ)
    if sp:
        env["PYTHONPATH"] = sp + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "convert_with_llamacpp.py"), str(tree),
                           str(root / "jobs.json")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _assert_recovered(src, model, config, exact: bool):
    """The reverse mapping recovered the HF weights: the whole state dict (Q/K
    un-permuted, names mapped back), exactly for F32, within Q8_0's step
    (half a block's scale) for a quantized file."""
    import torch

    got = src.model.state_dict()
    want = {k: v.detach().to(torch.float64).numpy() for k, v in model.state_dict().items()}
    assert got.keys() == want.keys()
    quantized = 0
    for k, w in want.items():
        g = got[k].detach().to(torch.float64).numpy()
        if exact or w.ndim < 2:  # 1-D tensors stay F32 in every file type
            assert np.array_equal(g, w), k
            continue
        blocks = w.reshape(-1, 32)
        # gguf-py / ggml Q8_0: d = amax / 127, q = round(x / d), d stored as f16 -- so
        # |x - q * f16(d)| <= d / 2 + 127 * |d - f16(d)| <= d * (1/2 + 127 * 2**-11)
        d = np.abs(blocks).max(axis=1, keepdims=True) / 127
        err = np.abs(g.reshape(-1, 32) - blocks)
        assert (err <= d * (0.5 + 127 * 2.0**-11) + 1e-12).all(), k
        quantized += int((err > 0).any())
    assert exact or quantized > 0  # the file really held quantized weights
    # the config read back gives impl the same layers
    fam = src.family
    assert [repr(lc) for lc in fam.layer_configs(src.config)] == [repr(lc) for lc in fam.layer_configs(config)]


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("family", FOUNDATION)
def test_converter_gguf_reverse_mapping(converted, family):
    from harness.pipeline.gguf import reader as gguf_import

    path, model, config = converted[(family, "f32")]
    src = gguf_import.load(str(path))
    assert src.family.name == family and src.weight_type == "f32"
    _assert_recovered(src, model, config, exact=True)
    # impl's weights flow through the family's own layer_weights, from the recovered model
    for i in range(config.num_hidden_layers):
        want = src.family.layer_weights(model, config, i)
        assert src.layer_weights[i].keys() == want.keys()
        assert all(np.array_equal(src.layer_weights[i][k], want[k]) for k in want)


KV_CASES = [(f, kv) for f in ("llama", "qwen2") for kv in ("decode", "batched", "paged")] + [("qwen3", "decode")]


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("family,kv", KV_CASES)
def test_converter_gguf_impl_vs_llamacpp(policy, converted, family, kv):
    path = converted[(family, "f32")][0]
    rows = run(policy, family="", gguf=str(path), ref="llamacpp", kv=kv)
    assert not bad_rows(rows, ok=("pass", "not-exposed"))
    assert {r["family"] for r in rows} == {family}
    passed = {(r["layer"], r["probe"]) for r in rows if r["status"] == "pass"}
    n_layers = converted[(family, "f32")][2].num_hidden_layers
    for i in range(n_layers):
        assert {(i, p) for p in ("q", "k", "v", "q_rope", "k_rope", "attn_probs", "attn_heads")} <= passed


@pytest.mark.usefixtures("need_llamacpp")
def test_cli_gguf_runs_llamacpp_by_default(converted, tmp_path, capsys):
    """`conformance run --gguf FILE`: --ref defaults to llamacpp; exit 0 = all passed."""
    out = tmp_path / "report"
    rc, stdout, err = cli(["run", "--gguf", str(converted[("qwen3", "f32")][0]), "--out", str(out)], capsys)
    assert rc == 0, stdout + err
    assert "impl vs llamacpp" in stdout and "qwen3/" in stdout and (out / "meta.json").exists()


@pytest.mark.usefixtures("need_llamacpp")
def test_converter_gguf_q8_0(policy, converted):
    """The converter's own Q8_0: dequantized (gguf.quants) into impl's weights;
    impl, with ggml's activation quantization reproduced, judged at ggml_q8_0."""
    from harness.pipeline.gguf import reader as gguf_import

    path, model, config = converted[("llama", "q8_0")]
    src = gguf_import.load(str(path))
    assert src.weight_type == "q8_0"
    _assert_recovered(src, model, config, exact=False)
    rows = run(policy, family="", gguf=str(path), ref="llamacpp", kv="paged")
    assert not bad_rows(rows, ok=("pass", "not-exposed"))
    assert {r["cmp_dtype"] for r in rows if r.get("cmp_dtype")} == {"ggml_q8_0"}
    assert {r["gguf_type"] for r in rows} == {"q8_0"}


@pytest.mark.usefixtures("need_llamacpp")
def test_own_export_q8_0(policy):
    """A GGUF our own exporter wrote at Q8_0 (`--gguf-type q8_0`), read back."""
    from harness import families
    from harness.pipeline.gguf import export as gguf_export
    from harness.pipeline.gguf import reader as gguf_import

    fam = families.get("qwen3")
    config = fam.make_config({})
    model = fam.build_model(config, CKPT_SEED)
    path = gguf_export.export(fam, model, config, "q8_0", CKPT_SEED)
    src = gguf_import.load(str(path))
    assert src.weight_type == "q8_0" and {"q8_0", "f32"} <= set(src.tensor_types.values())
    _assert_recovered(src, model, config, exact=False)
    rows = run(policy, family="", gguf=str(path), ref="llamacpp", kv="batched")
    assert not bad_rows(rows, ok=("pass", "not-exposed")) and any(r["status"] == "pass" for r in rows)


ROUND_TRIPS = {
    "yarn": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                 "rope_theta": 10000.0}},
    "linear": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    "bias": {"attention_bias": True},  # q/k biases carry the converter's permutation too
}


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("setting", list(ROUND_TRIPS))
def test_own_export_round_trips(policy, setting):
    """Settings the metadata or the tensor set carries (RoPE scaling keys, bias
    tensors) come back into the rebuilt config: the same impl layers, the same
    weights, and impl agrees with llama.cpp on the file."""
    from harness import families
    from harness.pipeline.gguf import export as gguf_export
    from harness.pipeline.gguf import reader as gguf_import

    fam = families.get("llama")
    config = fam.make_config(ROUND_TRIPS[setting])
    model = fam.build_model(config, CKPT_SEED)
    path = gguf_export.export(fam, model, config, "f32", CKPT_SEED)
    src = gguf_import.load(str(path))
    _assert_recovered(src, model, config, exact=True)
    rows = run(policy, family="", gguf=str(path), ref="llamacpp")
    assert not bad_rows(rows, ok=("pass", "not-exposed")) and any(r["status"] == "pass" for r in rows)


# ---------------------------------------------------------------- --gguf refusals

def _write_gguf(path: Path, family: str, extra_kv=None, extra_tensor=None, arch=None, overrides=None):
    import gguf

    from harness import families

    fam = families.get(family)
    config = fam.make_config(overrides or {})
    model = fam.build_model(config, 0)
    w = gguf.GGUFWriter(str(path), arch or fam.gguf_arch)
    fam.gguf_params(w, config)
    if extra_kv:
        extra_kv(w)
    for name, data in fam.gguf_tensors(model, config):
        w.add_tensor(name, np.asarray(data, dtype=np.float32))
    if extra_tensor:
        w.add_tensor(extra_tensor, np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_refusals_are_one_line_exit_2(tmp_path, capsys):
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_text("hello")
    cases = [
        (_write_gguf(tmp_path / "bert.gguf", "llama", arch="bert"), [], "unknown GGUF architecture 'bert'; valid:"),
        (not_gguf, [], "not a readable GGUF file"),
        # a key llama.cpp reads for llama, with a value nothing here can express
        (_write_gguf(tmp_path / "causal.gguf", "llama", extra_kv=lambda w: w.add_causal_attention(False)), [],
         "llama.attention.causal = False: non-causal attention is not expressible"),
        (_write_gguf(tmp_path / "extra.gguf", "llama", extra_tensor="blk.0.attn_sinks.weight"), [],
         "tensors with no counterpart in family llama's HF model: blk.0.attn_sinks.weight"),
        (_write_gguf(tmp_path / "ok.gguf", "llama"), ["--family", "qwen2"], "the file's architecture is 'llama'"),
        (tmp_path / "ok.gguf", ["--set", "rms_norm_eps=1e-3"], "--set does not apply to --gguf"),
        (tmp_path / "ok.gguf", ["--gguf-type", "q8_0"], "--gguf-type does not apply to --gguf"),
        (tmp_path / "ok.gguf", ["--variant", "wo_scale"], "--variant does not apply to --gguf"),
    ]
    for path, args, message in cases:
        out = tmp_path / "report"
        rc, _, err = cli(["run", "--gguf", str(path), "--ref", "llamacpp", *args, "--out", str(out)], capsys)
        assert rc == 2, (path, err)
        assert message in err, (path, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert not out.exists()
    rc, _, err = cli(["run", "--gguf", str(tmp_path / "bert.gguf"), "--ref", "llamacpp"], capsys)
    assert all(a in err for a in ("llama", "qwen2", "qwen3"))


def test_every_family_with_an_arch_reads_its_files():
    """--gguf reads every family with a llama.cpp arch (the reverse is the export
    traced backwards, one body for all); a family with no arch is refused."""
    from harness import families
    from harness.families.base import LlamaLike

    assert all(f.gguf_import_unsupported() is None for f in families.registry().values() if f.gguf_arch)
    assert len([f for f in families.registry().values() if f.gguf_arch]) == len(families.registry())
    assert "no GGUF export" in LlamaLike().gguf_import_unsupported()


# ------------------------------------------- checkpoints shaped as real ones are
def _real_shaped_checkpoints(root: Path):
    """Checkpoints made by transformers' own classes the way hub models are
    stored: a multimodal Gemma 3 (Gemma3ForConditionalGeneration: text config
    nested under ``text_config``, the text model's tensors under
    ``language_model.``, a vision tower beside it) in four shards with an index,
    at HF's own initialisation; and a llama with tied embeddings (no lm_head
    tensor) stored in bfloat16 across shards."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from harness import families

    text = families.get("gemma3").make_config({})
    cfg = Gemma3Config(text_config=text.to_dict(), mm_tokens_per_image=4,
                       vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, image_size=28, patch_size=14))
    torch.manual_seed(CKPT_SEED)
    Gemma3ForConditionalGeneration(cfg).save_pretrained(root / "gemma3-mm", max_shard_size="200KB")
    fam = families.get("llama")
    lcfg = fam.make_config({"tie_word_embeddings": True})
    fam.build_model(lcfg, CKPT_SEED).to(torch.bfloat16).save_pretrained(root / "llama-bf16-tied", max_shard_size="20KB")
    return {"gemma3": root / "gemma3-mm", "llama": root / "llama-bf16-tied"}


@pytest.mark.usefixtures("need_llamacpp")
def test_hf_model_real_shaped_checkpoints_three_way(policy, tmp_path):
    """Sharded with an index, bfloat16, multimodal with a nested text_config, tied
    embeddings: each is read as it is and passes three-way; the family comes
    from the text config, the bf16 values reach impl exactly."""
    import json as _json

    from harness.case import Case, CaseRun
    from harness.checkpoint import family_of

    dirs = _real_shaped_checkpoints(tmp_path)
    for family, d in dirs.items():
        assert (d / "model.safetensors.index.json").is_file() and len(list(d.glob("*.safetensors"))) > 1
        assert family_of(d) == family
        rows = run(policy, family=family, hf_model=str(d), ref=HF_AND_LLAMACPP)
        assert not bad_rows(rows, ok=("pass", "finding", "not-exposed")), bad_rows(rows, ok=("pass", "finding", "not-exposed"))
        assert {(r["candidate"], r["reference"]) for r in rows if r["status"] == "pass"} >= {("impl", "hf"), ("impl", "llamacpp")}
    assert "text_config" in _json.loads((dirs["gemma3"] / "config.json").read_text())
    index = _json.loads((dirs["llama"] / "model.safetensors.index.json").read_text())["weight_map"]
    assert "lm_head.weight" not in index  # tied: one matrix in the file
    w = CaseRun(Case(family="llama", hf_model=str(dirs["llama"])), policy).weights_for("float32")[0]["wq"]
    import torch
    assert np.array_equal(w, torch.from_numpy(w).to(torch.bfloat16).float().numpy())  # bf16 values, exactly
