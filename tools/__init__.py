"""Development tooling: not part of the installed package (see README, Development)."""
