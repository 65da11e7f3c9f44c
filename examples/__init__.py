"""Examples that run against the embedded defaults (``make demo``); not part of the installed package."""
