-- Which claims can be taken again: the rule, written once. A claim whose
-- lease ran out, a released one whose runner confirmed the stop (or whose
-- lease ran out), a failed one whose retry is due (any failed one for a
-- manual run) and, with force, a succeeded one. A plain SQL function, so the
-- planner inlines it and a query using it still finds the partial indexes.
CREATE FUNCTION scheduler_claimable(
    p_state TEXT, p_lease_until TIMESTAMPTZ, p_retry_at TIMESTAMPTZ,
    p_manual BOOLEAN, p_force BOOLEAN)
RETURNS BOOLEAN
LANGUAGE sql STABLE AS $$
    SELECT (p_state = 'running' AND p_lease_until < now())
        OR (p_state = 'released' AND (p_lease_until IS NULL OR p_lease_until < now()))
        OR (p_state = 'failed' AND (p_manual OR p_retry_at <= now()))
        OR (p_state = 'succeeded' AND p_force)
$$;

-- Many claims in one call: one round trip and one commit for a whole burst.
-- Each key is decided as a claim of its own (the primary key, the
-- concurrency count that includes what this call claimed before it, the
-- attempt rows). Every job's lock is taken first, in name order, then the
-- keys in byte order: calls racing over the same keys wait for each other
-- rather than deadlock. The result has one row per key, in `o_ord`, the
-- key's place in the arrays.
CREATE FUNCTION scheduler_claim_many(
    p_keys TEXT[], p_jobs TEXT[], p_periods TEXT[], p_starts TIMESTAMPTZ[],
    p_ends TIMESTAMPTZ[], p_scheduled TIMESTAMPTZ[], p_triggers TEXT[],
    p_concurrency INTEGER[], p_force BOOLEAN[], p_manual BOOLEAN[],
    p_owner TEXT, p_lease_ms BIGINT)
RETURNS TABLE (
    o_ord INTEGER, o_won BOOLEAN, o_state TEXT, o_attempt INTEGER, o_failures INTEGER,
    o_trigger TEXT, o_owner TEXT, o_lease_until TIMESTAMPTZ, o_retry_at TIMESTAMPTZ,
    o_finished_at TIMESTAMPTZ, o_claimable BOOLEAN, o_now TIMESTAMPTZ)
