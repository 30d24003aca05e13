"""The capture cache under concurrent writers (issue 16): parallel workers, two
matrices on one cache, CI shards on one cache directory all write the same
content-addressed keys. Many processes race on ONE key here, released together
by a barrier; every writer must succeed and every reader must see a whole entry
or none."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest

N_WRITERS = 4


def _export_llama(cache_dir: str, barrier, q) -> None:
    os.environ["CONFORMANCE_CACHE"] = cache_dir
    try:
        from harness.families import get
        from harness.pipeline.gguf import export as gguf_export

        import time

        import gguf

        # a real model's tensors take seconds to write: hold every writer inside its
        # write for a moment, so the writers overlap however the processes are scheduled
        slow = gguf.GGUFWriter.write_tensors_to_file

        def write_slowly(self, *a, **k):
            time.sleep(1.0)
            return slow(self, *a, **k)

        gguf.GGUFWriter.write_tensors_to_file = write_slowly
        fam = get("llama")
        config = fam.make_config({})
        model = fam.build_model(config, 0)
        barrier.wait(timeout=120)
        q.put(("ok", str(gguf_export.export(fam, model, config, "f32", 0, "plain"))))
    except Exception as e:  # reported to the parent, which fails the test with it
        q.put(("error", f"{type(e).__name__}: {e}"))


def _store(cache_dir: str, barrier, q, value: float) -> None:
    os.environ["CONFORMANCE_CACHE"] = cache_dir
    try:
        from harness import cache

        barrier.wait(timeout=120)
        for _ in range(5):
            cache.store("race", "onekey", {"a": np.full(400_000, value)}, {"writer": value})
        q.put(("ok", value))
    except Exception as e:
        q.put(("error", f"{type(e).__name__}: {e}"))


def _read(cache_dir: str, barrier, q) -> None:
    os.environ["CONFORMANCE_CACHE"] = cache_dir
    from harness import cache

    import time

    barrier.wait(timeout=120)
    seen, torn = 0, []
    # a store is a folder renamed into place (harness/store.py): read until well after
    # the first writer's lands (a miss costs one stat, so a count of tries ends too soon)
    end = time.monotonic() + 60
    while time.monotonic() < end and seen < 200:
        hit = cache.load("race", "onekey")
        if hit is None:
            continue
        a, meta = hit[0]["a"], hit[1]
        seen += 1
        # a whole entry: one writer's array, all of it, with that writer's meta
        if a.shape != (400_000,) or not (a == a[0]).all() or meta.get("writer") != a[0]:
            torn.append((a.shape, meta))
    q.put(("read", seen, torn))


def _race(target, n, extra=(), readers=0, tmp_path=None):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n + readers)
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(str(tmp_path), barrier, q, *extra(i))) for i in range(n)]
    procs += [ctx.Process(target=_read, args=(str(tmp_path), barrier, q)) for _ in range(readers)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return results


def test_concurrent_gguf_exports_of_one_key_all_succeed(tmp_path):
    """The first-run failure of the default matrix: workers exporting the same GGUF
    through one fixed temporary name renamed it away under each other
    (FileNotFoundError in a reference row)."""
    pytest.importorskip("gguf")
    results = _race(_export_llama, N_WRITERS, extra=lambda i: (), tmp_path=tmp_path)
    errors = [r for r in results if r[0] != "ok"]
    assert not errors, errors
    paths = {r[1] for r in results}
    assert len(paths) == 1
    import gguf

    reader = gguf.GGUFReader(paths.pop(), "r")  # a whole, readable file
    assert any(t.name == "token_embd.weight" for t in reader.tensors)
    left = [p.name for p in (tmp_path / "gguf").iterdir() if ".tmp" in p.name]
    assert not left, left  # no temporary left behind


def test_concurrent_stores_and_loads_of_one_key_never_tear(tmp_path):
    results = _race(_store, N_WRITERS, extra=lambda i: (float(i + 1),), readers=2, tmp_path=tmp_path)
    assert not [r for r in results if r[0] == "error"], results
    reads = [r for r in results if r[0] == "read"]
    assert len(reads) == 2 and all(not r[2] for r in reads), reads
    assert sum(r[1] for r in reads) > 0  # the readers did see entries while the writers wrote
    from harness import cache

    os.environ["CONFORMANCE_CACHE"], old = str(tmp_path), os.environ.get("CONFORMANCE_CACHE")
    try:
        arrays, meta = cache.load("race", "onekey")
    finally:
        os.environ["CONFORMANCE_CACHE"] = old
    assert (arrays["a"] == meta["writer"]).all()
    assert not [p.name for p in Path(tmp_path, "race").iterdir() if ".tmp" in p.name]


def test_atomic_path_leaves_the_old_file_on_failure(tmp_path):
    from harness.atomic import atomic_path, write_text

    dest = tmp_path / "x.txt"
    write_text(dest, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(dest) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer died")
    assert dest.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]
