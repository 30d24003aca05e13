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
