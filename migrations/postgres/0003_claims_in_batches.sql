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

-- Takes the given keys: inserts each new one, or takes over the row at
-- `p_prior_attempts` (which the caller has locked and found claimable), and
-- writes the attempt rows. A key inserted meanwhile by anyone else, or a row
-- no longer at that attempt, is left alone. Rows in (job, key) order, as
-- every claim and renewal locks them.
CREATE FUNCTION scheduler_take(
    p_keys TEXT[], p_jobs TEXT[], p_periods TEXT[], p_starts TIMESTAMPTZ[],
    p_ends TIMESTAMPTZ[], p_scheduled TIMESTAMPTZ[], p_triggers TEXT[], p_manual BOOLEAN[],
    p_prior_states TEXT[], p_prior_attempts INTEGER[], p_owner TEXT, p_lease_ms BIGINT)
RETURNS SETOF scheduler_claims
-- PL/pgSQL, whose plans are kept per session; an SQL function's would be
-- made again on every call.
LANGUAGE plpgsql AS $$
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
               p_owner, now() + p_lease_ms * interval '1 millisecond', now()
          FROM unnest(p_keys, p_jobs, p_periods, p_starts, p_ends, p_scheduled, p_triggers,
                      p_manual, p_prior_states, p_prior_attempts)
               AS k(key, job, period, period_start, period_end, scheduled_at, trigger, manual,
                    prior_state, prior_attempt)
         ORDER BY k.job COLLATE "C", k.key COLLATE "C"
        ON CONFLICT (period_key) DO UPDATE SET
            state = 'running',
            attempt = excluded.attempt,
            trigger = excluded.trigger,
            owner = excluded.owner,
            lease_until = excluded.lease_until,
            retry_at = NULL,
            started_at = now(),
            finished_at = NULL
        WHERE c.attempt + 1 = excluded.attempt
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
    SELECT * FROM claimed;
END
$$;

-- Many claims in one call: one round trip and one commit for a whole burst.
-- Each key is decided as a claim of its own would be: the primary key, the
-- claimable rule, the job's concurrency (counting the live claims and, in
-- key order, what this call claims before it), the attempt rows. Keys whose
-- claim cannot be taken now are answered as they stand, without a lock.
-- For the rest, every job's lock is taken first, in name order; then their
-- claimable rows are locked in (job, key) order, as renewals lock them, so
-- calls racing over the same keys wait for each other rather than deadlock.
-- A row locked elsewhere (an sql group holding its claim) is reported as it
-- stands rather than waited for. The result has one row per key; `o_ord` is
-- its place in the arrays. One key (a single fire, a step of a backfill)
-- takes a path of plain statements, which plan and run faster.
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
    -- Per key: answered as it stands, without a lock. A boolean array, so
    -- that `settled[ord]` is one step (the arrays are walked only by unnest:
    -- indexing a text array walks it).
    settled BOOLEAN[];
    cur scheduler_claims;
    busy BIGINT;
