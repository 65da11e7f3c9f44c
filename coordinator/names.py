"""Validation of the names and epochs that become znode path segments.

A job, table or reader name is checked before any ZooKeeper path is built from
it, so nothing a user types can escape its znode. Epochs are milliseconds since the
Unix epoch, at most ``MAX_EPOCH_MS`` (the end of year 9999, the last time a clock can show).
"""
from __future__ import annotations

import re
from collections import Counter

from coordinator.errors import InvalidName

MAX_NAME_LENGTH = 200
# Iceberg identifiers are dotted (catalog.namespace.table); ZooKeeper forbids "/" and
# reserves "." and ".."; control characters and unicode oddities make unreadable znodes.
NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"  # a name ``validate_name`` accepts, inside a longer pattern
_ALLOWED = re.compile(rf"^{NAME_PATTERN}\Z")  # \Z: "$" would accept a trailing newline
MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_EPOCH_SEGMENT = re.compile(r"^[0-9]{1,15}\Z")
# ZooKeeper's own rule for path characters (PathUtils.validatePath, on Java's UTF-16: every character
# beyond U+FFFF is a surrogate pair there): what a chroot may contain.
_ZNODE_FORBIDDEN = re.compile("[\u0000-\u001f\u007f-\u009f\ud800-\uf8ff\ufff0-\U0010ffff]")


def validate_name(name: object, kind: str = "name") -> str:
    """Return ``name`` if it is a safe znode segment, else raise ``InvalidName`` saying why."""
    if not isinstance(name, str):
        raise InvalidName(f"{kind} must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidName(f"{kind} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(f"{kind} {name[:40]!r}... is {len(name)} characters; the limit is {MAX_NAME_LENGTH}")
    if ".." in name:
        raise InvalidName(f"{kind} {name!r} contains '..'; use single dots between identifier parts")
    if not _ALLOWED.match(name):
        bad = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9_.\-]", c)})
        shown = ", ".join(repr(c) for c in bad) or "its first character"
        raise InvalidName(
            f"{kind} {name!r} has characters that cannot be used ({shown}); "
            "use letters, digits, '_', '-' and '.' (not first)"
        )
    return name


def validate_names(names: object, kind: str) -> tuple[str, ...]:
    """Validate a list of names, refusing duplicates; returns them as a sorted tuple."""
    if isinstance(names, str) or not hasattr(names, "__iter__"):
        raise InvalidName(f"{kind}s must be a list of names, got {names!r}")
    checked = [validate_name(n, kind) for n in names]
    duplicates = sorted(n for n, count in Counter(checked).items() if count > 1)  # linear: lists of 1,000s
    if duplicates:
        raise InvalidName(f"{kind}s list {', '.join(duplicates)} more than once")
    return tuple(sorted(checked))


def validate_epoch(epoch: object, kind: str = "epoch") -> int:
    """Return ``epoch`` if it is an integer in ``[0, MAX_EPOCH_MS]``, else raise ``InvalidName`` saying why."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH_MS:
        raise InvalidName(f"{kind} must be a time in milliseconds since 1970 (0 to {MAX_EPOCH_MS}), got {epoch!r}")
    return epoch


def parse_epoch(segment: str) -> int | None:
    """The epoch a child znode such as ``/jobs/<job>/epochs/<T>`` names, or None for a name that is not one."""
    if not _EPOCH_SEGMENT.match(segment):
        return None
    epoch = int(segment)
    return epoch if epoch <= MAX_EPOCH_MS else None


def validate_chroot(chroot: str) -> str:
    """Return ``chroot`` (``/a/b``) if ZooKeeper accepts it as a path, else raise ``InvalidName`` saying why."""
    segments = chroot.split("/")[1:]
    if not chroot.startswith("/") or any(seg in ("", ".", "..") for seg in segments) or _ZNODE_FORBIDDEN.search(chroot):
        raise InvalidName(f"chroot {chroot!r} is not a ZooKeeper path: use /name[/name...] without empty, '.' or '..' "
                          "parts and without control characters")
    return chroot
