"""The one door for speed: every mechanism that replaces Django's, DRF's or redis-py's own
behaviour for speed, kept because it saves at least 5 % of a keyed payment's CPU
(docs/BENCHMARKS.md: each figure, the command that measured it, and what was removed).

- compiled.py: hot ORM statements compiled once per shape, and a batch of inserts sent
  in one round trip;
- prepared.py and backend/ (the database ENGINE, "fastpath.backend"): registered hot
  statements sent as server-side prepared statements;
- epochs.py: a value in Redis whose change ends trust in a per-process cache (the API
  key cache);
- kicks.py: the outbox relay's after-commit kick, coalesced in Redis;
- replaycache.py: completed responses cached in Redis, for replays that skip PostgreSQL;
- fastredis.py: the Redis client of the request path's own calls (short timeouts);
- shapes.py: a serializer's declared fields copied shallowly where that is safe.

Business code never imports this package: it calls plainly named functions in the door
modules that the import-linter contract in pyproject.toml lists.
"""
