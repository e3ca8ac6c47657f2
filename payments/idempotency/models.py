"""Idempotency records."""