BEGIN
    IF cardinality(p_keys) = 1 THEN
        SELECT c.* INTO cur FROM scheduler_claims c WHERE c.period_key = p_keys[1];
        IF FOUND AND NOT coalesce(scheduler_claimable(cur.state, cur.lease_until, cur.retry_at,
                                                      p_manual[1], p_force[1]), FALSE) THEN
            RETURN QUERY SELECT 1, FALSE, cur.state, cur.attempt, cur.failures, cur.trigger,
                cur.owner, cur.lease_until, cur.retry_at, cur.finished_at, FALSE, now();
            RETURN;
        END IF;
        PERFORM pg_advisory_xact_lock(hashtextextended('scheduler_claims:' || p_jobs[1], 0));
        SELECT c.* INTO cur FROM scheduler_claims c
         WHERE c.period_key = p_keys[1]
           AND scheduler_claimable(c.state, c.lease_until, c.retry_at, p_manual[1], p_force[1])
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM scheduler_claims c WHERE c.period_key = p_keys[1]) THEN
            -- Taken meanwhile, or locked elsewhere.
            RETURN QUERY SELECT 1, FALSE, c.state, c.attempt, c.failures, c.trigger, c.owner,
                c.lease_until, c.retry_at, c.finished_at, FALSE, now()
              FROM scheduler_claims c WHERE c.period_key = p_keys[1];
            RETURN;
        END IF;
        SELECT (SELECT count(*) FROM scheduler_claims c
                 WHERE c.job = p_jobs[1] AND c.state = 'running' AND c.lease_until >= now())
             + (SELECT count(*) FROM scheduler_claims c
                 WHERE c.job = p_jobs[1] AND c.state = 'released' AND c.lease_until >= now())
          INTO busy;
        IF busy < p_concurrency[1] THEN
            RETURN QUERY SELECT 1, TRUE, t.state, t.attempt, t.failures, t.trigger, t.owner,
                t.lease_until, t.retry_at, t.finished_at, FALSE, now()
              FROM scheduler_take(p_keys, p_jobs, p_periods, p_starts, p_ends, p_scheduled,
                   p_triggers, p_manual, ARRAY[cur.state], ARRAY[cur.attempt], p_owner,
                   p_lease_ms) AS t;
            IF FOUND THEN
                RETURN;
            END IF;
        END IF;
        -- Claimable, but no concurrency slot is free.
        RETURN QUERY SELECT 1, FALSE, cur.state, coalesce(cur.attempt, 0),
            coalesce(cur.failures, 0), cur.trigger, cur.owner, cur.lease_until, cur.retry_at,
            cur.finished_at, TRUE, now();
        RETURN;
    END IF;

    SELECT array_agg(c.period_key IS NOT NULL AND NOT coalesce(
               scheduler_claimable(c.state, c.lease_until, c.retry_at, k.manual, k.force), FALSE)
             ORDER BY k.ord)
      INTO settled
      FROM unnest(p_keys, p_manual, p_force) WITH ORDINALITY AS k(key, manual, force, ord)
      LEFT JOIN scheduler_claims c ON c.period_key = k.key;
    PERFORM pg_advisory_xact_lock(hashtextextended('scheduler_claims:' || name, 0))
       FROM (SELECT DISTINCT k.job COLLATE "C" AS name
               FROM unnest(p_jobs) WITH ORDINALITY AS k(job, ord)
              WHERE NOT settled[k.ord]
              ORDER BY name) AS jobs;
    RETURN QUERY
    SELECT k.ord::INTEGER, FALSE, c.state, c.attempt, c.failures, c.trigger, c.owner,
           c.lease_until, c.retry_at, c.finished_at, FALSE, now()
      FROM unnest(p_keys) WITH ORDINALITY AS k(key, ord)
      JOIN scheduler_claims c ON c.period_key = k.key
     WHERE settled[k.ord];
    -- A new statement, so its snapshot sees every claim committed before
    -- the locks were granted.
    RETURN QUERY
    WITH asked AS (
        SELECT k.ord::INTEGER AS ord, k.key, k.job, k.period, k.period_start, k.period_end,
               k.scheduled_at, k.trigger, k.concurrency, k.force, k.manual
          FROM unnest(p_keys, p_jobs, p_periods, p_starts, p_ends, p_scheduled, p_triggers,
                      p_concurrency, p_force, p_manual) WITH ORDINALITY
               AS k(key, job, period, period_start, period_end, scheduled_at, trigger,
                    concurrency, force, manual, ord)
         WHERE NOT settled[k.ord]
    ), mine AS (
        -- The claimable rows, locked; one locked elsewhere is skipped.
        SELECT c.period_key, c.state, c.attempt
          FROM scheduler_claims c JOIN asked a ON c.period_key = a.key
         WHERE scheduler_claimable(c.state, c.lease_until, c.retry_at, a.manual, a.force)
         ORDER BY c.job COLLATE "C", c.period_key COLLATE "C"
           FOR UPDATE OF c SKIP LOCKED
    ), busy AS (
        -- Live claims; a released one still holding its lease may still
        -- run. Two scans, each answered by its partial index.
        SELECT l.job, count(*) AS n FROM (
            SELECT c.job FROM scheduler_claims c
             WHERE c.job IN (SELECT job FROM asked) AND c.state = 'running'
               AND c.lease_until >= now()
            UNION ALL
            SELECT c.job FROM scheduler_claims c
             WHERE c.job IN (SELECT job FROM asked) AND c.state = 'released'
               AND c.lease_until >= now()
        ) AS l GROUP BY l.job
    ), candidates AS (
        SELECT a.*, m.state AS prior_state, m.attempt AS prior_attempt,
               row_number() OVER (PARTITION BY a.job ORDER BY a.key COLLATE "C") AS rank
          FROM asked a LEFT JOIN mine m ON m.period_key = a.key
         -- A claimable row this call locked, or a new key.
         WHERE m.period_key IS NOT NULL
            OR NOT EXISTS (SELECT 1 FROM scheduler_claims c WHERE c.period_key = a.key)
    ), allowed AS (
        SELECT array_agg(c.key) AS keys, array_agg(c.job) AS jobs,
               array_agg(c.period) AS periods, array_agg(c.period_start) AS starts,
               array_agg(c.period_end) AS ends, array_agg(c.scheduled_at) AS scheduled,
               array_agg(c.trigger) AS triggers, array_agg(c.manual) AS manual,
               array_agg(c.prior_state) AS prior_states,
               array_agg(c.prior_attempt) AS prior_attempts
          FROM candidates c LEFT JOIN busy b ON b.job = c.job
         WHERE coalesce(b.n, 0) + c.rank <= c.concurrency
    ), claimed AS (
        SELECT t.* FROM allowed a,
               LATERAL scheduler_take(a.keys, a.jobs, a.periods, a.starts, a.ends, a.scheduled,
                                      a.triggers, a.manual, a.prior_states, a.prior_attempts,
                                      p_owner, p_lease_ms) AS t
         WHERE a.keys IS NOT NULL
    )
    SELECT a.ord, w.period_key IS NOT NULL,
           coalesce(w.state, c.state), coalesce(w.attempt, c.attempt, 0),
           coalesce(w.failures, c.failures, 0), coalesce(w.trigger, c.trigger),
           coalesce(w.owner, c.owner),
           CASE WHEN w.period_key IS NOT NULL THEN w.lease_until ELSE c.lease_until END,
           CASE WHEN w.period_key IS NOT NULL THEN w.retry_at ELSE c.retry_at END,
           CASE WHEN w.period_key IS NOT NULL THEN w.finished_at ELSE c.finished_at END,
           -- Not won but claimable: no concurrency slot was free.
           w.period_key IS NULL AND (c.period_key IS NULL OR m.period_key IS NOT NULL),
           now()
      FROM asked a
      LEFT JOIN claimed w ON w.period_key = a.key
      LEFT JOIN mine m ON m.period_key = a.key
      LEFT JOIN scheduler_claims c ON c.period_key = a.key;
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
