-- Periods that are due but wait for upstream periods (a job's `after`):
-- one row per period key, written by whichever replica or `run` found it
-- waiting, so that a scan anywhere, or a later `run`, claims it once its
-- upstream periods have succeeded, however old it is by then. The row
-- decides nothing: the claim still decides once-ness. Deleted once it is
-- claimed (and with its claim when pruned); one left behind by a crash is
-- passed over, as its key has a claim. Times are milliseconds since the
-- Unix epoch on the database's clock.
CREATE TABLE IF NOT EXISTS scheduler_waiting (
    period_key   TEXT PRIMARY KEY,
    job          TEXT NOT NULL,
    period       TEXT NOT NULL,
    period_start INTEGER NOT NULL,
    period_end   INTEGER NOT NULL,
    scheduled_at INTEGER NOT NULL,
    -- One upstream period key it still misses (the newest): its success
    -- wakes the row, which is then looked at again whole.
    watch        TEXT NOT NULL,
    -- Its watched key succeeded since it was noted: a scan claims it (or
    -- notes what it still misses).
    ready        INTEGER NOT NULL DEFAULT 0,
    -- What it waits for, in words (for a `late` notification).
    waits        TEXT NOT NULL,
    since        INTEGER NOT NULL,
    checked_at   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduler_waiting_watch ON scheduler_waiting (watch);
CREATE INDEX IF NOT EXISTS scheduler_waiting_ready ON scheduler_waiting (job) WHERE ready;

-- A success wakes the periods watching its key, in the statement that
-- records it: a scan then reads only the woken rows, not every waiting
-- one (1,000 waiting periods would cost a scan more than the scan).
CREATE TRIGGER IF NOT EXISTS scheduler_claims_wake
AFTER UPDATE OF state ON scheduler_claims
WHEN NEW.state = 'succeeded'
BEGIN
    UPDATE scheduler_waiting SET ready = 1 WHERE watch = NEW.period_key AND NOT ready;
END;
