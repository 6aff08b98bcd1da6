CREATE OR REPLACE FUNCTION public.scheduler_waiting_wake()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE scheduler_waiting SET ready = TRUE WHERE watch = NEW.period_key AND NOT ready;
    RETURN NULL;
END
$function$
