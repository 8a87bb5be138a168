"""The SQLite store's files readable by their owner only: every message body is in them.

A new store is created mode 0600 in a folder made 0700 (SQLite gives its ``-wal`` and ``-shm`` files the mode of the
database file), as the local copy of the blocks is. An existing store that others can read is left as it is (its
owner may share it on purpose) and named in a warning at start, with the command that closes it.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

logger = logging.getLogger("prefect_webhooks.store")

OWNER_ONLY = 0o600
_warned: set[Path] = set()


def prepare_store_file(path: Path) -> None:
    """Create the store file ``path`` owner-only if it does not exist yet; warn once if it exists and is open to
    others."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, OWNER_ONLY)
    except FileExistsError:
        warn_if_open_to_others(path)
        return
    os.close(descriptor)


def warn_if_open_to_others(path: Path) -> None:
    """Log a warning (once per process and file) when the group or other users can read or write ``path``."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077 and path not in _warned:
        _warned.add(path)
        logger.warning("the store %s holds every message body and is open to other users of this machine (mode %s); "
                       "to make it the owner's only: chmod 600 %s*", path, oct(mode)[2:], path)
