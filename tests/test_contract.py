"""The contract and the plug-in points (docs/explanation/architecture.md): the
boundaries import-linter holds, impl's probe names against the contract's, and a
reference and a family installed from outside the harness by entry point."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint(cwd: Path, env=None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    # --no-cache: a cache left by an older tree once reported a broken contract as kept
    return subprocess.run([str(exe), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(cwd), **(env or {})})


def test_import_linter_keeps_every_contract():
    p = _lint(ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "BROKEN" not in p.stdout and p.stdout.count("KEPT") >= 6
    # nothing is let through: a family folder's test takes what runs a case as fixtures
    # (harness/pytest_fixtures.py) instead of importing above the families
    assert "ignored" not in p.stdout, p.stdout[-3000:]


def test_the_contracts_ignore_no_import_and_see_every_folder():
    """No contract carries ``ignore_imports``, and every folder of Python modules under
    contract/, impl/ and harness/ is a package (a folder without ``__init__.py`` is a
    namespace package import-linter's graph skips: harness/gguf/ and harness/pipeline/
    once hid 2.6k lines and a cycle)."""
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert [c["name"] for c in conf if c.get("ignore_imports")] == []
    assert any(c["type"] == "layers" and c["layers"] == ["harness.pipeline", "harness.families", "harness.gguf"]
               for c in conf)
    hidden = sorted(str(d.relative_to(ROOT)) for pkg in ("contract", "impl", "harness")
                    for d in [ROOT / pkg, *(ROOT / pkg).rglob("*")]
                    if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
                    and not (d / "__init__.py").exists())
    assert hidden == []


@pytest.mark.parametrize("where,line,contract", [
    ("contract/probes.py", "import impl.trace  # planted\n", "The contract imports nothing else of the project"),
    ("impl/kv.py", "import harness.cache  # planted\n", "impl (the implementation under test) never imports the harness"),
    ("harness/references/hf/capture.py", "import harness.families.base  # planted\n",
     "References never import impl or the families"),
    ("harness/kinds/__init__.py", "import harness.families  # planted\n", "No import cycle between the harness's"),
    # the file-format floor reaching a family, and a family's own test importing the pipeline
    ("harness/gguf/meta.py", "import harness.families.base  # planted\n", "pipeline > families > gguf"),
    ("harness/families/llama/test_llama.py", "import harness.pipeline.gguf.export  # planted\n",
     "pipeline > families > gguf"),
])
def test_a_planted_forbidden_import_fails_the_lint(tmp_path, where, line, contract):
    """The same lint on a copy of the tree with one forbidden import planted: it fails,
    naming the contract."""
    for pkg in ("contract", "impl", "harness"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    f = tmp_path / where
    text = f.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    f.write_text(head + sep + line + rest if sep else line + text)
    p = _lint(tmp_path)
    assert p.returncode != 0, p.stdout[-2000:]
    assert "BROKEN" in p.stdout and contract in p.stdout.replace("\n", " "), p.stdout[-3000:]


def test_impl_trace_names_are_the_contracts():
    """impl keeps its own trace names; they are the contract's, in the same dataflow order."""
    from contract.probes import LAYER_PROBES, MODEL_PROBES, PROBES
    from impl.trace import LAYER_PROBES as IMPL_LAYER
    from impl.trace import MODEL_PROBES as IMPL_MODEL

    assert set(IMPL_LAYER) <= set(LAYER_PROBES) and set(IMPL_MODEL) <= set(MODEL_PROBES)
    assert [p for p in LAYER_PROBES if p in IMPL_LAYER] == list(IMPL_LAYER)
    assert all(PROBES[p].shape.startswith("[S,") for p in PROBES)


