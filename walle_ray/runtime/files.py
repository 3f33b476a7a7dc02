"""Files a run writes whole (checkpoints, config.yaml, overrides.yaml, report.json, a rolled-back
metrics.jsonl): written to a temporary file beside the target, fsynced, renamed over it, and
the directory fsynced, so that a crash at any point leaves the old file or the new one.

The temporary file is ``.<name>.tmp-<pid>``. One left by a process that died mid-write (a
checkpoint with its replay can be hundreds of MB) is removed at the next write of that file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write`` with a binary file that becomes ``path`` once it returns; a crash or an
    exception inside it keeps the previous ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = temporary_path(path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """``write_atomic`` for a text file (UTF-8)."""
    return write_atomic(path, lambda f: f.write(text.encode()))


def temporary_path(path: Path, pid: int) -> Path:
    """Where process ``pid`` writes ``path`` before renaming it."""
    return path.with_name(f".{path.name}.tmp-{pid}")


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files of ``path`` whose writer is no longer running; returns them."""
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name}.tmp-") + r"(\d+)")
    removed = []
    if not path.parent.is_dir():
        return removed
    for candidate in path.parent.iterdir():
        match = pattern.fullmatch(candidate.name)
        if match and not pid_running(int(match.group(1))):
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


def pid_running(pid: int) -> bool:
    """Whether a process with this id exists on this machine (it may be another user's)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable. Some systems (Windows) cannot open a
    directory for this; there the rename stands as the system keeps it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
