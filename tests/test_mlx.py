"""The third reference, mlx-lm (harness/references/mlx/, issue 38): a pass is a
check that can fail, a family it does not implement is said so, and where it
disagrees with HF the disagreement is its own, with the line that makes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.testing import run, statuses

ROOT = Path(__file__).resolve().parent.parent


def _mlx(rows):
    return {(layer, probe): s for (ref, layer, probe), s in statuses(rows).items() if ref == "mlx"}


def test_mlx_judges_impl_beside_hf(policy, need_mlx):
    """qwen3 decoded in chunks: impl against mlx-lm's own model, run through its own KV
    cache, probe by probe -- every exposed probe a pass, and the ones that matter there."""
    rows = run(policy, family="qwen3", ref="hf,mlx", kv="decode")
    st = _mlx(rows)
    assert st and all(s in ("pass", "not-exposed") for s in st.values()), st
    passed = {p for (_, p), s in st.items() if s == "pass"}
    assert {"attn_in", "q_rope", "k_rope", "attn_heads", "attn_out", "resid_mid"} <= passed, passed
    assert all(s == "pass" for (ref, _, _), s in statuses(rows).items() if ref == "hf")


def test_a_planted_position_bug_in_mlx_fails(policy, need_mlx, tmp_path, monkeypatch):
    """The same case with mlx's RoPE off by one position (every call's offset + 1):
    impl against mlx fails, first at the rotated query."""
    import mlx.nn as nn

    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path / "cache"))  # no clean capture reused
    orig = nn.RoPE.__call__
    monkeypatch.setattr(nn.RoPE, "__call__", lambda self, x, offset=0: orig(self, x, offset=offset + 1))
    rows = run(policy, family="llama", ref="hf,mlx", kv="decode")
    st = _mlx(rows)
    assert st[(0, "q_rope")] == "fail" and st[(0, "attn_in")] == "pass", st
    assert all(s == "pass" for (ref, _, _), s in statuses(rows).items() if ref == "hf")


def test_a_family_mlx_lacks_is_not_implemented(policy, need_mlx):
    """arcee: mlx-lm has no module for it. Named alone it is refused in one line
    (exit 2); named beside HF the case runs HF and records mlx as not-implemented."""
    p = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--family", "arcee", "--ref", "mlx", "-q"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "implements no model type 'arcee'" in lines[0], p.stderr
    rows = run(policy, family="arcee", ref="hf,mlx")
    mine = [r for r in rows if r["reference"] == "mlx"]
    assert [r["status"] for r in mine] == ["not-implemented"] and "arcee" in mine[0]["reason"]
    assert {s for (ref, _, _), s in statuses(rows).items() if ref == "hf"} == {"pass"}


def test_not_in_all_until_judged():
    """``--ref all`` stays HF, HF's cached path and llama.cpp: mlx runs where it is named."""
    from harness.case import Case

    assert "mlx" not in Case(family="llama", ref="all").refs
    assert Case(family="llama", ref="hf,mlx").refs == ["hf", "mlx"]


@pytest.mark.parametrize("family,probe,why", [
    # mlx_lm/models/glm.py builds nn.RoPE(head_dim) over the whole head; HF's GlmConfig rotates
    # partial_rotary_factor (0.5) of it (transformers models/glm/modeling_glm.py apply_rotary_pos_emb)
    ("glm", "q_rope", "partial rotary factor ignored"),
    # mlx_lm/models/phi3.py (SuScaledRoPE) takes long_factor whenever max_position_embeddings >
    # original_max_position_embeddings; HF's dynamic longrope init (transformers
    # modeling_rope_utils.py _compute_longrope_parameters / dynamic_rope_update) takes short_factor
    # for a sequence within original_max_position_embeddings
    ("phi3", "q_rope", "longrope's long factor at a short length"),
])
def test_mlx_disagrees_with_hf_where_its_source_does(policy, need_mlx, family, probe, why):
    """Two families where mlx-lm 0.32.2 computes something else than HF and impl (the
    lines in each parameter's comment): impl passes against HF and fails against mlx --
    first where the source says. What a third witness is for."""
    overrides = (("sliding_window", 8),) if family == "gemma2" else ()
    rows = run(policy, family=family, ref="hf,mlx", overrides=overrides)
    assert all(s == "pass" for (ref, _, _), s in statuses(rows).items() if ref == "hf"), why
    st = _mlx(rows)
    bad = sorted((layer, p) for (layer, p), s in st.items() if s == "fail")
    assert bad and probe in {p for _, p in bad}, (why, st)


def test_the_hub_keys_mlx_reads_are_the_configs_own():
    """transformers 5's rope_parameters and layer_types written as the hub's checkpoints
    hold them (rope_theta, rope_scaling, sliding_window_pattern, GPT-NeoX's names)."""
    from harness.references.mlx.checkpoint import bridged

    c = bridged({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4,
                                     "partial_rotary_factor": 0.25},
                 "layer_types": ["sliding_attention", "full_attention"] * 2,
                 "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4})
    assert c["rope_theta"] == 1e4 and c["rope_scaling"]["type"] == "linear" and c["rope_scaling"]["factor"] == 2.0
    assert c["sliding_window_pattern"] == 2 and c["num_layers"] == 4 and c["head_dim"] == 16
    assert c["rotary_emb_base"] == 1e4 and c["rotary_pct"] == 0.25
    per_type = bridged({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})
    assert per_type["rope_theta"] == 1e6 and per_type["rope_local_base_freq"] == 1e4
    assert per_type["rope_scaling"] is None
