"""Test helper for the sandbox: child cgroups made under the ones this process finds."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from executors import cgroups


@contextlib.contextmanager
def child_cgroups(found: cgroups.Support, tag: str, owner: int | None = None
                  ) -> Iterator[list[str]]:
    """`placer-{tag}-{pid}` under each of `found`'s parents (v2's one, v1's memory and pids),
    handed to `owner` (uid = gid) when given, with its control files; removed afterwards."""
    made: list[str] = []
    try:
        for parent in found.parents.values():
            d = os.path.join(parent, f"placer-{tag}-{os.getpid()}")
            os.mkdir(d)
            made.append(d)
            if owner is not None:
                for name in [".", *os.listdir(d)]:
                    os.chown(os.path.join(d, name), owner, owner)
        yield made
    finally:
        for d in made:
            os.rmdir(d)
