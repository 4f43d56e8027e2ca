"""`python -m bench` (`make bench`): run every benchmark module and print its tables.

Benchmarks print figures (medians and ratios); they never assert a wall-clock threshold.
`python -m bench solver` runs one.
"""
from __future__ import annotations

import importlib
import inspect
import sys
import time

MODULES = ("solver", "fleet", "sim", "faults", "executor", "sandbox", "hostadam", "imageprep")


def main(argv: list[str]) -> int:
    chosen = argv or list(MODULES)
    for name in chosen:
        if name not in MODULES:
            print(f"bench: unknown benchmark {name!r}; choose from {', '.join(MODULES)}",
                  file=sys.stderr)
            return 2
    for name in chosen:
        mod = importlib.import_module(f"bench.bench_{name}")
        print(f"\n== bench {name} ==", flush=True)
        t0 = time.perf_counter()
        fn = mod.main
        fn([]) if inspect.signature(fn).parameters else fn()
        print(f"(bench {name}: {time.perf_counter() - t0:.1f} s wall)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