LANGUAGE plpgsql AS $$
DECLARE
    i INTEGER;
    v_job TEXT := NULL;
    busy INTEGER := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('scheduler_claims:' || name, 0))
       FROM (SELECT DISTINCT j COLLATE "C" AS name FROM unnest(p_jobs) AS j ORDER BY name) AS jobs;
    FOR i IN SELECT k.ord FROM unnest(p_keys) WITH ORDINALITY AS k(key, ord)
              ORDER BY p_jobs[k.ord] COLLATE "C", k.key COLLATE "C" LOOP
        IF v_job IS DISTINCT FROM p_jobs[i] THEN
            v_job := p_jobs[i];
            -- Two counts, so that each is answered by its partial index. A
            -- released claim still holding its lease may still be running.
            SELECT (SELECT count(*) FROM scheduler_claims c
                     WHERE c.job = p_jobs[i] AND c.state = 'running' AND c.lease_until >= now())
                 + (SELECT count(*) FROM scheduler_claims c
                     WHERE c.job = p_jobs[i] AND c.state = 'released' AND c.lease_until >= now())
              INTO busy;
        END IF;
        -- A row locked elsewhere (an sql group committing its outcome, a
        -- claim racing this one) is reported as it stands rather than
        -- waited for: a long statement must not stall a whole batch.
        PERFORM 1 FROM scheduler_claims c WHERE c.period_key = p_keys[i];
        IF FOUND THEN
            PERFORM 1 FROM scheduler_claims c WHERE c.period_key = p_keys[i]
                FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                RETURN QUERY
                SELECT i, FALSE, c.state, c.attempt, c.failures, c.trigger, c.owner,
                       c.lease_until, c.retry_at, c.finished_at, FALSE, now()
                  FROM scheduler_claims c WHERE c.period_key = p_keys[i];
                CONTINUE;
            END IF;
        END IF;
        -- A key counted in `busy` is live, so not claimable: counting it
        -- changes no answer.
        IF busy < p_concurrency[i] THEN
            RETURN QUERY
            WITH claimed AS (
                INSERT INTO scheduler_claims AS c
                    (period_key, job, period, period_start, period_end, scheduled_at, state,
                     attempt, failures, trigger, owner, lease_until, started_at)
                VALUES (p_keys[i], p_jobs[i], p_periods[i], p_starts[i], p_ends[i], p_scheduled[i],
                        'running', 1, 0, p_triggers[i], p_owner,
                        now() + p_lease_ms * interval '1 millisecond', now())
                ON CONFLICT (period_key) DO UPDATE SET
                    state = 'running',
                    attempt = c.attempt + 1,
                    trigger = CASE
                        WHEN p_manual[i] THEN p_triggers[i]
                        WHEN c.state IN ('running', 'released') THEN 'recovery'
                        WHEN c.state = 'failed' THEN 'retry'
                        ELSE p_triggers[i] END,
                    owner = excluded.owner,
                    lease_until = excluded.lease_until,
                    retry_at = NULL,
                    started_at = now(),
                    finished_at = NULL
                WHERE scheduler_claimable(c.state, c.lease_until, c.retry_at, p_manual[i], p_force[i])
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
            SELECT i, TRUE, claimed.state, claimed.attempt, claimed.failures, claimed.trigger,
                   claimed.owner, claimed.lease_until, claimed.retry_at, claimed.finished_at,
                   FALSE, now()
              FROM claimed;
            IF FOUND THEN
                busy := busy + 1;
                CONTINUE;
            END IF;
        END IF;
        RETURN QUERY
        SELECT i, FALSE, c.state, c.attempt, c.failures, c.trigger, c.owner, c.lease_until,
               c.retry_at, c.finished_at,
               scheduler_claimable(c.state, c.lease_until, c.retry_at, p_manual[i], p_force[i]),
               now()
          FROM scheduler_claims c WHERE c.period_key = p_keys[i];
        IF NOT FOUND THEN
            RETURN QUERY SELECT i, FALSE, NULL::TEXT, 0, 0, NULL::TEXT, NULL::TEXT,
                NULL::TIMESTAMPTZ, NULL::TIMESTAMPTZ, NULL::TIMESTAMPTZ, TRUE, now();
        END IF;
    END LOOP;
END
$$;

-- The one-key claim of earlier versions, kept for replicas not yet
-- upgraded: a batch of one.
CREATE OR REPLACE FUNCTION scheduler_claim(
    p_key TEXT, p_job TEXT, p_period TEXT, p_start TIMESTAMPTZ, p_end TIMESTAMPTZ,
    p_owner TEXT, p_lease_ms BIGINT, p_trigger TEXT, p_concurrency INTEGER,
    p_force BOOLEAN, p_manual BOOLEAN, p_scheduled_at TIMESTAMPTZ)
RETURNS TABLE (
    o_won BOOLEAN, o_state TEXT, o_attempt INTEGER, o_failures INTEGER, o_trigger TEXT,
    o_owner TEXT, o_lease_until TIMESTAMPTZ, o_retry_at TIMESTAMPTZ,
    o_finished_at TIMESTAMPTZ, o_now TIMESTAMPTZ)
LANGUAGE sql AS $$
    SELECT o_won, o_state, o_attempt, o_failures, o_trigger, o_owner, o_lease_until,
           o_retry_at, o_finished_at, o_now
      FROM scheduler_claim_many(ARRAY[p_key], ARRAY[p_job], ARRAY[p_period], ARRAY[p_start],
           ARRAY[p_end], ARRAY[p_scheduled_at], ARRAY[p_trigger], ARRAY[p_concurrency],
           ARRAY[p_force], ARRAY[p_manual], p_owner, p_lease_ms)
$$;
