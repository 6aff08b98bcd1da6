CREATE TRIGGER scheduler_claims_attempt_new
AFTER INSERT ON scheduler_claims
BEGIN
    INSERT INTO scheduler_attempts
        (period_key, attempt, job, trigger, owner, scheduled_at, started_at, outcome)
    VALUES (NEW.period_key, NEW.attempt, NEW.job, NEW.trigger, NEW.owner,
            NEW.scheduled_at, NEW.started_at, 'running');
END
