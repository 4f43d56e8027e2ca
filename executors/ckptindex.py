"""`checkpoints/latest.json`: the index naming a run's newest complete checkpoint.

It names the step and the files of that checkpoint (the trainer's, the critic's, the
partial-rollout carry), written atomically after the files themselves. The files are stored
relative to the run's output folder, so a folder copied or moved elsewhere resumes from its own
files; an absolute path (an index written before paths were relative) is read as it is.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from placer.base.fileio import atomic_write_text

FILES = ("actor", "critic", "carry")  # the index's keys that name files


def index_path(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints" / "latest.json"


def _relative(path: str | None, out_dir: Path) -> str | None:
    """`path` relative to `out_dir` when it lies inside it (else as given)."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(out_dir.resolve()))
    except ValueError:
        return path


def write_latest(out_dir: str | Path, step: int, actor: str, critic: str | None,
                 carry: str | None) -> None:
    """Records the checkpoint of `step` (its files already written) as the newest."""
    d = Path(out_dir)
    atomic_write_text(index_path(d), json.dumps(
        {"step": step, **{k: _relative(v, d) for k, v in zip(FILES, (actor, critic, carry))}}))


def read_latest(out_dir: str | Path) -> dict[str, Any]:
    """The index with its file names resolved against `out_dir` (absolute ones kept). Raises
    what reading and parsing raise (OSError, ValueError); a file entry that is not a string is
    left as it is, for the caller's checks."""
    latest = json.loads(index_path(out_dir).read_text())
    if not isinstance(latest, dict):
        raise ValueError("latest.json is not an object")
    for k in FILES:
        v = latest.get(k)
        if isinstance(v, str):
            latest[k] = str(Path(out_dir) / v)  # an absolute `v` stays itself
    return latest
