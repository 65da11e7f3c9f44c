"""Runnable examples (``make demo``); not part of the wheel."""
