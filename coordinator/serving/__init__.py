"""``tidemark serve``: a read-only Iceberg REST catalog that serves every table at a consistent version.

- ``scope.py``: what a client's version is consistent across (its ``warehouse``), and the URL prefix that carries it;
- ``served_metadata.py``: a table's metadata cut down to the snapshot served (``main`` there, nothing newer);
- ``hold.py``: a client's hold (the version its query reads) and when its next query starts; carried in a cookie;
- ``served_versions.py``: which version each table is served at (groups, pins, holds, never back, ZooKeeper lost);
- ``rest_errors.py``: the REST spec's two error models (the catalog's, OAuth's) as exceptions;
- ``auth.py``: who may read (bearer tokens, OAuth2 client credentials);
- ``server.py``: what each read route answers (credentials only to clients that authenticated and asked), and the
  server's life;
- ``limits.py``, ``asgi.py``: the HTTP layer, a Starlette app run by uvicorn within limits.

docs/design.md, "Serving consistent versions", is the design of record. May import the foundation,
``coordinator.zookeeper``, ``coordinator.iceberg``, ``coordinator.protocol`` and ``coordinator.history``.
"""
