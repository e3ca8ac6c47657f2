"""The one door for speed: every mechanism that replaces Django's, DRF's or redis-py's own
behaviour for speed, kept because it saves at least 5 % of a keyed payment's CPU
(docs/BENCHMARKS.md: each figure, the command that measured it, and what was removed).
Business code never imports this package, only the door modules the import-linter contract
in pyproject.toml allows (docs/ARCHITECTURE.md); it imports nothing from the apps.
"""
