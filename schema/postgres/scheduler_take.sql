CREATE OR REPLACE FUNCTION public.scheduler_take(p_keys text[], p_jobs text[], p_periods text[], p_starts timestamp with time zone[], p_ends timestamp with time zone[], p_scheduled timestamp with time zone[], p_triggers text[], p_manual boolean[], p_prior_states text[], p_prior_attempts integer[], p_owner text, p_lease_ms bigint)
 RETURNS SETOF scheduler_claims
 LANGUAGE plpgsql
AS $function$
DECLARE
    -- After any wait for a row or the job's lock, unlike the statement's
    -- start.
    won_at TIMESTAMPTZ := clock_timestamp();
BEGIN
    RETURN QUERY
    WITH claimed AS (
        INSERT INTO scheduler_claims AS c
            (period_key, job, period, period_start, period_end, scheduled_at, state,
             attempt, failures, trigger, owner, lease_until, started_at)
        SELECT k.key, k.job, k.period, k.period_start, k.period_end, k.scheduled_at, 'running',
               coalesce(k.prior_attempt, 0) + 1, 0,
               CASE WHEN k.manual THEN k.trigger
                    WHEN k.prior_state IN ('running', 'released') THEN 'recovery'
                    WHEN k.prior_state = 'failed' THEN 'retry'
                    ELSE k.trigger END,
               p_owner, won_at + p_lease_ms * interval '1 millisecond', won_at
          FROM unnest(p_keys, p_jobs, p_periods, p_starts, p_ends, p_scheduled, p_triggers,
                      p_manual, p_prior_states, p_prior_attempts)
               AS k(key, job, period, period_start, period_end, scheduled_at, trigger, manual,
                    prior_state, prior_attempt)
         ORDER BY k.job COLLATE "C", k.key COLLATE "C"
        ON CONFLICT (period_key) DO UPDATE SET
            state = 'running',
            attempt = excluded.attempt,
            -- A period an upstream rerun reopened is taken as that rerun
            -- by any claim but a manual one.
            trigger = CASE WHEN c.state = 'released' AND c.trigger = 'upstream'
                                AND excluded.trigger = 'recovery' THEN 'upstream'
                           ELSE excluded.trigger END,
            owner = excluded.owner,
            lease_until = excluded.lease_until,
            retry_at = NULL,
            started_at = won_at,
            finished_at = NULL
        WHERE c.attempt + 1 = excluded.attempt
        RETURNING c.*
    ), logged AS (
        INSERT INTO scheduler_attempts
            (period_key, attempt, job, trigger, owner, scheduled_at, started_at, outcome)
        SELECT period_key, attempt, job, trigger, owner, scheduled_at, started_at, 'running'
          FROM claimed
    ), lost AS (
        UPDATE scheduler_attempts a SET outcome = 'lost', finished_at = won_at
          FROM claimed
         WHERE a.period_key = claimed.period_key AND a.outcome = 'running'
           AND a.attempt < claimed.attempt
    )
    SELECT * FROM claimed;
END
$function$
