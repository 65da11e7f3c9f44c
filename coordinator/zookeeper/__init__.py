"""Low-level ZooKeeper: the session (``session``, a facade over ``connect``, ``connection``,
``watchdog``, ``calls``, ``acls`` and ``layout``), compare-and-set retried (``races``), the typed
multi-operations (``ops``), every znode path (``paths``), TLS and credentials (``security``), the
server's clock (``clock``) and batched reads (``multiread``, ``watched``).

Imports only the foundation (``coordinator.errors``, ``names``, ``records``); every other
sub-package builds on it, and nothing here knows a recipe.
"""
