"""Removing what DeltaServe processes that no longer run left behind: shared-memory segments and temp folders.

A process killed with SIGKILL (or the OOM killer) cannot unlink its ``/dev/shm`` segments
(``deltaserve-<pid>-<hex>.bin``, see :mod:`.activation_buffer`) or remove its temp folders
(``deltaserve-<kind>-<pid>-<suffix>``, made by :func:`make_temp_dir`); over restarts they fill ``/dev/shm`` and
``/tmp``. Every server start calls :func:`clean_stale_files`, and names carry their creator's pid so that only
files of processes that are gone are removed (never a live server's, even one of another job).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

__all__ = ["clean_stale_files", "make_temp_dir", "pid_alive"]

log = logging.getLogger("deltaserve.cleanup")

_SHM_NAME = re.compile(r"^deltaserve-(\d+)-[0-9a-f]+\.bin$")
_TEMP_NAME = re.compile(r"^deltaserve-[a-z0-9]+-(\d+)-")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one owned by another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make_temp_dir(kind: str) -> Path:
    """A temp folder for this process, named so that :func:`clean_stale_files` can tell when it is orphaned."""
    return Path(tempfile.mkdtemp(prefix=f"deltaserve-{kind}-{os.getpid()}-"))


def clean_stale_files(shm_dir: str | os.PathLike[str] | None = None,
                      temp_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove shared-memory segments and temp folders whose creating process is gone; returns what was removed."""
    from .shared_memory import shm_dir as default_shm_dir

    removed: list[Path] = []
    for root, pattern in ((Path(shm_dir) if shm_dir else default_shm_dir(), _SHM_NAME),
                          (Path(temp_dir or tempfile.gettempdir()), _TEMP_NAME)):
        try:
            children = list(root.iterdir())
        except OSError:
            continue
        for child in children:
            m = pattern.match(child.name)
            if m is None or pid_alive(int(m.group(1))):
                continue
            try:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            except OSError as exc:  # another user's, or removed meanwhile
                log.debug("could not remove stale %s: %s", child, exc)
                continue
            removed.append(child)
    if removed:
        log.info("removed %d files left by DeltaServe processes that are gone (shared memory, temp folders)",
                 len(removed))
    return removed
