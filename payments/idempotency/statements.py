"""The idempotency records' SQL that the ORM cannot say (RETURNING, ON CONFLICT, SKIP LOCKED,
the database clock). The claim and the completion, one each per keyed request, are
server-side prepared statements (fastpath.prepared), planned once per connection."""

from fastpath.prepared import prepared_statement_register

# set_config in a MATERIALIZED CTE runs before the INSERT tries its row: the wait on a
# concurrent uncommitted claim of the key is bounded by lock_timeout, in one round trip.
CLAIM_SQL = prepared_statement_register("""
WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', %s, true) AS lock_timeout)
INSERT INTO idempotency_record
    (principal_id, "key", scope, effect, fingerprint, state, fence, lease_expires_at,
     request_id, method, path, minted, created, updated)
SELECT %s, %s, %s, %s, %s, 'in_flight', 1, clock_timestamp() + make_interval(secs => %s::double precision),
       %s, %s, %s, '{}'::jsonb, clock_timestamp(), clock_timestamp()
FROM cfg
ON CONFLICT (principal_id, "key") DO NOTHING
RETURNING id
""")

COMPLETE_SQL = prepared_statement_register("""
UPDATE idempotency_record SET
    state = 'completed', response_status = %s, response_headers = %s::jsonb, response_body = %s,
    minted = %s::jsonb, request_id = %s, completed_at = clock_timestamp(), updated = clock_timestamp(),
    lease_expires_at = NULL
WHERE id = %s AND fence = %s AND state = 'in_flight'
RETURNING created
""")

# A fenced release: one statement, so a takeover that bumps the fence between a read and a
# delete (Django's delete() reads first, since the record has relations) cannot lose its claim.
RELEASE_SQL = "DELETE FROM idempotency_record WHERE id = %s AND fence = %s AND state = 'in_flight'"

# A fenced takeover; with the renew flags set, a brand-new claim (new claim time, no minted ids).
TAKEOVER_SQL = """
UPDATE idempotency_record SET
    state = 'in_flight', fence = fence + 1,
    lease_expires_at = clock_timestamp() + make_interval(secs => %s::double precision),
    fingerprint = %s, request_id = %s, scope = %s, effect = %s, method = %s, path = %s,
    response_status = NULL, response_headers = NULL, response_body = NULL, completed_at = NULL,
    created = CASE WHEN %s THEN clock_timestamp() ELSE created END,
    minted = CASE WHEN %s THEN '{}'::jsonb ELSE minted END,
    updated = clock_timestamp()
WHERE id = %s AND fence = %s AND state = %s
RETURNING fence, minted
"""

# A recovery's takeover of an expired lease (or, with the flag, of a failed_retryable record).
LEASE_TAKEOVER_SQL = """
UPDATE idempotency_record SET
    fence = fence + 1, state = 'in_flight',
    lease_expires_at = clock_timestamp() + make_interval(secs => %s::double precision), updated = clock_timestamp()
WHERE principal_id = %s AND "key" = %s
  AND ((state = 'in_flight' AND lease_expires_at <= clock_timestamp()) OR (%s AND state = 'failed_retryable'))
RETURNING fence, minted, id
"""

# Left by a failed execution; the short lock_timeout keeps it from waiting on a live claim.
FAILED_INSERT_SQL = """
WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', '1000ms', true) AS lock_timeout)
INSERT INTO idempotency_record
    (principal_id, "key", scope, effect, fingerprint, state, fence, lease_expires_at,
     request_id, method, path, minted, created, updated)
SELECT %s, %s, %s, %s, %s, 'failed_retryable', 1, NULL, %s, %s, %s, '{}'::jsonb, clock_timestamp(), clock_timestamp()
FROM cfg
ON CONFLICT (principal_id, "key") DO NOTHING
"""

PURGE_SQL = """
DELETE FROM idempotency_record WHERE id IN (
    SELECT id FROM idempotency_record
    WHERE created < clock_timestamp() - make_interval(secs => %s::double precision) AND state <> 'in_flight'
    ORDER BY created LIMIT %s FOR UPDATE SKIP LOCKED)
"""

# A record with the database's clock: its transaction's start and now, for window decisions.
SNAPSHOT_SQL = """
SELECT id, fingerprint, state, fence, request_id, response_status, response_headers, response_body,
       created, completed_at, lease_expires_at, minted, now(), clock_timestamp()
FROM idempotency_record WHERE principal_id = %s AND "key" = %s
"""
