"""mistral3: Mistral 3's text decoder on llama.cpp's mistral3 graph -- the
file is arch mistral3 with the llama permutation, a window is the same finding
as mistral's, and a file with attention temperature tuning (Ministral 3's) is
refused by the reverse."""

from __future__ import annotations

import pytest

from harness.families import get
from harness.testing import HF_AND_LLAMACPP, all_statuses, assert_llamacpp_fails_first_at_q, llamacpp_statuses

pytestmark = pytest.mark.usefixtures("need_llamacpp")


def test_the_file_is_mistral3s(case_run, gguf_export, policy):
    import gguf


    cr = case_run(policy, "mistral3")
    path = gguf_export.export(cr.family, cr.base_model, cr.config, "f32", 0, None)
    r = gguf.GGUFReader(str(path))
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "mistral3"


def test_window_is_a_finding_against_llamacpp(run, policy):
    lc = llamacpp_statuses(run(policy, family="mistral3", ref=HF_AND_LLAMACPP, kv="paged", overrides=(("sliding_window", 5),)))
    assert lc[(0, "q_rope")] == "pass" and lc[(0, "attn_probs")] == "finding"


def test_without_the_permutation_llamacpp_differs_at_q(run, policy, monkeypatch):
    monkeypatch.setattr(get("mistral3"), "_permute_qk", False)
    assert_llamacpp_fails_first_at_q(all_statuses(run(policy, family="mistral3", ref=HF_AND_LLAMACPP)))


def test_a_temperature_file_is_refused(case_run, gguf_export, gguf_import, policy, monkeypatch):
    """mistral3.cpp reads attention.temperature_scale (Ministral 3's tuning); HF's
    Mistral has none, so the reverse refuses such a file in one line."""
    from harness.errors import UsageError

    cr = case_run(policy, "mistral3")
    fam = get("mistral3")
    orig = type(fam).gguf_params

    def with_temperature(w, config, variant=None):
        orig(fam, w, config, variant)
        w.add_attn_temperature_scale(0.1)

    monkeypatch.setattr(fam, "gguf_params", with_temperature)
    path = gguf_export.export(fam, cr.base_model, cr.config, "f32", 0, None)
    with pytest.raises(UsageError, match="temperature"):
        gguf_import.load(str(path), "mistral3")
