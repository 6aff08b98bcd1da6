CREATE TRIGGER scheduler_claims_wake AFTER UPDATE OF state ON scheduler_claims FOR EACH ROW WHEN (new.state = 'succeeded'::text) EXECUTE FUNCTION scheduler_waiting_wake()
