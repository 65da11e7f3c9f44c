"""Low-level ZooKeeper: the session (connect, deadline-bounded reads, writes and multis), the typed
multi-operations, every znode path, and ACLs and TLS.

Imports only the foundation (``coordinator.errors``, ``names``, ``records``); every other
sub-package builds on it, and nothing here knows a recipe.
"""
