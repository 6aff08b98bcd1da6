CREATE TRIGGER scheduler_claims_wake
AFTER UPDATE OF state ON scheduler_claims
WHEN NEW.state = 'succeeded'
BEGIN
    UPDATE scheduler_waiting SET ready = 1 WHERE watch = NEW.period_key AND NOT ready;
END
