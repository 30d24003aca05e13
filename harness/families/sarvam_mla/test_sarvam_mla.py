"""sarvam_mla: DeepSeek V3 with direct Q -- the converter omits q_lora_rank and
llama.cpp requires it except at a "lite" depth (both sides of that switch), and
its files read back as deepseek_v3's."""

from __future__ import annotations

import pytest

from harness.families import get


def _file(gguf_export, direct_q_rank_key: bool, layers: int):
    fam = type(get("sarvam_mla"))()
    fam.direct_q_rank_key = direct_q_rank_key
    config = fam.make_config({"num_hidden_layers": layers})
    return gguf_export.export(fam, fam.build_model(config, 0), config, "f32", 0, "absorbed")


@pytest.mark.usefixtures("need_llamacpp")
@pytest.mark.parametrize("layers,loads", [(3, False), (26, True)])
def test_without_q_lora_rank_only_a_lite_depth_loads(gguf_export, layers, loads):
    """What the converter writes (no attention.q_lora_rank for direct Q):
    deepseek2.cpp load_arch_hparams requires the key unless n_layer is 26 / 27."""
    from harness.references.llamacpp import capture as llamacpp

    path = _file(gguf_export, False, layers)
    if loads:
        assert llamacpp.run_worker(path, [[(1, 0, 0)]], 1, {"l_out"})
    else:
        with pytest.raises(RuntimeError, match="could not load|exit status"):
            llamacpp.run_worker(path, [[(1, 0, 0)]], 1, {"l_out"})


def test_files_read_back_as_deepseek_v3_unless_named(gguf_export, gguf_import):
    path = str(_file(gguf_export, True, 3))
    assert gguf_import.load(path).family.name == "deepseek_v3"
    src = gguf_import.load(path, "sarvam_mla")
    assert src.family.name == "sarvam_mla" and src.config.q_lora_rank is None