def test_impl_recurrent_probe_names_are_the_contracts():
    """impl's recurrent body documents its probes and states by the contract's names, in its
    dataflow order, and every recurrent description expects only those of its kind."""
    from contract.probes import LAYER_PROBES, PROBES, STATE_PROBES
    from contract.recurrent import RECURRENT_KINDS
    from impl.recurrent import RECURRENT_PROBES, RECURRENT_STATES

    assert set(RECURRENT_PROBES) <= set(LAYER_PROBES) and set(RECURRENT_STATES) == set(STATE_PROBES)
    body = [p for p in RECURRENT_PROBES if p not in ("layer_in", "resid_mid")]
    assert [p for p in LAYER_PROBES if p in body] == body
    for name in STATE_PROBES:
        assert PROBES[name].axes[1] == "call"
    for kind in RECURRENT_KINDS:
        for p in RECURRENT_PROBES:
            if p.startswith("rec_"):
                assert (kind in PROBES[p].kinds) == (p in _probes_of(kind)), (kind, p)


def _probes_of(kind):
    """The probes a small valid description of ``kind`` expects."""
    from contract.recurrent import RecurrentConfig

    heads = dict(n_k_heads=1, n_v_heads=1, k_dim=2, v_dim=2)
    fields = {"short_conv": {}, "mamba1": dict(heads, n_v_heads=4, v_dim=1, dt_rank=1),
              "lightning": dict(heads, decay_slopes=(0.5,)), "mamba2": dict(heads, out_norm_groups=1)}
    return RecurrentConfig.of(kind, hidden_size=8, **fields.get(kind, heads)).expected_probes()


def test_probe_shapes_tell_an_outside_engine_every_layer_probe():
    """PROBE_SHAPES is generated from the vocabulary: MLA's probes and layer_out are there."""
    from contract.candidate import PROBE_SHAPES
    from contract.probes import LAYER_PROBES

    assert set(PROBE_SHAPES) == set(LAYER_PROBES) - {"layer_in"}
    assert {"q_latent", "kv_latent", "q_pe", "k_pe", "q_absorbed", "layer_out"} <= set(PROBE_SHAPES)


def test_every_description_says_which_probes_it_must_emit():
    from contract.layers import guard_probe
    from harness import families, kinds

    seen = set()
    for fam in families.registry().values():
        config = fam.make_config({})
        for lc in fam.layer_configs(config, fam.variants[0] if fam.variants else None):
            probes = lc.expected_probes()
            seen.add(lc.label)
            if kinds.implemented(lc):
                assert kinds.of(lc) is not None, lc
                assert guard_probe(lc) in probes
            else:
                assert probes == () and guard_probe(lc) is None
    assert {"attention", "mla_absorbed", "gated_delta_net", "kimi_delta", "short_conv"} <= seen


def test_the_references_are_plugins_and_their_differences_attributes():
    """What was `if ref == "hf"` is an attribute of the reference."""
    from harness import references

    hf, lc, cached = references.get("hf"), references.get("llamacpp"), references.get("hf_cached")
    assert references.names() == ("hf", "hf_cached", "llamacpp", "mlx")
    # mlx (the third implementation) joined --ref all once every family it implements was judged
    assert references.all_names() == ("hf", "hf_cached", "llamacpp", "mlx") and references.get("mlx").in_all
    mlx = references.get("mlx")
    assert not mlx.oracle and mlx.model_of is None and mlx.cached and not mlx.file_weights
    assert hf.oracle and hf.sees_modules and hf.graph_dtype is None and not hf.file_weights
    # HF's cached path: HF's model on the case's schedule, its own oracle, HF's findings hold for it
    assert cached.oracle and cached.cached and not hf.cached and cached.model_of == "hf" and hf.model_of is None
    assert lc.file_weights and lc.default_for_file and lc.graph_dtype == "float32" and not lc.oracle
    assert references.default() == "hf" and references.default(file=True) == "llamacpp"
    assert references.oracle_reference() is hf


