-- A manual claim writes how and by whom it was asked for on the attempts it
-- won, in the claim's own statement: one round trip and one commit, where it
-- was four round trips (begin, claim, note, commit). A serial backfill pays
-- that on every period. `p_how` and `p_by` are per key, NULL for a key asked
-- for by nobody.
CREATE FUNCTION scheduler_claim_many_asked(
    p_keys TEXT[], p_jobs TEXT[], p_periods TEXT[], p_starts TIMESTAMPTZ[],
    p_ends TIMESTAMPTZ[], p_scheduled TIMESTAMPTZ[], p_triggers TEXT[],
    p_concurrency INTEGER[], p_force BOOLEAN[], p_manual BOOLEAN[],
    p_owner TEXT, p_lease_ms BIGINT, p_wait BOOLEAN, p_how TEXT[], p_by TEXT[])
RETURNS TABLE (
    o_ord INTEGER, o_won BOOLEAN, o_state TEXT, o_attempt INTEGER, o_failures INTEGER,
    o_trigger TEXT, o_owner TEXT, o_lease_until TIMESTAMPTZ, o_retry_at TIMESTAMPTZ,
    o_finished_at TIMESTAMPTZ, o_claimable BOOLEAN, o_now TIMESTAMPTZ,
    o_contended BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
    -- The keys won that somebody asked for, by position, and their attempts.
    noted INTEGER[] := '{}';
    attempts INTEGER[] := '{}';
BEGIN
    FOR r IN SELECT * FROM scheduler_claim_many(p_keys, p_jobs, p_periods, p_starts, p_ends,
                 p_scheduled, p_triggers, p_concurrency, p_force, p_manual, p_owner,
                 p_lease_ms, p_wait)
    LOOP
        IF r.o_won AND p_how[r.o_ord] IS NOT NULL THEN
            noted := noted || r.o_ord;
            attempts := attempts || r.o_attempt;
        END IF;
        o_ord := r.o_ord;
        o_won := r.o_won;
        o_state := r.o_state;
        o_attempt := r.o_attempt;
        o_failures := r.o_failures;
        o_trigger := r.o_trigger;
        o_owner := r.o_owner;
        o_lease_until := r.o_lease_until;
        o_retry_at := r.o_retry_at;
        o_finished_at := r.o_finished_at;
        o_claimable := r.o_claimable;
        o_now := r.o_now;
        o_contended := r.o_contended;
        RETURN NEXT;
    END LOOP;
    -- A later statement of the same transaction: it sees the attempts the
    -- claim wrote.
    UPDATE scheduler_attempts a SET asked = k.how, requested_by = k.by
      FROM unnest(p_keys, p_how, p_by) WITH ORDINALITY AS k(key, how, by, ord)
      JOIN unnest(noted, attempts) AS w(ord, attempt) ON w.ord = k.ord
     WHERE a.period_key = k.key AND a.attempt = w.attempt;
END
$$;
