CREATE OR REPLACE FUNCTION public.scheduler_claim_many(p_keys text[], p_jobs text[], p_periods text[], p_starts timestamp with time zone[], p_ends timestamp with time zone[], p_scheduled timestamp with time zone[], p_triggers text[], p_concurrency integer[], p_force boolean[], p_manual boolean[], p_owner text, p_lease_ms bigint, p_wait boolean)
 RETURNS TABLE(o_ord integer, o_won boolean, o_state text, o_attempt integer, o_failures integer, o_trigger text, o_owner text, o_lease_until timestamp with time zone, o_retry_at timestamp with time zone, o_finished_at timestamp with time zone, o_claimable boolean, o_now timestamp with time zone, o_contended boolean)
 LANGUAGE plpgsql
AS $function$
DECLARE
    -- Per key: answered as it stands, without a lock. A boolean array, so
    -- that `settled[ord]` is one step (the arrays are walked only by unnest:
    -- indexing a text array walks it).
    settled BOOLEAN[];
    -- Per key: its job's lock was held by another transaction (without
    -- `p_wait`).
    contended BOOLEAN[];
    -- The jobs whose locks were held so.
    held TEXT[];
    -- The jobs to lock, in name order; the ones after the first, in the
    -- order they are tried.
    names TEXT[];
    rest TEXT[];
    lock_job TEXT;
    cur scheduler_claims;
    busy BIGINT;
