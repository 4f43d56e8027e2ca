"""A worker process of a cost table priced in parallel (`placer.solve.candidates.single_candidates`).

    python -m placer.solve.tablework IN OUT

IN holds a pickled (Resolved, Calibration, limit, [(role, pool name), ...]); the worker prices
`candidates.role_candidates` of each pair and writes {(role, pool name): [Candidate, ...]} to
OUT. A fresh interpreter, not a fork (a parent running a solver's or Ray's threads
cannot fork safely) and not `multiprocessing`'s spawn (which re-runs the caller's main script,
so a script without a `__main__` guard would plan recursively).
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

from placer.cost.efficiency import Calibration
from placer.cost.pricer import Pricer
from placer.solve.candidates import role_candidates
from placer.spec.catalog import Resolved


def main(argv: list[str]) -> int:
    src, dst = argv
    work: tuple[Resolved, Calibration, int | None, list[tuple[str, str]]]
    work = pickle.loads(Path(src).read_bytes())  # written by `candidates._priced_apart`
    res, calib, limit, tasks = work
    px = Pricer(res, calib)
    found = {(role, pool): role_candidates(px, role, res.cluster.pool(pool), limit)
             for role, pool in tasks}
    Path(dst).write_bytes(pickle.dumps(found, protocol=pickle.HIGHEST_PROTOCOL))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
