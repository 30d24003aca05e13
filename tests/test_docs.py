"""The docs (README short, every page reachable from it, no dated measurement in
it, no broken link) and the generated reference pages (fresh)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def _links(page: Path) -> list[Path]:
    out = []
    for target, _ in LINK.findall(page.read_text()):
        if "://" in target:
            continue
        out.append((page.parent / target).resolve())
    return out


def test_readme_is_short_and_holds_no_dated_measurement():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a dated result belongs in docs/measurements/"
    assert "bash scripts/setup.sh && .venv/bin/conformance matrix" in text
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -n 2" in text


def test_every_docs_page_is_reachable_from_the_readme_and_no_link_is_broken():
    seen, todo = set(), [ROOT / "README.md"]
    broken = []
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for target in _links(page):
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
            elif target.suffix == ".md" and target.is_relative_to(ROOT):
                todo.append(target)
    assert not broken, broken
    pages = set((ROOT / "docs").rglob("*.md"))
    assert pages and pages <= seen, sorted(str(p.relative_to(ROOT)) for p in pages - seen)


def test_the_generated_reference_pages_are_fresh():
    """scripts/gen_docs.py --check: the CLI, report schema, probes, kinds, families and
    divergences pages are what the code generates now."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"], capture_output=True,
                       text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]


def test_a_stale_page_is_noticed(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    import gen_docs

    monkeypatch.setattr(gen_docs, "ROOT", tmp_path)
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    monkeypatch.setattr(gen_docs, "PAGES", {"docs/reference/probes.md": gen_docs.probes_page})
    assert gen_docs.main(["--check"]) == 1  # missing
    gen_docs.main([])
    assert gen_docs.main(["--check"]) == 0
    page = tmp_path / "docs" / "reference" / "probes.md"
    page.write_text(page.read_text().replace("`q_rope`", "`q_rotated`"))
    assert gen_docs.main(["--check"]) == 1


# the paths a page names: a file of the repository's own trees, by its repository-relative path
_NAMED = re.compile(r"(?<![\w/.-])((?:harness|tests|scripts|fixtures|impl|contract|docs|examples|\.github|\.ci)/"
                    r"[\w./-]*[\w-]\.(?:py|toml|md|sh|yml|json|parquet|txt))")


def _doc_files() -> list[Path]:
    """Every page a reader reads: the docs, the README, the findings (the divergences page
    quotes them) and the tolerance policy's comments."""
    return (sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
            + sorted((ROOT / "harness" / "families").glob("*/findings.toml")) + [ROOT / "fixtures" / "tolerance.toml"])


def test_no_doc_names_a_file_that_does_not_exist():
    """Issue 41: findings cited tests/test_family_gemma3.py and two more that had moved
    into the family folders; the policy cited harness/refs/, gone since the references
    got their own folders."""
    missing = sorted({f"{p.relative_to(ROOT)}: {m}" for p in _doc_files() for m in _NAMED.findall(p.read_text())
                      if not (ROOT / m).exists()})
    assert not missing, missing


def test_no_doc_links_outside_the_repository():
    """Issue 41: links to ../shared/spec/, which a clone does not have."""
    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in _links(page):
            if not target.is_relative_to(ROOT):
                out.append(f"{page.relative_to(ROOT)} -> {target}")
        if "shared/spec" in page.read_text():
            out.append(f"{page.relative_to(ROOT)} names ../shared/spec (not in the repository)")
    assert not out, out


def test_the_checks_above_can_fail(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("see tests/test_family_gemma3.py and [spec](../../../shared/spec/x.rs)")
    assert _NAMED.findall(page.read_text()) == ["tests/test_family_gemma3.py"]
    assert not (ROOT / "tests/test_family_gemma3.py").exists()
