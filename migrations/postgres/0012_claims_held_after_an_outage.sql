-- After an outage a process leaves expired leases alone for one lease (a
-- runner may still be writing the outcome of a job that finished while the
-- database was away). Such a claim runs in a transaction that sets
-- `scheduler.recovery` to `hold`; every other statement sees the rule as
-- before. The same parameters as ever, so every function using the rule
-- keeps calling it, and the planner still inlines it.
CREATE OR REPLACE FUNCTION scheduler_claimable(
    p_state TEXT, p_lease_until TIMESTAMPTZ, p_retry_at TIMESTAMPTZ,
    p_manual BOOLEAN, p_force BOOLEAN)
RETURNS BOOLEAN
LANGUAGE sql STABLE AS $$
    SELECT (p_state = 'running' AND p_lease_until < now()
            AND current_setting('scheduler.recovery', true) IS DISTINCT FROM 'hold')
        OR (p_state = 'released' AND (p_lease_until IS NULL OR p_lease_until < now()))
        OR (p_state = 'failed' AND (p_manual OR p_retry_at <= now()))
        OR (p_state = 'succeeded' AND p_force)
$$;