BEGIN
    IF cardinality(p_keys) = 1 THEN
        SELECT c.* INTO cur FROM scheduler_claims c WHERE c.period_key = p_keys[1];
        IF FOUND AND NOT coalesce(scheduler_claimable(cur.state, cur.lease_until, cur.retry_at,
                                                      p_manual[1], p_force[1]), FALSE) THEN
            RETURN QUERY SELECT 1, FALSE, cur.state, cur.attempt, cur.failures, cur.trigger,
                cur.owner, cur.lease_until, cur.retry_at, cur.finished_at, FALSE, now(), FALSE;
            RETURN;
        END IF;
        PERFORM pg_advisory_xact_lock(hashtextextended('scheduler_claims:' || p_jobs[1], 0));
        SELECT c.* INTO cur FROM scheduler_claims c
         WHERE c.period_key = p_keys[1]
           AND scheduler_claimable(c.state, c.lease_until, c.retry_at, p_manual[1], p_force[1])
           FOR UPDATE;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM scheduler_claims c WHERE c.period_key = p_keys[1]) THEN
            -- Taken meanwhile, or changed by the transaction it waited for:
            -- answered as it stands now (a new statement, a new snapshot).
            RETURN QUERY SELECT 1, FALSE, c.state, c.attempt, c.failures, c.trigger, c.owner,
                c.lease_until, c.retry_at, c.finished_at, FALSE, now(), FALSE
              FROM scheduler_claims c WHERE c.period_key = p_keys[1];
            RETURN;
        END IF;
        IF NOT FOUND AND scheduler_split_otherwise(p_keys[1], p_jobs[1], p_starts[1], p_periods[1]) THEN
            -- A new key of a period claimed split another way (a replica
            -- on another `shards`): never taken, answered as waiting for
            -- a slot, which the claimer then asks for as the period was
            -- split.
            RETURN QUERY SELECT 1, FALSE, NULL::TEXT, 0, 0, NULL::TEXT, NULL::TEXT,
                NULL::TIMESTAMPTZ, NULL::TIMESTAMPTZ, NULL::TIMESTAMPTZ, TRUE, now(), FALSE;
            RETURN;
        END IF;
        SELECT (SELECT count(*) FROM scheduler_claims c
                 WHERE c.job = p_jobs[1] AND c.state = 'running' AND c.lease_until >= now())
             + (SELECT count(*) FROM scheduler_claims c
                 WHERE c.job = p_jobs[1] AND c.state = 'released' AND c.lease_until >= now())
          INTO busy;
        IF busy < p_concurrency[1] THEN
            RETURN QUERY SELECT 1, TRUE, t.state, t.attempt, t.failures, t.trigger, t.owner,
                t.lease_until, t.retry_at, t.finished_at, FALSE, now(), FALSE
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
            cur.finished_at, TRUE, now(), FALSE;
        RETURN;
    END IF;

    SELECT array_agg(c.period_key IS NOT NULL AND NOT coalesce(
               scheduler_claimable(c.state, c.lease_until, c.retry_at, k.manual, k.force), FALSE)
             ORDER BY k.ord)
      INTO settled
      FROM unnest(p_keys, p_manual, p_force) WITH ORDINALITY AS k(key, manual, force, ord)
      LEFT JOIN scheduler_claims c ON c.period_key = k.key;
    IF p_wait THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('scheduler_claims:' || name, 0))
           FROM (SELECT DISTINCT k.job COLLATE "C" AS name
                   FROM unnest(p_jobs) WITH ORDINALITY AS k(job, ord)
                  WHERE NOT settled[k.ord]
                  ORDER BY name) AS jobs;
    ELSE
        -- Without waiting: a job whose lock another transaction holds (the
        -- same burst claimed by another replica) has its keys answered
        -- `contended`, to be asked for again.
        -- Each job's lock is tried on its own: a lock held for long (a
        -- stuck transaction) keeps only that job's keys undecided. In name
        -- order; when the first is held, most likely by another replica
        -- claiming the same keys in the same order, the rest are tried
        -- the other way round, so that the two meet once and each takes a
        -- run of the keys, not every other one (which would split the
        -- burst's `sql` groups into small ones).
        SELECT coalesce(array_agg(j.name ORDER BY j.name), '{}') INTO names
          FROM (SELECT DISTINCT k.job COLLATE "C" AS name
                  FROM unnest(p_jobs) WITH ORDINALITY AS k(job, ord)
                 WHERE NOT settled[k.ord]) AS j;
        held := '{}';
        rest := names[2:];
        IF cardinality(names) > 0
           AND NOT pg_try_advisory_xact_lock(hashtextextended('scheduler_claims:' || names[1], 0)) THEN
            held := ARRAY[names[1]];
            SELECT coalesce(array_agg(n ORDER BY n COLLATE "C" DESC), '{}') INTO rest
              FROM unnest(names[2:]) AS n;
        END IF;
        FOREACH lock_job IN ARRAY rest LOOP
            IF NOT pg_try_advisory_xact_lock(hashtextextended('scheduler_claims:' || lock_job, 0)) THEN
                held := held || lock_job;
            END IF;
        END LOOP;
        SELECT array_agg(k.job = ANY(held) ORDER BY k.ord) INTO contended
          FROM unnest(p_jobs) WITH ORDINALITY AS k(job, ord);
        RETURN QUERY
        SELECT k.ord::INTEGER, FALSE, NULL::TEXT, 0, 0, NULL::TEXT, NULL::TEXT,
               NULL::TIMESTAMPTZ, NULL::TIMESTAMPTZ, NULL::TIMESTAMPTZ, FALSE, now(), TRUE
          FROM unnest(p_keys) WITH ORDINALITY AS k(key, ord)
         WHERE NOT settled[k.ord] AND contended[k.ord];
    END IF;
    RETURN QUERY
    SELECT k.ord::INTEGER, FALSE, c.state, c.attempt, c.failures, c.trigger, c.owner,
           c.lease_until, c.retry_at, c.finished_at, FALSE, now(), FALSE
      FROM unnest(p_keys) WITH ORDINALITY AS k(key, ord)
      JOIN scheduler_claims c ON c.period_key = k.key
     WHERE settled[k.ord];
    IF p_wait THEN
        -- A claim that waits also waits for the claimable rows another
        -- transaction holds (an outcome being written, a heartbeat, an
        -- operator's `SELECT … FOR UPDATE`): locked here, in the order
        -- renewals lock them, so that the statement below finds them
        -- mine rather than skipping them.
        PERFORM 1
           FROM scheduler_claims c
           JOIN unnest(p_keys, p_manual, p_force) WITH ORDINALITY AS k(key, manual, force, ord)
             ON c.period_key = k.key
          WHERE NOT settled[k.ord]
            AND scheduler_claimable(c.state, c.lease_until, c.retry_at, k.manual, k.force)
          ORDER BY c.job COLLATE "C", c.period_key COLLATE "C"
            FOR UPDATE OF c;
    END IF;
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
         WHERE NOT settled[k.ord] AND NOT coalesce(contended[k.ord], FALSE)
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
         -- A claimable row this call locked, or a new key of a period not
         -- claimed split another way.
         WHERE m.period_key IS NOT NULL
            OR (NOT EXISTS (SELECT 1 FROM scheduler_claims c WHERE c.period_key = a.key)
                AND NOT scheduler_split_otherwise(a.key, a.job, a.period_start, a.period))
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
           now(),
           -- Claimable but locked by another transaction (only a claim
           -- that does not wait skips such a row): asked for again, never
           -- answered with the state it is being moved out of.
           w.period_key IS NULL AND m.period_key IS NULL AND c.period_key IS NOT NULL
             AND coalesce(scheduler_claimable(c.state, c.lease_until, c.retry_at, a.manual,
                                              a.force), FALSE)
      FROM asked a
      LEFT JOIN claimed w ON w.period_key = a.key
      LEFT JOIN mine m ON m.period_key = a.key
      LEFT JOIN scheduler_claims c ON c.period_key = a.key;
END
$function$
