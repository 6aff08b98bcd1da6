CREATE OR REPLACE FUNCTION public.scheduler_shard_count(p_key text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN strpos(p_key, '#') = 0 THEN 1
                ELSE reverse(split_part(reverse(p_key), '/', 1))::INTEGER END
$function$
