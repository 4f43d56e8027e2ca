"""`python -m placer ...`: the same command line as the `placer` console script."""
from __future__ import annotations

import sys

from placer.cli import main

if __name__ == "__main__":
    sys.exit(main())
