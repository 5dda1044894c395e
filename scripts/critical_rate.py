"""Kept for old notes: the critical-rate grid is now ``basin critical-rate``
(:mod:`basin.experiments.critical_rate`); this forwards its arguments there.

    .venv/bin/basin critical-rate 1p1d-h200 --low 4 --high 14 --step 0.5 --seeds 0,1,2

The old space-separated ``--seeds 0 1 2`` is turned into ``--seeds 0,1,2``.
"""

from __future__ import annotations

import sys


def _forwarded(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        out.append(argv[i])
        if argv[i] == "--seeds":
            seeds = []
            while i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                i += 1
                seeds.append(argv[i])
            out.append(",".join(seeds))
        i += 1
    return out


if __name__ == "__main__":
    from basin.cli.app import main

    main(["critical-rate", *_forwarded(sys.argv[1:])])
