"""The family hook spec (harness/families/hookspec.py, issue 37): it declares every hook
the shared machinery implements, with the implementations' parameters, and a family
class that defines a name no hook has is refused when it is defined."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from harness import families
from harness.families import hookspec
from harness.families._gguf_export import NegExpALog, NormPlusOne
from harness.families._mamba2 import Mamba2Mixer
from harness.families._mla import MlaFamily
from harness.families._recurrent import RecurrentProbes
from harness.families.base import Family, LlamaLike

BASES = (Family, LlamaLike, MlaFamily, RecurrentProbes, Mamba2Mixer, NormPlusOne, NegExpALog)


def _public(cls) -> dict:
    """The public members ``cls`` and its shared bases define (not object's)."""
    out = {}
    for c in reversed(cls.__mro__):
        if c is object or not c.__module__.startswith(hookspec.SHARED):
            continue
        out.update({k: v for k, v in c.__dict__.items() if not k.startswith("_")})
    return out


def test_every_public_member_of_the_shared_machinery_is_a_declared_hook():
    members = {}
    for cls in BASES:
        members.update(_public(cls))
    assert set(members) == set(hookspec.HOOKS), (
        f"undeclared: {sorted(set(members) - set(hookspec.HOOKS))}; "
        f"declared but implemented nowhere: {sorted(set(hookspec.HOOKS) - set(members))}")


def _params(fn) -> tuple:
    fn = inspect.unwrap(fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn)
    return tuple((p.name, p.kind.name, repr(p.default)) for p in inspect.signature(fn).parameters.values()
                 if p.name != "self")


# every class of the shared machinery: the bases and the mixins Family is assembled from
SHARED_CLASSES = tuple(dict.fromkeys(c for b in BASES for c in b.__mro__
                                     if c is not object and c.__module__.startswith(hookspec.SHARED)))


@pytest.mark.parametrize("cls", SHARED_CLASSES, ids=lambda c: c.__name__)
def test_each_implementation_takes_the_declared_parameters(cls):
    assert not _mismatches(cls)


def test_every_family_defines_only_declared_hooks_with_their_parameters():
    # the refusal ran when each class was defined; this says so for the whole registry, and
    # holds each override to the hook's declared parameters
    bad = {}
    for fam in families.registry().values():
        for cls in type(fam).__mro__:
            if cls is object or cls.__module__.startswith(hookspec.SHARED):
                continue
            extra = [k for k in cls.__dict__ if not k.startswith("_") and k not in hookspec.HOOKS]
            assert not extra, (fam.name, cls.__name__, extra)
            bad.update(_mismatches(cls))
    assert not bad, bad


def _mismatches(cls) -> dict:
    """``{Class.hook: why}`` for each hook ``cls`` defines against its declaration."""
    bad = {}
    for name, value in cls.__dict__.items():
        h = hookspec.HOOKS.get(name)
        if h is None or name.startswith("_"):
            continue
        method = callable(value) and not isinstance(value, type) or isinstance(value, (staticmethod, classmethod))
        if (h.kind == "method") != method:
            bad[f"{cls.__name__}.{name}"] = f"declared as {h.kind}"
            continue
        if h.kind == "method":
            got = _params(value)
            # the declared parameters, in order; an implementation may add defaulted ones after them
            extra_ok = all(default != repr(inspect.Parameter.empty) for _, _, default in got[len(h.params):])
            if got[:len(h.params)] != h.params or not extra_ok:
                bad[f"{cls.__name__}.{name}"] = f"takes {got}, not the spec's {h.signature}"
    return bad


@pytest.mark.parametrize("typo, nearest", [("lc_point", "lc_points"), ("hf_taps_", "hf_taps"),
                                           ("gguf_param", "gguf_params")])
def test_a_misspelt_hook_is_refused_naming_the_nearest(typo, nearest):
    with pytest.raises(hookspec.UnknownHook) as e:
        type("Typo", (LlamaLike,), {"__module__": "my_plugin.families", typo: {}})
    msg = str(e.value)
    assert "\n" not in msg and repr(typo) in msg and f"did you mean {nearest!r}" in msg
    # a family's own helper, underscored, and a declared hook are both fine
    type("Fine", (LlamaLike,), {"__module__": "my_plugin.families", "_" + typo: {}, nearest: {}})


def test_a_plugin_family_with_a_misspelt_hook_is_one_line_exit_2(tmp_path):
    pkg = tmp_path / "typo_family"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from harness.families.base import LlamaLike\n"
        "class Typo(LlamaLike):\n"
        "    name = 'typo'\n    hf_model_type = 'llama'\n    lc_point = {}\n"
        "FAMILY = Typo()\n")
    dist = tmp_path / "typo_family-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: typo-family\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[attn_conformance.families]\ntypo = typo_family:FAMILY\n")
    p = subprocess.run([sys.executable, "-m", "harness", "list"], capture_output=True, text=True,
                       env={"PYTHONPATH": f"{tmp_path}:{hookspec.__file__.rsplit('/harness/', 1)[0]}",
                            "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "'lc_point'" in err and "did you mean 'lc_points'" in err, err


def test_explain_lists_the_hooks_from_the_spec():
    from harness.commands import explain

    text = explain.explain(families.get("qwen3"), {}, None)
    resolved = [line.split("`")[1] for line in text.split("## Hooks, resolved")[1].split("\n## ")[0].splitlines()
                if line.startswith("| ") and "`" in line]
    order = list(hookspec.HOOKS)
    assert resolved == sorted(resolved, key=order.index)  # the spec's order
    # what qwen3 and LlamaLike answer; Family's own defaults (build_model, gguf_params) are not repeated
    assert {"name", "tiny", "qk_norm", "hf_points", "layer_config", "gguf_arch", "fuzz_space"} <= set(resolved)
    assert not {"build_model", "gguf_params", "hf_taps"} & set(resolved)


def test_families_take_the_contract_s_types_from_the_contract_not_through_impl():
    """impl is the implementation under test: a family reads the layer descriptions'
    types from ``contract``, and from impl only impl's own functions (its RoPE tables,
    lightning's slope rule), each an import a reader can see at the top of the module."""
    import ast
    import importlib
    from pathlib import Path

    import contract.errors
    import contract.layers
    import contract.recurrent

    types = {id(v) for m in (contract.layers, contract.recurrent, contract.errors) for v in vars(m).values()
             if isinstance(v, type) and v.__module__.startswith("contract")}
    bad = []
    for f in sorted(Path(families.__file__).parent.rglob("*.py")):
        if f.name.startswith("test_"):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "impl" and not node.level:
                mod = importlib.import_module(node.module)
                bad += [f"{f.name}:{node.lineno} {a.name}" for a in node.names if id(getattr(mod, a.name)) in types]
    assert not bad, bad


def test_the_how_to_s_llama_shaped_family_is_five_declarations_and_passes(tmp_path):
    """docs/how-to/add-a-family.md's shortest family, taken from the page as a user copies
    it, installed as another package's entry point: at most 6 declared items, refused
    nowhere, and its case passes against HF and llama.cpp (every impl row a check)."""
    import os
    import re
    from pathlib import Path

    import pandas as pd

    root = Path(hookspec.__file__).resolve().parents[2]
    page = (root / "docs" / "how-to" / "add-a-family.md").read_text()
    code = re.search(r"<!-- family-example:[^>]*-->\n```python\n(.*?)```", page, re.S).group(1)
    ns: dict = {}
    exec(compile(code, "add-a-family.md", "exec"), ns)
    fam = ns["FAMILY"]
    declared = [k for k in type(fam).__dict__ if not k.startswith("_")]
    assert len(declared) <= 6, declared
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "my_family.py").write_text(code)
    dist = tmp_path / "my_pkg-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pkg\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[attn_conformance.families]\nmy-family = my_pkg.my_family:FAMILY\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}",
           "CONFORMANCE_CACHE": os.environ.get("CONFORMANCE_CACHE", str(tmp_path / "cache"))}
    p = subprocess.run([sys.executable, "-m", "harness", "run", "--family", "my_llama", "--ref", "hf,llamacpp",
                        "--out", str(tmp_path / "r")], capture_output=True, text=True, env=env, cwd=root, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = pd.read_parquet(tmp_path / "r" / "rows.parquet")
    assert set(rows["status"]) <= {"pass", "not-exposed", "finding"}, rows["status"].value_counts()
    impl = rows[rows["candidate"] == "impl"]
    # two layers, each probe of the attention half, against each reference
    assert set(impl["reference"]) == {"hf", "llamacpp"} and (impl["status"] == "pass").sum() >= 40
