"""The one door for speed: every mechanism that replaces Django's, DRF's or redis-py's own
behaviour for speed, kept because it saves at least 5 % of a keyed payment's CPU
(docs/BENCHMARKS.md: each figure, the command that measured it, and what was removed).

- compiled.py: hot ORM statements compiled once per shape, and new rows sent in one
  round trip (`rows_insert`);
- prepared.py and backend/ (the database ENGINE, "fastpath.backend"): registered hot
  statements sent as server-side prepared statements;
- epochs.py: a value in Redis whose change ends trust in a per-process cache, and that
  cache (`EpochCache`, the API key cache's);
- kicks.py: the outbox relay's after-commit kick, coalesced in Redis;
- counters.py: the throttles' window counters and the request's other reads, in one
  Redis script call;
- replaycache.py: completed responses cached in Redis, for replays that skip PostgreSQL;
- fastredis.py: the Redis client of the request path's own calls (short timeouts);
- shapes.py: a serializer's declared fields copied shallowly where that is safe;
- rediscache.py: Django's Redis cache backend with one redis-py client per pool;
- gcfreeze.py: a web worker's loaded application frozen out of the collector's walks.

Business code never imports this package: it calls plainly named functions in the door
modules that the import-linter contract in pyproject.toml allows; `config` names the
ENGINE, the cache backend and the gunicorn hook by their dotted paths. This package
imports nothing from the apps.
"""
