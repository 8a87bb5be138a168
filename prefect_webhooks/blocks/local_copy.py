"""The local copy of saved blocks: what a process needs to deliver and to accept events while Prefect is down.

A process that starts while the Prefect API cannot be reached has no block to load. Each process therefore keeps
what it last loaded in ``<home>/local-copy/`` (``PREFECT_WEBHOOKS_HOME``, ``~/.prefect-webhooks`` by default):

- ``destinations.json``: each destination block's fields **with its secrets** (shared and previous secret, header
  values), which sending needs: the folder is created mode 0700 and the file 0600, owned by the user running
  ``serve``; a copy that other users could read, or that another user owns, is refused (a warning names the file and
  its mode). Nothing of it is ever logged; errors name the file, never a value.
- ``sources.json``: each source's destinations, whether it is enabled and the **SHA-256 of its write key** (the
  key itself is never written: the ingest API looks keys up by that hash).

Every load that changed something rewrites the file atomically (a temporary file in the same folder, then a rename)
under an exclusive lock, so the processes of one host (ingest workers, delivery workers) can share it. A block
deleted in Prefect leaves the copy. ``PREFECT_WEBHOOKS_LOCAL_COPY=false`` keeps nothing on disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prefect_webhooks.settings import get_settings

try:
    import fcntl
except ImportError:  # Windows: one writer at a time is not enforced
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("prefect_webhooks.local_copy")

FOLDER_NAME = "local-copy"
FORMAT_VERSION = 1


def local_copy_folder() -> Path:
    """``<home>/local-copy``: where the local copies live."""
    return get_settings().store.home / FOLDER_NAME


class LocalCopy:
    """One file of the local copy: entries by block name."""

    def __init__(self, name: str, folder: Path | None = None, *, enabled: bool | None = None) -> None:
        self.name = name
        self.folder = folder or local_copy_folder()
        self.enabled = get_settings().outage.local_copy if enabled is None else enabled
        self._refused = False

    @property
    def path(self) -> Path:
        """The file: ``<folder>/<name>.json``."""
        return self.folder / f"{self.name}.json"

    def __repr__(self) -> str:
        return f"LocalCopy({str(self.path)!r})"

    def read(self) -> dict[str, dict[str, Any]]:
        """Every entry of the copy; empty when there is none, when it is turned off or when it cannot be trusted."""
        if not self.enabled:
            return {}
        try:
            status = self.path.stat()
        except FileNotFoundError:
            return {}
        if not self._private(status):
            return {}
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
            entries = document["entries"]
            if document.get("version") != FORMAT_VERSION or not isinstance(entries, dict):
                raise ValueError("unknown format")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring the local copy %s: it cannot be read (%s)", self.path, type(exc).__name__)
            return {}
        return {name: entry for name, entry in entries.items() if isinstance(entry, dict)}

    def update(self, changes: Mapping[str, dict[str, Any] | None]) -> None:
        """Set (or, for None, remove) entries by name; the file is rewritten only when something changed."""
        if changes:
            self._rewrite(lambda entries: {**entries, **changes})

    def take(self, name: str) -> dict[str, Any] | None:
        """Remove the entry ``name`` and return it; None when it is not there (another process took it)."""
        taken: list[dict[str, Any]] = []

        def without(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
            if name in entries:
                taken.append(entries.pop(name))
            return entries

        self._rewrite(without)
        return taken[0] if taken else None

    def replace(self, entries: Mapping[str, dict[str, Any]]) -> None:
        """Make the copy hold exactly ``entries`` (rewritten only when that changes something)."""
        self._rewrite(lambda _entries: dict(entries))

    def _rewrite(self, change: Callable[[dict[str, dict[str, Any]]], Mapping[str, dict[str, Any] | None]]) -> None:
        if not self.enabled:
            return
        try:
            with self._locked():
                before = self.read()
                after = {name: entry for name, entry in change(before).items() if entry is not None}
                if after != before:
                    self._write(after)
        except OSError as exc:
            # Only a fallback for an outage: delivery and ingest go on without it.
            logger.warning("could not update the local copy %s: %s", self.path, type(exc).__name__)

    def _private(self, status: os.stat_result) -> bool:
        """Whether the file is this user's and nobody else can read it (checked where the OS has owners)."""
        if not hasattr(os, "geteuid"):
            return True
        if status.st_uid == os.geteuid() and not status.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            return True
        if not self._refused:
            self._refused = True
            logger.warning("ignoring the local copy %s: mode %s, owner uid %d; it must be the user's own and mode "
                           "0600", self.path, oct(stat.S_IMODE(status.st_mode)), status.st_uid)
        return False

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.folder, 0o700)
        with open(self.folder / f".{self.name}.lock", "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        descriptor, temporary = tempfile.mkstemp(dir=self.folder, prefix=f".{self.name}.", suffix=".tmp")
        try:
            # mkstemp creates the file 0600; the rename keeps that mode.
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump({"version": FORMAT_VERSION, "entries": entries}, handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
