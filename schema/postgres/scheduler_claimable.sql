CREATE OR REPLACE FUNCTION public.scheduler_claimable(p_state text, p_lease_until timestamp with time zone, p_retry_at timestamp with time zone, p_manual boolean, p_force boolean)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT (p_state = 'running' AND p_lease_until < now()
            AND current_setting('scheduler.recovery', true) IS DISTINCT FROM 'hold')
        OR (p_state = 'released' AND (p_lease_until IS NULL OR p_lease_until < now()))
        OR (p_state = 'failed' AND (p_manual OR p_retry_at <= now()))
        OR (p_state = 'succeeded' AND p_force)
$function$
