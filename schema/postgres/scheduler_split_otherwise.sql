CREATE OR REPLACE FUNCTION public.scheduler_split_otherwise(p_key text, p_job text, p_start timestamp with time zone, p_period text)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT EXISTS (SELECT 1 FROM scheduler_claims o
                    WHERE o.job = p_job AND o.period_start = p_start AND o.period = p_period
                      AND scheduler_shard_count(o.period_key) <> scheduler_shard_count(p_key))
$function$
