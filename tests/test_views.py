"""The views made from rows: escaping, honest verdicts, the status of a case,
the heatmap colours, plots, the feature map."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pandas as pd

from harness import views
from harness.features import SPEC_DECORATIONS

EVIL = "</script><img src=x onerror=alert(1)>|<b>"


def row(**kw):
    r = dict(case_id="llama/a", family="llama", features="gqa;kv_decode", candidate="impl", reference="hf",
             layer=0, probe="q", status="pass", reason="", nmse=1e-14, max_abs=1e-7, err_ratio=1e-3, tol_nmse=1e-10,
             worst="seq=0")
    r.update(kw)
    return r


META = {"spec": {"name": "t<x>", "path": "p"}, "versions": {"git_commit": "abc"}}


def test_everything_shown_is_escaped():
    df = pd.DataFrame([row(), row(case_id=f"llama/{EVIL}", status="fail", reason=EVIL, probe="k")])
    page = views.report_html(df, META)
    assert "<img" not in page and "<b>" not in page and page.count("</script>") == 2  # our two scripts only
    data = json.loads(re.search(r"<script type='application/json' id='data'>(.*?)</script>", page, re.S).group(1))
    assert data["rows"][f"llama/{EVIL}"][0][views.DETAIL_COLS.index("reason")] == EVIL  # the JSON: the text unchanged
    js = views.case_js(f"llama/{EVIL}", data["rows"][f"llama/{EVIL}"], None)  # a large run's detail file
    assert "</script>" not in js and "<img" not in js and EVIL not in js
    md = views.summary_md(df, META)
    assert "<img" not in md and "\\|" in md
    xml = views.junit_xml(df, META)
    failure = ET.fromstring(xml).find(".//failure")
    assert EVIL in failure.text


def test_case_status_and_worst_error():
    df = pd.DataFrame([row(), row(probe="k", status="finding", nmse=0.5, reason="x -- known disagreement: y"),
                       row(case_id="b", status="not-exposed", nmse=None),
                       row(case_id="c", status="error", layer=-1, probe="", reason="reference hf failed: boom")])
    cs = views.cases(df).set_index("case_id")
    assert cs.at["llama/a", "status"] == "pass" and cs.at["llama/a", "findings"] == 1
    assert cs.at["llama/a", "worst_nmse"] == 1e-14  # a finding is reported as one, not as impl's error
    # nothing of impl compared: not a pass, and not a quiet "not-exposed" either
    assert cs.at["b", "status"] == "unguarded"
    assert cs.at["c", "status"] == "error" and cs.at["c", "first_fail"] == "impl vs hf, case: reference hf failed: boom"


def test_nothing_compared_is_a_failing_verdict():
    empty = pd.DataFrame(columns=["case_id", "status"])
    assert "Nothing was compared" in views.summary_md(empty, META)
    skipped = pd.DataFrame([row(status="skipped", nmse=None)])
    md = views.summary_md(skipped, META)
    assert md.startswith("# Conformance matrix `t&lt;x&gt;`: FAIL") and "No case compared anything" in md


def test_heatmap_colours_by_error_relative_to_tolerance():
    cell = lambda **kw: {"cases": 1, "failing": 0, "findings": 0, "passing": 1, "worst_nmse": 0.0, **kw}  # noqa: E731
    assert views._colour(cell(worst_ratio=1e-9)) == "#1a9850"
    # well inside the bound is green, never the yellow of "near the bound" (a pass at 0.12 read as a warning)
    for r in (1e-3, 0.05, 0.12, 0.4):
        red, green, blue = (int(views._colour(cell(worst_ratio=r))[i:i + 2], 16) for i in (1, 3, 5))
        assert green > red and green > blue, r
    assert views._colour(cell(worst_ratio=1.0)) == "#fee08b"
    assert views._colour(cell(failing=1, worst_ratio=5.0)) == "#d73027"
    assert views._colour(None) == views.NOT_COMPARED_COLOUR
    # text reads on its background: dark ink on the light ones ("not compared" was white on light grey)
    assert views._ink(views.NOT_COMPARED_COLOUR) == "#222" and views._ink("#fee08b") == "#222"
    assert views._ink(views.FAIL_COLOUR) == "#fff"


def test_failures_come_first_in_the_summary():
    df = pd.DataFrame([row(), row(case_id="q/b", family="qwen2", features="qkv_bias;kv_paged", status="fail",
                                  reason="nmse 1 > 1e-10")])
    md = views.summary_md(df, META)
    table = md.split("## Features × families")[1]
    assert table.index("**qkv_bias**") < table.index("| gqa |")
    assert md.index("## Failing cases") < md.index("## Features × families")


def test_plot_is_a_png(tmp_path):
    df = pd.DataFrame([row(), row(probe="attn_out", status="fail", nmse=1.0), row(layer=-1, probe="embeddings",
                                                                              candidate="llamacpp", nmse=0.0)])
    views.plot_case(df, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_feature_map_names_every_decoration():
    df = pd.DataFrame([row(probe="attn_out"), row(reference="llamacpp", probe="attn_out", nmse=2e-13)])
    out = views.feature_map(df)
    words = [line.split() for line in out.splitlines() if line.strip()]
    assert set(SPEC_DECORATIONS) <= {w[0] for w in words}
    # the columns are map_cols(): impl vs each reference, then the reference pairs
    head = next(w for w in words if w[0] == "feature")
    assert " ".join(head[2:]) == "impl vs hf impl vs hf_cached impl vs llamacpp impl vs mlx hf_cached vs hf " \
                                 "llamacpp vs hf mlx vs hf llamacpp vs hf_cached mlx vs hf_cached mlx vs llamacpp"
    assert ["gqa", "llama", "pass", "1e-14", "-", "pass", "2e-13"] + ["-"] * 7 in words
    assert ["alibi", "-", "unverified:"] in [w[:3] for w in words]
