"""Config key coverage (harness/coverage.py, `conformance coverage`; issue 39): the key
table is read from transformers' sources, what varies each key from the matrix specs and
the fuzz spaces, and the keys left uncovered are a list that may only shrink."""

from __future__ import annotations

import pytest

from harness import coverage, families
from harness.commands.coverage import open_keys, tables
from harness.cli import main


@pytest.fixture(scope="module")
def every_table():
    return tables(list(families.registry()))


def test_the_uncovered_keys_are_the_listed_ones(every_table):
    """Every family: a key nothing varies and nothing reasons is in fixtures/coverage_open.json,
    and nothing listed there has been covered since."""
    assert coverage.open_drift(every_table, open_keys()) == []


def test_a_key_a_family_gains_fails_until_varied_or_reasoned(every_table, monkeypatch):
    """A field transformers adds to a config class (planted: llama's `attn_new_scale`, read by
    its modeling file) is uncovered and unlisted: the drift names it; varied by a case it is not."""
    tabs = {"llama": dict(every_table["llama"])}
    tabs["llama"]["attn_new_scale"] = coverage.Key("attn_new_scale", ["modeling_llama.py"], 1.0)
    drift = coverage.open_drift(tabs, open_keys())
    assert len(drift) == 1 and drift[0].startswith("llama: attn_new_scale is varied by no case"), drift
    tabs["llama"]["attn_new_scale"].varied["fuzz"] = {"2.0"}
    assert coverage.open_drift(tabs, open_keys()) == []


def test_the_table_is_read_from_transformers_and_the_cases(every_table):
    """qwen3: its window keys are read by the configuration file (layer_types derived from
    them) and varied by the default matrix; its heads by the fuzz; dropout reasoned (eval
    mode); a field neither file reads is reasoned by that."""
    t = every_table["qwen3"]
    assert "configuration_qwen3.py" in t["max_window_layers"].read_by
    assert t["use_sliding_window"].status == "varied" and "default" in t["use_sliding_window"].varied
    assert "fuzz" in t["num_key_value_heads"].varied
    assert t["attention_dropout"].status == "reasoned" and "eval mode" in t["attention_dropout"].reason
    assert t["rope_parameters.rope_theta"].status == "varied"
    assert t["initializer_range"].read_by == [] and t["initializer_range"].status == "reasoned"


def test_the_command(capsys):
    assert main(["coverage", "--family", "llama", "--no-fuzz"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Config key coverage") and "| llama |" in out and "`rope_parameters.rope_theta`" in out
    assert main(["coverage", "--family", "nosuch"]) == 2
    assert "no such family" in capsys.readouterr().err
    assert main(["coverage", "--family", "llama", "--update-open"]) == 2
