"""youtu: DeepSeek V3's MLA over a dense FFN, three-way in every KV backing and with
YaRN; the export writes the converter's dense-everywhere file (leading_dense_block_count
= n_layer); mlx-lm runs it as its youtu_llm."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.testing import HF_AND_LLAMACPP, all_statuses, bad_rows

FAMILY = "youtu"
YARN = (("rope_parameters.rope_type", "yarn"), ("rope_parameters.factor", 4.0),
        ("rope_parameters.original_max_position_embeddings", 128), ("rope_parameters.mscale", 1.0),
        ("rope_parameters.mscale_all_dim", 1.0), ("rope_parameters.beta_fast", 32.0),
        ("rope_parameters.beta_slow", 1.0))


@pytest.mark.parametrize("kv", ["decode", "batched", "paged"])
def test_three_way_in_every_backing(run, policy, need_llamacpp, kv):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv=kv)
    assert not bad_rows(rows)
    st = all_statuses(rows)
    for ref in ("hf", "llamacpp"):  # the MLA probes, on both layers, against each reference
        for layer in (0, 1):
            for probe in ("q_latent", "kv_latent", "q_pe", "k_pe", "attn_probs", "attn_out"):
                assert st[("impl", ref, layer, probe)] == "pass", (ref, layer, probe)
    # the dense FFN llama.cpp builds on every layer is HF's YoutuMLP
    assert st[("llamacpp", "hf", 1, "layer_out")] == "pass"


def test_yarn_with_one_magnitude_is_three_way(run, policy, need_llamacpp):
    rows = run(policy, family=FAMILY, ref=HF_AND_LLAMACPP, kv="decode", overrides=YARN)
    assert not bad_rows(rows)
    assert all_statuses(rows)[("impl", "llamacpp", 1, "q_pe")] == "pass"


def test_the_export_writes_every_layer_dense(gguf_export, tmp_path):
    """conversion/deepseek.py: no n_routed_experts -> leading_dense_block_count = n_layer,
    expert_feed_forward_length = intermediate_size, expert_shared_count 0, no expert_count."""
    from gguf import GGUFReader


    fam = get(FAMILY)
    config = fam.make_config({})
    path = gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, fam.variants[0])
    r = GGUFReader(str(path))

    def val(key):
        f = r.fields.get(f"deepseek2.{key}")
        return None if f is None else int(f.parts[-1][0])

    assert val("leading_dense_block_count") == config.num_hidden_layers
    assert val("expert_feed_forward_length") == config.intermediate_size
    assert val("expert_shared_count") == 0 and val("expert_count") is None


def test_mlx_runs_it_as_youtu_llm(run, policy):
    rows = run(policy, family=FAMILY, ref="hf,mlx", kv="decode")
    assert not bad_rows(rows)
    st = all_statuses(rows)
    assert st[("impl", "mlx", 1, "attn_out")] == "pass" and st[("mlx", "hf", 1, "layer_out")] == "pass"


def test_mlx_scales_no_yarn_mscale(run, policy):
    """With YaRN mlx-lm's youtu_llm keeps the softmax at q_head_dim**-0.5 (no mscale^2):
    its rotation agrees, its softmax does not -- the finding, from L0's attention on; impl
    passes against HF (findings.toml)."""
    rows = run(policy, family=FAMILY, ref="hf,mlx", kv="decode", overrides=YARN)
    st = all_statuses(rows)
    assert st[("impl", "hf", 0, "attn_out")] == "pass"
    assert st[("impl", "mlx", 0, "q_latent")] == "pass"  # before the softmax: the same
    assert st[("impl", "mlx", 0, "attn_out")] == "finding"
    row = next(r for r in rows if (r["candidate"], r["reference"], r["layer"], r["probe"]) == ("mlx", "hf", 0, "attn_out"))
    assert row["status"] == "finding" and "youtu_llm" in row["reason"] and row["nmse"] > 1e-3

