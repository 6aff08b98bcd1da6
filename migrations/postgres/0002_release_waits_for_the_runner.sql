-- A released claim whose runner has not confirmed that its job stopped
-- (lease_until still set) is claimable only once that lease has run out, and
-- counts against the job's concurrency until then: its runner may be cut off
-- from the database and still running the job. A runner's own release
-- (shutdown) and its confirmation after `scheduler release` clear the lease.
CREATE OR REPLACE FUNCTION scheduler_claim(
    p_key TEXT, p_job TEXT, p_period TEXT, p_start TIMESTAMPTZ, p_end TIMESTAMPTZ,
    p_owner TEXT, p_lease_ms BIGINT, p_trigger TEXT, p_concurrency INTEGER,
    p_force BOOLEAN, p_manual BOOLEAN, p_scheduled_at TIMESTAMPTZ)
RETURNS TABLE (
    o_won BOOLEAN, o_state TEXT, o_attempt INTEGER, o_failures INTEGER, o_trigger TEXT,
    o_owner TEXT, o_lease_until TIMESTAMPTZ, o_retry_at TIMESTAMPTZ,
    o_finished_at TIMESTAMPTZ, o_now TIMESTAMPTZ)
LANGUAGE plpgsql AS $$
DECLARE
    busy INTEGER;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('scheduler_claims:' || p_job, 0));
    -- Two counts, so that each is answered by its partial index.
    SELECT (SELECT count(*) FROM scheduler_claims c
             WHERE c.job = p_job AND c.state = 'running' AND c.lease_until >= now()
               AND c.period_key <> p_key)
         + (SELECT count(*) FROM scheduler_claims c
             WHERE c.job = p_job AND c.state = 'released' AND c.lease_until >= now()
               AND c.period_key <> p_key)
      INTO busy;
    IF busy < p_concurrency THEN
        RETURN QUERY
        WITH claimed AS (
            INSERT INTO scheduler_claims AS c
                (period_key, job, period, period_start, period_end, scheduled_at, state,
                 attempt, failures, trigger, owner, lease_until, started_at)
            VALUES (p_key, p_job, p_period, p_start, p_end, p_scheduled_at, 'running', 1, 0, p_trigger,
                    p_owner, now() + p_lease_ms * interval '1 millisecond', now())
            ON CONFLICT (period_key) DO UPDATE SET
                state = 'running',
                attempt = c.attempt + 1,
                trigger = CASE
                    WHEN p_manual THEN p_trigger
                    WHEN c.state IN ('running', 'released') THEN 'recovery'
                    WHEN c.state = 'failed' THEN 'retry'
                    ELSE p_trigger END,
                owner = excluded.owner,
                lease_until = excluded.lease_until,
                retry_at = NULL,
                started_at = now(),
                finished_at = NULL
            WHERE (c.state = 'running' AND c.lease_until < now())
               OR (c.state = 'released' AND (c.lease_until IS NULL OR c.lease_until < now()))
               OR (c.state = 'failed' AND (p_manual OR c.retry_at <= now()))
               OR (c.state = 'succeeded' AND p_force)
            RETURNING c.*
        ), logged AS (
            INSERT INTO scheduler_attempts
                (period_key, attempt, job, trigger, owner, scheduled_at, started_at, outcome)
            SELECT period_key, attempt, job, trigger, owner, scheduled_at, started_at, 'running'
              FROM claimed
        ), lost AS (
            UPDATE scheduler_attempts a SET outcome = 'lost', finished_at = now()
              FROM claimed
             WHERE a.period_key = claimed.period_key AND a.outcome = 'running'
               AND a.attempt < claimed.attempt
        )
        SELECT TRUE, claimed.state, claimed.attempt, claimed.failures, claimed.trigger,
               claimed.owner, claimed.lease_until, claimed.retry_at, claimed.finished_at, now()
          FROM claimed;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    SELECT FALSE, c.state, c.attempt, c.failures, c.trigger, c.owner, c.lease_until,
           c.retry_at, c.finished_at, now()
      FROM scheduler_claims c WHERE c.period_key = p_key;
    IF NOT FOUND THEN
        RETURN QUERY SELECT FALSE, NULL::TEXT, 0, 0, NULL::TEXT, NULL::TEXT,
            NULL::TIMESTAMPTZ, NULL::TIMESTAMPTZ, NULL::TIMESTAMPTZ, now();
    END IF;
END
$$;
