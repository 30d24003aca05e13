"""report.html in a real browser (issue 29): Debian's Chromium, headless, driven
over the DevTools protocol (harness/testing/browser.py). The page loads with no
console error; clicking a heatmap cell filters the case table to that cell's
cases and "show all" brings them back; clicking a case shows its per-layer,
per-probe table; every cell's colour is the scale's for its err/tol -- green
well inside the bound -- with text that reads on it. ``check_page`` returns
what is wrong, so the planted-bug test shows each check can fail.

Skipped, with the reason shown, where no Chromium is installed (scripts/setup.sh
installs it where apt-get can)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness import views
from harness.testing.browser import Browser, find

EXE, WHY = find()
pytestmark = pytest.mark.skipif(EXE is None, reason=WHY)


def row(**kw):
    r = dict(case_id="llama/a", family="llama", features="gqa;kv_decode", candidate="impl", reference="hf",
             layer=0, probe="attn_out", status="pass", reason="", nmse=1e-14, max_abs=1e-7, err_ratio=1e-5,
             tol_nmse=1e-10, worst="seq=0")
    r.update(kw)
    return r


def run_rows() -> pd.DataFrame:
    """A mixed run: passes across the scale (far inside, 0.05, 0.12, 0.4, near the
    bound), a failure, a finding, a skipped case, another candidate."""
    rows = [row(), row(probe="q", err_ratio=3e-6),
            row(case_id="llama/b", features="gqa;kv_paged", err_ratio=0.05),
            row(case_id="qwen2/c", family="qwen2", features="qkv_bias;gqa;kv_decode", err_ratio=0.12),
            row(case_id="qwen2/d", family="qwen2", features="qkv_bias;kv_paged", err_ratio=0.4),
            row(case_id="qwen3/e", family="qwen3", features="qk_norm_head;gqa;kv_decode", err_ratio=0.8),
            row(case_id="qwen3/f", family="qwen3", features="qk_norm_head;kv_paged", status="fail", nmse=0.3,
                err_ratio=3e9, reason="nmse 0.3 > 1e-10"),
            row(case_id="qwen3/f", family="qwen3", features="qk_norm_head;kv_paged", probe="q", err_ratio=1e-4),
            row(case_id="gemma2/g", family="gemma2", features="softcap;kv_decode", status="skipped", nmse=None,
                err_ratio=None, probe="*", layer=-1, reason="tiny-engine does not compute 'rms1p'"),
            row(case_id="llama/h", candidate="tiny-engine", err_ratio=0.02),
            row(case_id="llama/i", features="gqa;kv_batched", err_ratio=2e-3),
            row(case_id="llama/i", features="gqa;kv_batched", probe="k", status="finding", nmse=0.5,
                reason="x -- known disagreement: y")]
    return pd.DataFrame(rows)


def _rgb(css: str) -> tuple:
    nums = [float(x) for x in css[css.index("(") + 1:css.index(")")].split(",")[:3]]
    return tuple(round(n) for n in nums)


def _contrast(a: tuple, b: tuple) -> float:
    def lum(c):
        c = [x / 255 for x in c]
        c = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _hex(c: str) -> tuple:
    return tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))


def check_page(b: Browser, df: pd.DataFrame) -> list[str]:
    """What is wrong with the loaded report of ``df``, in words; empty: nothing."""
    bad = [f"console: {e}" for e in b.errors]
    cs = views.cases(df)
    n_cases = len(cs)
    visible = "[...document.querySelectorAll('#cases tbody tr')].filter(r => !r.hidden)"
    # 1. a feature cell filters the case table to its family's cases with that feature
    for fam, feat in (("llama", "gqa"), ("qwen3", "qk_norm_head")):
        want = sorted(c.case_id for c in cs.itertuples() if c.family == fam and feat in c.features)
        got = b.js(f"(() => {{ const td = document.querySelector(\"table.heat td[data-feature='{feat}']"
                   f"[data-family='{fam}']\"); if (!td) return null; td.click(); "
                   f"return {visible}.map(r => r.dataset.case).sort(); }})()")
        if got != want:
            bad.append(f"filter {fam} x {feat}: shows {got}, expected {want}")
    got = b.js(f"(() => {{ document.getElementById('all').click(); return {visible}.length; }})()")
    if got != n_cases:
        bad.append(f"'show all' shows {got} of {n_cases} cases")
    # 2. a candidate cell filters to that candidate's cases of the family
    got = b.js(f"(() => {{ const td = document.querySelector(\"table.heat td[data-candidate='tiny-engine']"
               f"[data-family='llama']\"); if (!td) return null; td.click(); "
               f"return {visible}.map(r => r.dataset.case); }})()")
    if got != ["llama/h"]:
        bad.append(f"candidate filter tiny-engine x llama: shows {got}")
    b.js("document.getElementById('all').click()")
    # 3. the drill-down: a case's per-layer, per-probe table
    for cid in ("qwen3/f", "llama/a"):
        got = b.js(f"(() => {{ const tr = [...document.querySelectorAll('#cases tbody tr')]"
                   f".find(r => r.dataset.case === '{cid}'); tr.click(); const d = document.getElementById('detail');"
                   f" const h = d.querySelector('h2'); return [h ? h.textContent : null, "
                   f"d.querySelectorAll('table tr').length - 1, "
                   f"[...d.querySelectorAll('table tr td:nth-child(4)')].map(t => t.textContent)]; }})()")
        want_probes = list(df[df["case_id"] == cid]["probe"])
        if got is None or got[0] != cid or got[1] != len(want_probes) or got[2] != want_probes:
            bad.append(f"drill-down {cid}: {got}, expected {len(want_probes)} rows {want_probes}")
    # 4. colours: every cell on the one scale, green well inside the bound; text that reads
    cells = b.js("[...document.querySelectorAll('table.heat td[data-status]')].map(td => [td.dataset.status, "
                 "td.dataset.ratio === undefined ? null : Number(td.dataset.ratio), "
                 "getComputedStyle(td).backgroundColor, getComputedStyle(td).color, td.textContent])") or []
    if not cells:
        bad.append("no heatmap cell carries its status")
    for st, ratio, bg, ink, text in cells:
        rgb = _rgb(bg)
        if st == "fail":
            want = _hex(views.FAIL_COLOUR)
        elif st == "not compared":
            want = _hex(views.NOT_COMPARED_COLOUR)
        elif ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
            want = _hex(views.NO_RATIO)
        else:
            want = _hex(next(c for hi, c, _ in views.SCALE if ratio <= hi))
            r, g, bl = rgb
            if ratio <= 0.5 and not (g > r and g > bl):
                bad.append(f"a pass at err/tol {ratio} is {bg}, not green")
        if rgb != want:
            bad.append(f"a {st} cell at err/tol {ratio} is {bg}, the scale says rgb{want}")
        if text.strip() and _contrast(rgb, _rgb(ink)) < 3.0:
            bad.append(f"{st} cell text {ink} on {bg}: contrast {_contrast(rgb, _rgb(ink)):.1f} < 3")
    legend = b.js("[...document.querySelectorAll('#legend .swatch')].map(s => s.textContent)") or []
    if len(legend) != len(views.LEGEND):
        bad.append(f"legend shows {legend}")
    return bad


@pytest.fixture(scope="module")
def browser():
    with Browser(EXE) as b:
        yield b


def _load(browser, tmp_path, df) -> None:
    views.write_all(tmp_path, df, {"spec": {"name": "browser", "path": "p"}, "versions": {"git_commit": "abc"}})
    browser.events.clear()
    browser.open(tmp_path / "report.html")


def test_report_works_in_a_browser(browser, tmp_path):
    df = run_rows()
    _load(browser, tmp_path, df)
    assert browser.js("document.querySelector('h1').textContent").endswith(": FAIL")
    assert check_page(browser, df) == []


def test_the_browser_check_catches_a_broken_page(browser, tmp_path, monkeypatch):
    """Each check can fail: a script error, a filter that shows everything, a pass
    at err/tol 0.12 drawn in the near-the-bound yellow, white text on light grey."""
    df = run_rows()
    monkeypatch.setattr(views, "_JS", views._JS.replace("tr.hidden = !(tr.dataset.family === fam && ",
                                                        "tr.hidden = !(true || ") + "\nnotAFunction();")
    monkeypatch.setattr(views, "SCALE", ((1e-3, "#1a9850", "a"), (math.inf, "#fee08b", "b")))
    monkeypatch.setattr(views, "_ink", lambda bg: "#fff")
    _load(browser, tmp_path, df)
    bad = check_page(browser, df)
    assert any(b.startswith("console:") and "notAFunction" in b for b in bad), bad
    assert any(b.startswith("filter llama x gqa") for b in bad), bad
    assert any("err/tol 0.12" in b and "not green" in b for b in bad), bad
    assert any("contrast" in b for b in bad), bad


# ---------------------------------------------------------------- issue 41: a report to navigate
ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def test_the_default_matrix_report_navigates_in_a_window(browser, tmp_path):
    """The default matrix's report (the committed baseline's rows, 945 cases): its first
    page is small (case details load when opened), no table pushes the page sideways in
    a 1,400 px window, and a case opens on its per-layer table. Screenshots are left in
    the test's folder (report.png, report-case.png)."""
    import json

    base = ROOT / "fixtures" / "baselines" / "default"
    df = pd.read_parquet(base / "rows.parquet")
    views.write_all(tmp_path, df, json.loads((base / "meta.json").read_text()))
    size = (tmp_path / "report.html").stat().st_size
    assert size < 5e6, f"report.html is {size / 1e6:.1f} MB"  # 33.8 MB with every row inside (6b40995)
    browser.events.clear()
    browser.call("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 900, "deviceScaleFactor": 1,
                                                        "mobile": False}, session=True)
    browser.open(tmp_path / "report.html")
    assert browser.errors == []
    wide = browser.js("document.documentElement.scrollWidth")
    assert wide <= 1400, f"the page is {wide} px wide in a 1,400 px window"
    browser.screenshot(tmp_path / "report.png")
    cid = df["case_id"].iloc[len(df) // 2]
    want = int((df["case_id"] == cid).sum())
    browser.js(f"[...document.querySelectorAll('#cases tbody tr')].find(r => r.dataset.case === {json.dumps(cid)}).click()")
    got = browser.wait_js("(() => { const d = document.getElementById('detail'); const h = d.querySelector('h2');"
                          " const n = d.querySelectorAll('table tr').length - 1; return n > 0 ? [h.textContent, n] : null; })()")
    assert got == [cid, want], got
    assert browser.errors == []
    browser.screenshot(tmp_path / "report-case.png")
    print(f"screenshots: {tmp_path / 'report.png'}, {tmp_path / 'report-case.png'}")


def test_identical_failures_are_one_group_and_each_case_a_link(browser, tmp_path):
    """6b40995: 50 identical KeyError rows were 50 lines, and a failing case could not be
    clicked. One group of 50 now, each case a link that opens its detail and traceback."""
    rows = [row(case_id=f"mamba/c{i}", family="mamba", features="kv_decode", status="error", layer=-1, probe="",
                nmse=None, err_ratio=None, reason="reference hf failed: KeyError: 'hidden_states'",
                detail=f"Traceback (most recent call last):\n  File \"x.py\", line {i}, in scan\nKeyError: 'hidden_states'")
            for i in range(50)] + [row(case_id="llama/z", status="fail", nmse=0.3, err_ratio=3e9, reason="nmse 0.3 > 1e-10")]
    df = pd.DataFrame(rows)
    m = views.run_model(df, {"spec": {"name": "g"}})
    assert [(st, len(ids)) for _, st, ids in m.failure_groups] == [("error", 50), ("fail", 1)]
    md = views.summary_md(df, {"spec": {"name": "g"}})
    assert md.count("KeyError") == 1 and "| error | 50 |" in md
    _load(browser, tmp_path, df)
    assert browser.js("document.querySelectorAll('#failing tr').length") == 3  # the head and two groups
    browser.js("document.querySelector(\"#failing a.case-link[data-case='mamba/c7']\").click()")
    got = browser.wait_js("(() => { const d = document.getElementById('detail'); const t = d.querySelector('details.tb pre');"
                          " return t ? [d.querySelector('h2').textContent, t.textContent] : null; })()")
    assert got and got[0] == "mamba/c7" and 'line 7, in scan' in got[1], got
    assert browser.js("location.hash") == "#case=mamba%2Fc7"


def test_a_single_run_opens_on_its_per_layer_table(tmp_path):
    df = pd.DataFrame([row(), row(probe="q")])
    page = views.report_html(df, {"spec": {"name": "llama/a"}, "command": "run"})
    assert page.index("id='run-detail'") < page.index("Candidates × families")
    assert "<summary>Unverified decorations" in page  # folded: for one case it is a list of what its family lacks
