"""The README's and the engine walkthrough's commands, executed as a newcomer
types them, in a fresh virtual environment with the walkthrough's own install
steps (issue 29, finding 2: `conformance bisect --candidate tiny-engine-rope-bug`
answered `unknown candidate` on a fresh setup, because `pip install -e
examples/tiny_engine` was written nowhere).

The fresh environment: a new venv (no pip of its own, ``--without-pip``) whose
site-packages sees this environment's third-party packages through a filtered
copy of its site directory -- torch, transformers and llama-cpp-python are not
reinstalled (minutes), but this project and the example engine are NOT
visible: the project is installed into it as setup.sh does (``pip install
-e .``, offline, no build isolation), and the example engine only by the
walkthrough's own ``pip install`` line. A step the docs leave out fails here.

Every ``bash`` block of README.md "One case by hand" and of
docs/how-to/add-a-candidate.md runs, except lines naming a placeholder (your
engine: ``my-engine``, ``path/to/``), setup.sh (this test is its stand-in) and
the default matrix (CI runs it). A line's expected exit status is its ``# exit
N`` comment (default 0). Commands must be spelled ``.venv/bin/...``, as
everywhere in the docs: a bare ``conformance`` fails the test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = {"README.md": "## One case by hand", "docs/how-to/add-a-candidate.md": None}
PLACEHOLDERS = ("my-engine", "my_engine", "my-matrix", "path/to/")
SKIP = ("scripts/setup.sh", "-m pytest", "conformance matrix")
# this project and the example engine: never seen through the shared site directory
OURS = re.compile(r"(__editable__[._])?(attn[-_]conformance|tiny[-_]engine)", re.I)


def steps(path: str, section: str | None) -> list[tuple[str, int]]:
    """``(command, expected exit status)`` of every runnable line of the bash blocks."""
    text = (ROOT / path).read_text()
    if section:
        text = text.split(section, 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            cmd, _, comment = line.partition("#")
            cmd = cmd.strip()
            if not cmd or any(p in cmd for p in PLACEHOLDERS) or any(s in cmd for s in SKIP):
                continue
            m = re.search(r"\bexit (\d+)", comment)
            out.append((cmd, int(m.group(1)) if m else 0))
    return out


def test_every_walkthrough_command_is_spelled_with_the_environment():
    for path, section in DOCS.items():
        for cmd, _ in steps(path, section):
            assert cmd.startswith(".venv/bin/"), f"{path}: {cmd!r} -- spell it .venv/bin/..., as the docs do"


def fresh_venv(where: Path) -> Path:
    """A new venv seeing this environment's third-party packages but not the project."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    shared = where / "site"
    shared.mkdir()
    src = Path(sysconfig.get_paths()["purelib"])
    for p in src.iterdir():
        if not OURS.match(p.name):
            (shared / p.name).symlink_to(p)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # addsitedir: the shared directory's own .pth files are read too
    (Path(purelib) / "zz-shared-site.pth").write_text(f"import site; site.addsitedir({str(shared)!r})\n")
    return venv


def run_steps(venv: Path, work: Path, cmds: list[tuple[str, int]], env: dict) -> list[str]:
    """Each command in ``work``; what went other than the docs say."""
    py = f"{venv}/bin/python"
    bad = []
    for cmd, want in cmds:
        real = (cmd.replace(".venv/bin/pip install", f"{py} -m pip install --quiet --no-deps --no-build-isolation "
                                                       "--no-index --disable-pip-version-check")
                .replace(".venv/bin/python", py).replace(".venv/bin/", f"{venv}/bin/"))
        p = subprocess.run(real, shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        if p.returncode != want:
            tail = (p.stderr.strip() or p.stdout.strip()).splitlines()[-3:]
            bad.append(f"{cmd!r}: exit {p.returncode}, the docs say {want}: {' | '.join(tail)}")
    return bad


@pytest.mark.usefixtures("need_llamacpp")
def test_the_walkthroughs_run_from_a_fresh_environment(tmp_path):
    venv = fresh_venv(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv}/bin:{env.get('PATH', '')}"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
           "--no-index", "--disable-pip-version-check"]
    # the project, as scripts/setup.sh installs it (its dependencies are the shared ones)
    subprocess.run([*pip, "-e", str(ROOT)], check=True, env=env, capture_output=True, timeout=600)
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    walk = [s for path, section in DOCS.items() for s in steps(path, section)]
    assert any("pip install -e examples/tiny_engine" in c for c, _ in walk)
    assert any("tiny-engine-rope-bug" in c and "bisect" in c for c, _ in walk)
    # the test can fail: without the install step, the engine's names are unknown
    planted = [(c, w) for c, w in walk if "tiny-engine" in c and "bisect" in c]
    missed = run_steps(venv, work, planted, env)
    assert missed and "unknown candidate 'tiny-engine-rope-bug'" in missed[0], missed
    assert run_steps(venv, work, walk, env) == []
