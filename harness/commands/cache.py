"""``conformance cache``: what the capture cache holds, and clearing it.

    conformance cache                   # size per kind, the total, the limit
    conformance cache --older-than 30   # remove what no run used in 30 days
    conformance cache --max-size 5      # remove the least recently used down to 5 GB
    conformance cache --clear           # remove everything

The cache (``CONFORMANCE_CACHE``, default .cache/conformance) keeps every reference
capture, GGUF export, warm record and release environment a run made, keyed by
content; a removed entry is made again when a run needs it. It keeps itself under
``CONFORMANCE_CACHE_LIMIT_GB`` (default 20; 0: no limit), the least recently used
first, checked at most once an hour as a command ends (harness/cache.py).
"""

from __future__ import annotations

import time

from ..errors import UsageError
from .. import cache
from ..versions import cache_root


def register(sub) -> None:
    p = sub.add_parser("cache", help="show the capture cache's size, or clear it (by age, size or all)")
    p.add_argument("--clear", action="store_true", help="remove every entry")
    p.add_argument("--older-than", type=float, metavar="DAYS", help="remove the entries no run used in DAYS days")
    p.add_argument("--max-size", type=float, metavar="GB", help="remove the least recently used entries down to GB")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    p.set_defaults(fn=cmd_cache)


def _gb(b: int) -> str:
    return f"{b / 2**30:.2f} GB" if b >= 2**30 / 10 else f"{b / 2**20:.1f} MB"


def cmd_cache(a) -> int:
    if a.older_than is not None and not a.older_than >= 0:
        raise UsageError(f"--older-than must be a number of days >= 0, got {a.older_than}")
    if a.max_size is not None and not a.max_size >= 0:
        raise UsageError(f"--max-size must be a size in GB >= 0, got {a.max_size}")
    root = cache_root()
    if a.clear or a.older_than is not None or a.max_size is not None:
        removed, left = cache.evict(root, max_bytes=None if a.max_size is None else int(a.max_size * 2**30),
                                    older_than_s=None if a.older_than is None else a.older_than * 86400,
                                    everything=a.clear, dry_run=a.dry_run)
        freed = sum(r[2] for r in removed)
        verb = "would remove" if a.dry_run else "removed"
        print(f"{root}: {verb} {len(removed)} entries, {_gb(freed)}; {_gb(left)} left")
        return 0
    es = cache.entries(root)
    if not es:
        print(f"{root}: empty")
        return 0
    kinds: dict = {}
    for kind, _p, size, used in es:
        k = kinds.setdefault(kind, [0, 0, used])
        k[0] += 1
        k[1] += size
        k[2] = min(k[2], used)
    now = time.time()
    print(f"{'kind':14s} {'entries':>8s} {'size':>10s}  oldest use")
    for kind, (n, size, oldest) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"{kind:14s} {n:8d} {_gb(size):>10s}  {(now - oldest) / 86400:.1f} days ago")
    total = sum(e[2] for e in es)
    lim = cache.limit_bytes()
    print(f"{'total':14s} {len(es):8d} {_gb(total):>10s}  in {root}; limit "
          + (f"{_gb(lim)} ({cache.LIMIT_ENV}), the least recently used go first" if lim else "none"))
    return 0