@pytest.fixture(scope="module")
def plugin_installed(tmp_path_factory):
    """tests/plugin_pkg installed as a user's package would be -- into a scratch
    target, never into the project's venv."""
    target = tmp_path_factory.mktemp("plugin-site")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(ROOT / "tests" / "plugin_pkg")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return target


def _cli(*args, target, cache) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)]), "CONFORMANCE_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)


def test_a_third_reference_and_a_family_from_outside_are_one_entry_point_each(plugin_installed, tmp_path):
    """A package that is not this project adds a reference and a family: `list` names both,
    `--ref hf-twin` judges impl against it, `--ref all` runs all three references (each
    with the others), and the family's findings.toml beside its module is read."""
    cache = os.environ.get("CONFORMANCE_CACHE", str(tmp_path / "cache"))
    ls = _cli("list", "--no-features", target=plugin_installed, cache=cache)
    assert ls.returncode == 0, ls.stderr[-2000:]
    assert "llama_twin" in ls.stdout and "hf-twin" in ls.stdout
    r = _cli("run", "--family", "llama_twin", "--ref", "hf-twin", "--tokens", "6", "--out", str(tmp_path / "r1"),
             target=plugin_installed, cache=cache)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "r1" / "rows.parquet")
    assert set(rows["reference"]) == {"hf-twin", "-"} or set(rows["reference"]) == {"hf-twin"}
    assert (rows["status"] == "pass").sum() > 10
    r = _cli("run", "--family", "llama_twin", "--ref", "all", "--tokens", "6", "--out", str(tmp_path / "r2"),
             target=plugin_installed, cache=cache)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rows = pd.read_parquet(tmp_path / "r2" / "rows.parquet")
    pairs = set(zip(rows["candidate"], rows["reference"]))
    assert {("impl", "hf"), ("impl", "hf-twin"), ("impl", "llamacpp")} <= pairs
    assert {("llamacpp", "hf"), ("hf-twin", "hf")} <= pairs  # each later reference against the first
    ex = _cli("explain", "llama_twin", target=plugin_installed, cache=cache)
    assert ex.returncode == 0 and "a demonstration finding of the plug-in family" in ex.stdout, ex.stderr[-2000:]


def _modules() -> list[str]:
    out = []
    for pkg in ("contract", "impl", "harness"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            if p.name.startswith("test_") or p.name == "__main__.py":
                continue
            parts = p.relative_to(ROOT).with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_imports_sit_at_the_top_but_fifteen_each_with_its_reason():
    """Imports at a module's top (heavy third-party ones as harness/lazy.py bindings);
    at most 60 inside functions (issue 37), each with its reason in a comment on its line or
    on the line of the import before it in the same group."""
    import ast

    inside, silent = [], []
    for mod in _modules():
        path = ROOT / (mod.replace(".", "/") + ("/__init__.py" if (ROOT / mod.replace(".", "/")).is_dir() else ".py"))
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        seen = set()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for st in ast.walk(fn):
                if isinstance(st, (ast.Import, ast.ImportFrom)) and st.lineno not in seen:
                    seen.add(st.lineno)
                    inside.append(f"{mod}:{st.lineno}")
                    here, before = lines[st.lineno - 1], lines[st.lineno - 2].strip()
                    if "#" not in here and not (before.startswith(("import ", "from ")) and "#" in before):
                        silent.append(f"{mod}:{st.lineno}: {here.strip()}")
    assert len(inside) <= 60, inside
    assert silent == [], silent


def test_every_module_imports_alone_in_a_fresh_process():
    """No import-time cycle: each module of contract/, impl/ and harness/ is importable as
    the first thing a process does (a hoisted import that closed a cycle fails here)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(mod):
        p = subprocess.run([sys.executable, "-c", f"import {mod}"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
        return mod, p.returncode, p.stderr.strip().splitlines()[-1:]

    with ThreadPoolExecutor(4) as ex:
        bad = [(m, err) for m, rc, err in ex.map(one, _modules()) if rc]
    assert bad == []
