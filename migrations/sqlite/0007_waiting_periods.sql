-- Periods that are due but wait for upstream periods (a job's `after`):
-- one row per period key, written by whichever replica or `run` found it
-- waiting, so that a scan anywhere, or a later `run`, claims it once the
-- upstream periods it still missed have all succeeded, however old it is
-- by then. Deleted once it is claimed (and with its claim when pruned);
-- one left behind by a crash is passed over, as its key has a claim.
-- Times are milliseconds since the Unix epoch on the database's clock, as
-- in the notifications' table, so both backends share their statements.
CREATE TABLE IF NOT EXISTS scheduler_waiting (
    period_key   TEXT PRIMARY KEY,
    job          TEXT NOT NULL,
    period       TEXT NOT NULL,
    period_start INTEGER NOT NULL,
    period_end   INTEGER NOT NULL,
    scheduled_at INTEGER NOT NULL,
    -- The upstream period keys not succeeded at the last look, a JSON
    -- array: a scan looks up only these.
    missing      TEXT NOT NULL,
    -- What it waits for, in words (for a `late` notification).
    waits        TEXT NOT NULL,
    since        INTEGER NOT NULL,
    checked_at   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduler_waiting_job ON scheduler_waiting (job, scheduled_at);
