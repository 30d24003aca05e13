"""Run directories: rows (parquet + CSV), run metadata (JSON), and readable views.

Everything a person reads is made from the rows, so the machine-readable files
are the record and the views can be regenerated."""

from __future__ import annotations

import json
import math
import secrets
import shutil
from datetime import datetime, timezone
from pathlib import Path
import os
import tempfile

from . import atomic
from .atomic import atomic_path
from .errors import UsageError
from .verdict import FAILING
from .versions import calibrated, drift, versions

from harness.lazy import lazy

pd = lazy("pandas")  # bad input is refused, `conformance list` runs, without it (harness/lazy.py)


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def run_dir(out: str | None, run_id: str) -> Path:
    """``--out``, else ``reports/<run-id>`` under the current directory (where the
    user runs the command, not where the project is installed)."""
    return Path(out) if out else Path.cwd() / "reports" / run_id


def check_out(out: str | None, run_id: str, if_not_empty: str = "give another --out or remove it") -> Path:
    """The run directory, refused before any work (UsageError) where it cannot be
    written: a file, a non-empty directory (``if_not_empty`` says what to do),
    below a file, or in a directory this process may not write. Creates nothing."""
    d = run_dir(out, run_id)
    flag = f"--out {d}" if out else f"the report directory {d}"
    if d.exists():
        if not d.is_dir():
            raise UsageError(f"{flag} is a file; give a new or empty directory")
        if any(p.name != LOCK_NAME for p in d.iterdir()):
            raise UsageError(f"{flag} is not empty; {if_not_empty}")
    check_writable(d, flag)
    return d


LOCK_NAME = ".conformance-lock"


def _holder(lock: Path) -> int | None:
    """The pid holding ``lock``, or None when the lock is stale (its process is gone)."""
    try:
        pid = int(lock.read_text().strip() or "0")
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        return pid
    return pid


def claim_out(out: str | None, run_id: str, if_not_empty: str = "give another --out or remove it",
              resume: bool = False) -> Path:
    """The run directory, claimed for this process: made if need be, with a lock file
    created exclusively (O_EXCL), so two commands started into one ``--out`` at the
    same moment cannot both write it -- the second is refused in one line (issue 41:
    two `run`s into one --out both printed PASS and one result was lost). A lock left
    by a process that is gone is stale and taken over. ``resume``: the directory holds
    a run to complete (``matrix --resume``), not nothing. ``release_out`` gives it back."""

    d = run_dir(out, run_id) if not resume else Path(out)
    if not resume:
        d = check_out(out, run_id, if_not_empty)
    flag = f"--out {d}" if out else f"the report directory {d}"
    made = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    lock = d / LOCK_NAME
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            pid = _holder(lock)
            if pid is not None and pid != os.getpid():
                raise UsageError(f"{flag} is in use by another conformance run (pid {pid}); wait for it, or give "
                                 "another --out") from None
            lock.unlink(missing_ok=True)  # stale: its process is gone
    else:
        raise UsageError(f"{flag} could not be locked; give another --out")
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    # another command may have written here between the check and the lock
    if not resume and any(p.name != LOCK_NAME for p in d.iterdir()):
        lock.unlink(missing_ok=True)
        raise UsageError(f"{flag} is not empty; {if_not_empty}")
    _CLAIMED[d] = made
    return d


_CLAIMED: dict = {}  # run directory -> whether this process made it


def release_out(d: Path, keep: bool = True) -> None:
    """Give back a directory ``claim_out`` took: its lock removed; with ``keep=False``
    (nothing was finished: bad input found late, an interrupt) the directory goes too
    when this process made it and it holds nothing but the lock -- no partial report."""
    d = Path(d)
    made = _CLAIMED.pop(d, False)
    (d / LOCK_NAME).unlink(missing_ok=True)
    if not keep:
        rest = [p for p in d.iterdir()] if d.is_dir() else []
        if made and not rest:
            d.rmdir()
        elif made and not any(p.name in ("rows.parquet", "meta.json", "run.json") for p in rest):
            shutil.rmtree(d, ignore_errors=True)


