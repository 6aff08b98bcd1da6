CREATE TRIGGER scheduler_claims_attempt_next
AFTER UPDATE OF attempt ON scheduler_claims
BEGIN
    UPDATE scheduler_attempts SET outcome = 'lost', finished_at = NEW.started_at
     WHERE period_key = NEW.period_key AND outcome = 'running' AND attempt < NEW.attempt;
    INSERT INTO scheduler_attempts
        (period_key, attempt, job, trigger, owner, scheduled_at, started_at, outcome)
    VALUES (NEW.period_key, NEW.attempt, NEW.job, NEW.trigger, NEW.owner,
            NEW.scheduled_at, NEW.started_at, 'running');
END
