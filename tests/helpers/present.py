"""``present(x)``: ``x``, asserted not None, so a test reads a field of an Optional result in one expression.

    assert present(EpochLineage(table).committed_progress()).epoch == 2000
"""
from __future__ import annotations

from typing import Optional, TypeVar

T = TypeVar("T")


def present(value: Optional[T], what: str = "the value") -> T:
    assert value is not None, f"{what} is missing"
    return value
