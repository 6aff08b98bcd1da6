CREATE OR REPLACE FUNCTION public.scheduler_claim_many_asked(p_keys text[], p_jobs text[], p_periods text[], p_starts timestamp with time zone[], p_ends timestamp with time zone[], p_scheduled timestamp with time zone[], p_triggers text[], p_concurrency integer[], p_force boolean[], p_manual boolean[], p_owner text, p_lease_ms bigint, p_wait boolean, p_how text[], p_by text[])
 RETURNS TABLE(o_ord integer, o_won boolean, o_state text, o_attempt integer, o_failures integer, o_trigger text, o_owner text, o_lease_until timestamp with time zone, o_retry_at timestamp with time zone, o_finished_at timestamp with time zone, o_claimable boolean, o_now timestamp with time zone, o_contended boolean)
 LANGUAGE plpgsql
AS $function$
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
$function$
