CREATE TRIGGER scheduler_attempts_outcome
AFTER UPDATE OF outcome ON scheduler_attempts
WHEN OLD.outcome IN ('running', 'released') AND NEW.outcome IN ('succeeded', 'failed')
BEGIN
    UPDATE scheduler_claims
       SET state = NEW.outcome, finished_at = NEW.finished_at, lease_until = NULL,
           failures = failures + (NEW.outcome = 'failed'),
           retry_at = NEW.finished_at + NEW.retry_after
     WHERE period_key = NEW.period_key AND attempt = NEW.attempt
       AND state IN ('running', 'released');
END
