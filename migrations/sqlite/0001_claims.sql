-- Claims: one row per period key, decided by the primary key. Times are
-- milliseconds since the Unix epoch on the database's clock.
CREATE TABLE IF NOT EXISTS scheduler_claims (
    period_key   TEXT PRIMARY KEY,
    job          TEXT NOT NULL,
    period       TEXT NOT NULL,
    period_start INTEGER NOT NULL,
    period_end   INTEGER NOT NULL,
    scheduled_at INTEGER NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('running', 'succeeded', 'failed', 'released')),
    attempt      INTEGER NOT NULL,
    failures     INTEGER NOT NULL DEFAULT 0,
    trigger      TEXT NOT NULL,
    owner        TEXT NOT NULL,
    lease_until  INTEGER,
    retry_at     INTEGER,
    started_at   INTEGER NOT NULL,
    finished_at  INTEGER
);

-- Expired-lease and concurrency look-ups touch running rows only.
CREATE INDEX IF NOT EXISTS scheduler_claims_running
    ON scheduler_claims (job, lease_until) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS scheduler_claims_retry
    ON scheduler_claims (retry_at) WHERE state = 'failed';
CREATE INDEX IF NOT EXISTS scheduler_claims_released
    ON scheduler_claims (job) WHERE state = 'released';
CREATE INDEX IF NOT EXISTS scheduler_claims_job
    ON scheduler_claims (job, period_start);

-- Every attempt, kept until pruned.
CREATE TABLE IF NOT EXISTS scheduler_attempts (
    period_key   TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    job          TEXT NOT NULL,
    trigger      TEXT NOT NULL,
    owner        TEXT NOT NULL,
    scheduled_at INTEGER,
    started_at   INTEGER NOT NULL,
    finished_at  INTEGER,
    outcome      TEXT NOT NULL CHECK (outcome IN ('running', 'succeeded', 'failed', 'released', 'lost')),
    exit_code    INTEGER,
    http_status  INTEGER,
    error        TEXT,
    output       TEXT,
    retry_after  INTEGER,
    PRIMARY KEY (period_key, attempt)
);
CREATE INDEX IF NOT EXISTS scheduler_attempts_job
    ON scheduler_attempts (job, started_at);

-- Jobs as the database has seen them: when first, and whether paused.
CREATE TABLE IF NOT EXISTS scheduler_jobs (
    name       TEXT PRIMARY KEY,
    first_seen INTEGER NOT NULL,
    paused     INTEGER NOT NULL DEFAULT 0
);

-- Every claim that starts an attempt records it, and one that takes over a
-- running attempt marks that one lost: in the claiming statement itself.
CREATE TRIGGER IF NOT EXISTS scheduler_claims_attempt_new
AFTER INSERT ON scheduler_claims
BEGIN
    INSERT INTO scheduler_attempts
        (period_key, attempt, job, trigger, owner, scheduled_at, started_at, outcome)
    VALUES (NEW.period_key, NEW.attempt, NEW.job, NEW.trigger, NEW.owner,
            NEW.scheduled_at, NEW.started_at, 'running');
END;

CREATE TRIGGER IF NOT EXISTS scheduler_claims_attempt_next
AFTER UPDATE OF attempt ON scheduler_claims
BEGIN
    UPDATE scheduler_attempts SET outcome = 'lost', finished_at = NEW.started_at
     WHERE period_key = NEW.period_key AND outcome = 'running' AND attempt < NEW.attempt;
    INSERT INTO scheduler_attempts
        (period_key, attempt, job, trigger, owner, scheduled_at, started_at, outcome)
    VALUES (NEW.period_key, NEW.attempt, NEW.job, NEW.trigger, NEW.owner,
            NEW.scheduled_at, NEW.started_at, 'running');
END;

-- Recording an attempt's outcome (a fenced update of its row) settles the
-- claim in the same statement: state, failures and when a retry is due.
CREATE TRIGGER IF NOT EXISTS scheduler_attempts_outcome
AFTER UPDATE OF outcome ON scheduler_attempts
WHEN OLD.outcome = 'running' AND NEW.outcome IN ('succeeded', 'failed')
BEGIN
    UPDATE scheduler_claims
       SET state = NEW.outcome, finished_at = NEW.finished_at, lease_until = NULL,
           failures = failures + (NEW.outcome = 'failed'),
           retry_at = NEW.finished_at + NEW.retry_after
     WHERE period_key = NEW.period_key AND attempt = NEW.attempt AND state = 'running';
END;
