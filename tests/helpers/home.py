"""Whether the suite touched a directory tree: a snapshot of it before, compared with one after.

    before = snapshot(home, skip=[cache])
    ...
    changes(before, snapshot(home, skip=[cache]))     # ["created /root/.local/share/tidemark", ...]

tests/conftest.py points HOME (and the XDG and Tidemark directories) at a temporary directory for the whole
session, snapshots the real home when the session starts and fails the session if anything there was created,
changed or deleted by the end.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

Snapshot = dict[str, tuple[int, int]]

# A directory is recorded by its existence only: what it holds is recorded entry by entry, and its own mtime
# changes with every entry created or deleted in it, which those entries already say.
DIRECTORY = (-1, -1)

# Toolchains installed in a home: pyenv's or rustup's alone are over 100,000 files, which take seconds to walk
# (30 s with a cold disk cache) while a session's check must take well under a second. The suite never writes
# there, so they are recorded like a directory, by their existence, and not looked into: one the suite created
# is still reported (it was not there before), only a change inside one that was there already goes unseen.
TOOLCHAINS = frozenset({".pyenv", ".rustup", ".cargo", ".npm", ".nvm", ".sdkman", ".conda", ".gradle",
                        ".vscode-server"})


def snapshot(root: Path, skip: Iterable[Path] = ()) -> Snapshot:
    """Every entry under ``root`` (not ``root`` itself): a file's or symlink's path -> (size, mtime_ns), a
    directory's -> ``DIRECTORY``. Symlinks are recorded, not followed; ``skip`` (and everything under it) and
    the contents of the ``TOOLCHAINS`` directly in ``root`` are left out; a ``root`` that does not exist is empty."""
    skipped = {os.path.abspath(path) for path in skip}
    toolchains = {os.path.join(os.path.abspath(root), name) for name in TOOLCHAINS}
    found: Snapshot = {}
    pending = [os.path.abspath(root)]
    while pending:
        try:
            entries = os.scandir(pending.pop())
        except OSError:  # gone meanwhile, or not readable: its contents are not ours to judge
            continue
        with entries:
            for entry in entries:
                if entry.path in skipped:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    found[entry.path] = DIRECTORY
                    if entry.path not in toolchains:
                        pending.append(entry.path)
                    continue
                try:
                    stat = entry.stat(follow_symlinks=False)
                except OSError:  # deleted between the listing and the stat: it is not there
                    continue
                found[entry.path] = (stat.st_size, stat.st_mtime_ns)
    return found


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """``created PATH``, ``changed PATH`` (its size or mtime, or a file became a directory) and ``deleted PATH``,
    sorted by path."""
    return [f"{'created' if path not in before else 'deleted' if path not in after else 'changed'} {path}"
            for path in sorted(before.keys() | after.keys()) if before.get(path) != after.get(path)]
