"""summary.md and report.html tell one run the same way, and truly, for every
shape of run (issue 29, finding 1: a matrix whose candidate failed every case
wrote "No case compared anything" and "`gqa`: no case of this run exercises it"
in summary.md while report.html said FAIL). Both are read back as a reader sees
them -- the markdown's title, headline and lists, the page's elements -- so the
test holds any renderer to the same statements, not to a shared function."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pandas as pd
import pytest

from harness import views

META = {"spec": {"name": "shapes", "path": "p"}, "versions": {"git_commit": "abc"}}


def row(**kw):
    r = dict(case_id="llama/a", family="llama", features="gqa;kv_decode", candidate="impl", reference="hf",
             layer=0, probe="attn_out", status="pass", reason="", nmse=1e-14, max_abs=1e-7, err_ratio=1e-3,
             tol_nmse=1e-10, worst="seq=0")
    r.update(kw)
    return r


def fail(**kw):
    return row(status="fail", nmse=0.5, err_ratio=5e9, reason="nmse 0.5 > 1e-10", **kw)


SHAPES = {
    "all pass": [row(), row(case_id="qwen2/b", family="qwen2", features="qkv_bias;gqa;kv_paged")],
    "all fail": [fail(), fail(case_id="qwen2/b", family="qwen2", features="qkv_bias;gqa;kv_paged")],
    "mixed": [row(), fail(case_id="qwen2/b", family="qwen2", features="qkv_bias;kv_paged")],
    "all skipped": [row(status="skipped", probe="*", layer=-1, nmse=None, err_ratio=None,
                        reason="tiny-engine does not compute layer 0's input norm 'rms1p' (only rms)"),
                    row(case_id="qwen2/b", family="qwen2", status="skipped", probe="*", layer=-1, nmse=None,
                        err_ratio=None, reason="no cuda device")],
    # the references agree with each other; only the candidate is wrong
    "candidate-only failures": [fail(), row(candidate="llamacpp", reference="hf"),
                                fail(case_id="qwen2/b", family="qwen2", features="qkv_bias;gqa;kv_paged"),
                                row(case_id="qwen2/b", family="qwen2", candidate="llamacpp", reference="hf",
                                    features="qkv_bias;gqa;kv_paged")],
    "errors only": [row(status="error", layer=-1, probe="", nmse=None, err_ratio=None,
                        reason="reference hf failed: boom")],
}
# what each shape must say: the verdict, and words its headline must (and must not) hold
TRUTH = {"all pass": ("PASS", "2 of 2 cases pass"), "all fail": ("FAIL", "2 of 2 cases failing"),
         "mixed": ("FAIL", "1 of 2 cases failing"), "all skipped": ("FAIL", "No case compared anything"),
         "candidate-only failures": ("FAIL", "2 of 2 cases failing"), "errors only": ("ERROR", "1 of 1 case failing")}


def read_md(md: str) -> dict:
    # the markdown escapes < and > as entities (views._md: no raw HTML for the renderer);
    # a reader sees what the renderer shows, the characters (tiled_v_heads' "grouped -> tiled")
    title = re.match(r"# Conformance \w+ `[^`]*`: (\w+)", md)
    head = re.search(r"^\*\*(.+?)\*\*", md, re.M)
    unver = {k: html.unescape(v) for k, v in re.findall(r"^- `([^`]+)`: (.+)$", md, re.M)}
    # the failing cases come in groups (issue 41): | first failure | status | cases | `a`, `b` |
    failing = sorted((cid, st) for st, ids in re.findall(r"^\| .+? \| ([a-z-]+) \| \d+ \| (`.+?`[^|]*) \|$",
                                                          md.split("## Failing cases")[1], re.M)
                     for cid in re.findall(r"`([^`]+)`", ids)) if "## Failing cases" in md else []
    skipped = [(st, html.unescape(why)) for st, why in
               re.findall(r"^\| (skipped|not-exposed|not-implemented) \| \d+ \| (.+) \|$", md, re.M)]
    return {"verdict": title and title.group(1), "headline": head and html.unescape(head.group(1).replace("\\|", "|")),
            "unverified": unver, "failing": failing, "not compared": skipped}


class _Page(HTMLParser):
    """The statements of report.html: the h1's verdict, the headline, the failing
    cases, the not-compared reasons, the unverified decorations with their reasons."""

    def __init__(self):
        super().__init__()
        self.stack, self.text = [], {}
        self.cur = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.stack.append((tag, a.get("id")))
        if tag in ("h1", "strong", "li", "tr"):
            self.cur = [tag, self._within(), ""]

    def _within(self):
        return next((i for _, i in reversed(self.stack) if i), None)

    def handle_endtag(self, tag):
        if self.cur and tag == self.cur[0]:
            self.text.setdefault((self.cur[0], self.cur[1]), []).append(self.cur[2])
            self.cur = None
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        if self.cur is not None:
            self.cur[2] += data if self.cur[0] != "tr" else data + "\t"


def read_html(page: str) -> dict:
    p = _Page()
    p.feed(page)
    h1 = (p.text.get(("h1", None)) or [""])[0]
    v = re.search(r": (\w+)$", h1.strip())
    unver = dict(li.split(": ", 1) for li in p.text.get(("li", "unverified"), []))
    # a group's row: first failure, status, count, then its cases (links), tab-separated
    failing = sorted((cid.strip(", "), tr.split("\t")[1]) for tr in p.text.get(("tr", "failing"), [])[1:]
                     for cid in tr.split("\t")[3:] if cid.strip(", ") and not cid.strip().startswith("and "))
    skipped = [tuple(x for i, x in enumerate(tr.split("\t")) if i in (0, 2)) for tr in
               p.text.get(("tr", "not-compared"), [])[1:]]
    return {"verdict": v and v.group(1), "headline": (p.text.get(("strong", "headline")) or [None])[0],
            "unverified": unver, "failing": failing, "not compared": skipped}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_summary_and_report_say_the_same_true_thing(shape):
    df = pd.DataFrame(SHAPES[shape])
    md, page = read_md(views.summary_md(df, META)), read_html(views.report_html(df, META))
    assert md == page, shape
    word, words = TRUTH[shape]
    assert md["verdict"] == word and words in md["headline"], (shape, md)
    exercised = set(";".join(df["features"]).split(";"))
    passed = set(";".join(df[(df["status"] == "pass") & (df["candidate"] == "impl")]["features"]).split(";"))
    for tag, why in md["unverified"].items():
        assert tag not in passed, (shape, tag)
        if tag in exercised:  # exercised and failed (or never compared) is never "not exercised"
            assert "exercised by" in why and "no case of this run" not in why, (shape, tag, why)
    if shape != "all skipped":
        assert "No case compared anything" not in md["headline"]
    if shape in ("all fail", "candidate-only failures"):
        assert "failing in" in md["unverified"]["gqa"] and {c for c, _ in md["failing"]} == {"llama/a", "qwen2/b"}
    if shape == "all skipped":
        assert {why for _, why in md["not compared"]} >= {"no cuda device"}


def test_the_last_line_has_the_verdict_and_the_counts():
    for shape, (word, words) in TRUTH.items():
        line = views.run_model(pd.DataFrame(SHAPES[shape]), META).last_line()
        assert line.startswith(f"{word}: ") and words in line and "cases:" in line and "rows:" in line, line
