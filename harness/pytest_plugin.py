"""pytest plugin: the cases of a matrix spec as pytest items.

    pytest --conformance-matrix fixtures/matrix/smoke.toml [-n 2] [-k qwen2]

Every case becomes one item named by its case id (``llama/numpy-cpu-float32/
decode/mixed/all/s0/t16``), so the matrix runs inside a project's own test
suite, with -k selection, pytest-xdist and pytest's JUnit output. An item
fails when any of its comparisons fails or errors; a case that compares
nothing (its device absent) is skipped with the reason -- and a session whose
matrix items all skipped fails, since it compared nothing.

Registered as the ``conformance`` pytest11 entry point (pyproject.toml).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .errors import UsageError
from .matrix import load_spec, nonempty
from . import case as case_module  # looked up at each call, as a test's patch of the module expects
from .policy import load_policy
from .report import case_table
from .views import FAILING, case_status
from . import references

_PASSED = "conformance_passed"


def pytest_addoption(parser):
    g = parser.getgroup("conformance", "attention conformance matrix")
    g.addoption("--conformance-matrix", action="append", default=[], metavar="SPEC",
                help="collect the cases of this matrix spec (TOML) as test items (repeatable)")
    g.addoption("--conformance-policy", metavar="TOML", default=None,
                help="tolerance policy for the matrix items (default fixtures/tolerance.toml)")


def _specs(config) -> list[Path]:
    return [Path(s).resolve() for s in config.getoption("conformance_matrix")]


def pytest_configure(config):
    # The specs join the paths pytest collects (next to testpaths or the paths
    # given), so their cases are collected, counted, selected with -k and
    # distributed by xdist like any test file's.
    for p in _specs(config):
        if str(p) not in config.args:
            config.args.append(str(p))


def pytest_collect_file(file_path, parent):
    if file_path.resolve() in _specs(parent.config):
        return MatrixSpec.from_parent(parent, path=file_path)


class MatrixSpec(pytest.File):
    def collect(self):
        try:
            cases = nonempty(load_spec(self.path))
        except UsageError as e:
            raise pytest.UsageError(f"--conformance-matrix: {e}") from None
        for case in cases:
            yield CaseItem.from_parent(self, name=case.case_id(), case=case)


class CaseFailed(Exception):
    pass


class CaseItem(pytest.Item):
    def __init__(self, *, case, **kw):
        super().__init__(**kw)
        self.case = case
        self.user_properties.append(("conformance_case", case.case_id()))

    def runtest(self):
        for name in self.case.refs:
            ref = references.get(name)
            if ref.available():
                continue
            flag = f"CONFORMANCE_ALLOW_NO_{name.upper()}"
            if os.environ.get(flag) == "1":
                pytest.skip(f"{ref.label} missing and {flag}=1")
            pytest.fail(f"{ref.label} is not installed (pip install -e '.[{ref.requires}]'); "
                        f"opt out explicitly with {flag}=1", pytrace=False)
        policy = load_policy(self.config.getoption("conformance_policy"))
        rows, _ = case_module.run_case(self.case, policy)
        status = case_status(r["status"] for r in rows)
        if status in FAILING:
            raise CaseFailed(case_table([r for r in rows if r["status"] in FAILING]))
        if status != "pass":
            pytest.skip(f"{status}: {rows[0]['reason']}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"conformance case {self.name}"


def pytest_runtest_logreport(report):
    # Runs where the reports arrive (the xdist controller too): count matrix passes.
    if report.when == "call" and report.passed and any(k == "conformance_case" for k, _ in report.user_properties):
        _STATE[_PASSED] = _STATE.get(_PASSED, 0) + 1


_STATE: dict = {}


def pytest_sessionfinish(session, exitstatus):
    if getattr(session.config, "workerinput", None) is not None:
        return  # an xdist worker: the controller judges the whole session
    if session.config.getoption("conformance_matrix") and not _STATE.get(_PASSED) and exitstatus == 0 \
            and not session.config.getoption("collectonly"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr:
            tr.write_line("conformance: no matrix case compared anything (all skipped or deselected); failing the session",
                          red=True)