def check_writable(path: Path, flag: str, file: bool = False) -> None:
    """UsageError unless ``path`` -- a directory, or with ``file`` a file --
    existing or not, can be made and written by this process. Creates nothing."""

    path = Path(path)
    if file and path.is_dir():
        raise UsageError(f"{flag} is a directory; give a file name")
    where = path.parent if file else path
    while not where.exists():
        where = where.parent
    if not where.is_dir():
        raise UsageError(f"{flag} cannot be made: {where} is a file")
    try:  # os.access alone says yes to root on a read-only file system
        if not os.access(where, os.W_OK | os.X_OK) or (file and path.exists() and not os.access(path, os.W_OK)):
            raise OSError
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError:
        raise UsageError(f"{flag} cannot be written: {where} is not writable") from None


def frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    if not df.empty and "detail" not in df:
        df["detail"] = ""  # the column every run has (contract.rows): only error rows fill it
    if not df.empty:
        for col in ("reason", "tol_reason", "overrides", "worst", "features", "layer_kind", "detail"):
            if col in df:
                df[col] = df[col].fillna("").astype(str)
    return df


def write_rows(d: Path, rows: list[dict]) -> pd.DataFrame:
    d.mkdir(parents=True, exist_ok=True)
    df = frame(rows)
    # whole files or none: `diff`, `merge` and `--resume` may read a run a kill interrupted
    with atomic_path(d / "rows.parquet") as tmp:
        df.to_parquet(tmp, index=False)
    # the CSV is for a reader with a spreadsheet: a run of many rows keeps only the parquet
    # (the default matrix's CSV was 94 MB beside a 9 MB parquet; issue 41)
    if len(df) <= CSV_MAX_ROWS:
        with atomic_path(d / "rows.csv") as tmp:
            df.to_csv(tmp, index=False)
    else:
        (d / "rows.csv").unlink(missing_ok=True)
    return df


CSV_MAX_ROWS = 50_000


def write_meta(d: Path, meta: dict) -> None:
    meta = dict(meta)
    meta.setdefault("versions", versions())
    # what the verdicts were calibrated on (lock.txt), and what of it this run did not have:
    # a report made on another release of a reference says so in its header (views.py)
    meta.setdefault("calibration", {"lock": calibrated(),
                                    "drift": [list(x) for x in drift(meta["versions"])]})
    atomic.write_text(d / "meta.json", json.dumps(meta, indent=2, default=str))


def read_rows(d: Path) -> pd.DataFrame:
    p = Path(d)
    if (p / "rows.parquet").exists():
        return pd.read_parquet(p / "rows.parquet")
    if (p / "rows.csv").exists():
        return pd.read_csv(p / "rows.csv", keep_default_na=False)
    raise FileNotFoundError(f"{d} holds no rows.parquet or rows.csv")


def counts(rows) -> dict:
    df = rows if isinstance(rows, pd.DataFrame) else frame(rows)
    return df["status"].value_counts().to_dict() if not df.empty else {}


def exit_status(rows) -> int:
    """0 when everything compared passed AND something was compared; 1 otherwise.
    A run that compared nothing (zero rows, or only skipped / not-exposed) fails."""
    c = counts(rows)
    if any(c.get(s, 0) for s in FAILING):
        return 1
    if not c.get("pass", 0):
        return 1
    return 0


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def case_table(rows) -> str:
    """Per reference, layer and probe: status, NMSE, max_abs, the worst element."""
    df = rows if isinstance(rows, pd.DataFrame) else frame(rows)
    if df.empty:
        return "(no rows)"
    lines = []
    for (case_id, cand, ref), g in df.groupby(["case_id", "candidate", "reference"], sort=False):
        lines.append(f"== {case_id}: {cand} vs {ref}")
        lines.append(f"  {'layer':>5} {'probe':<12} {'status':<15} {'nmse':>10} {'max_abs':>10}  worst / reason")
        for r in g.itertuples():
            layer = "-" if r.layer == -1 else str(r.layer)
            tail = r.reason if r.status != "pass" else "  ".join(
                x for x in (getattr(r, "worst", ""), getattr(r, "reason", "")) if x)
            lines.append(f"  {layer:>5} {r.probe:<12} {r.status:<15} {_fmt(getattr(r, 'nmse', None)):>10} "
                         f"{_fmt(getattr(r, 'max_abs', None)):>10}  {tail}")
    c = counts(df)
    lines.append("totals: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    return "\n".join(lines)


def remove_partial(d: Path) -> None:
    shutil.rmtree(d, ignore_errors=True)
