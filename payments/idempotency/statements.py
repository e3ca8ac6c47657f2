"""The idempotency record's claim and completion, one each per keyed request: sent as
server-side prepared statements (fastpath.prepared), parsed and planned once per
connection."""

from fastpath.prepared import prepared_statement_register

# set_config in a MATERIALIZED CTE runs before the INSERT tries its row, so the wait on
# a concurrent uncommitted claim of the same key is bounded by lock_timeout, in one
# round trip.
CLAIM_SQL = prepared_statement_register("""
WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', %s, true) AS lock_timeout)
INSERT INTO idempotency_record
    (principal_id, "key", scope, effect, fingerprint, state, fence, lease_expires_at,
     request_id, method, path, minted, created, updated)
SELECT %s, %s, %s, %s, %s, 'in_flight', 1, clock_timestamp() + make_interval(secs => %s::double precision),
       %s, %s, %s, '{}'::jsonb, clock_timestamp(), clock_timestamp()
FROM cfg
ON CONFLICT (principal_id, "key") DO NOTHING
RETURNING id, created
""")

COMPLETE_SQL = prepared_statement_register("""
UPDATE idempotency_record SET
    state = 'completed', response_status = %s, response_headers = %s::jsonb, response_body = %s,
    minted = %s::jsonb, request_id = %s, completed_at = clock_timestamp(), updated = clock_timestamp(),
    lease_expires_at = NULL
WHERE id = %s AND fence = %s AND state = 'in_flight'
RETURNING created
""")
