-- Notifications: one row per (notifier, period key, event), decided by the
-- primary key, so that each is delivered by one replica however many see
-- it. Times are milliseconds since the Unix epoch on the database's clock,
-- as in the API's tables, so both backends share their statements.
CREATE TABLE IF NOT EXISTS scheduler_notifications (
    notifier     TEXT NOT NULL,
    period_key   TEXT NOT NULL,
    event        TEXT NOT NULL CHECK (event IN ('late', 'failed', 'recovered')),
    job          TEXT NOT NULL,
    -- 'pending': to send at `next_try_at`; 'sending': taken by `owner`
    -- until `lease_until` (taken over after it); 'delivered'; 'given_up'.
    state        TEXT NOT NULL CHECK (state IN ('pending', 'sending', 'delivered', 'given_up')),
    -- The body as it is sent, built once: every try and every replica
    -- sends the same bytes. Secrets masked; never a signature.
    payload      TEXT NOT NULL,
    tries        INTEGER NOT NULL DEFAULT 0,
    owner        TEXT,
    lease_until  INTEGER,
    next_try_at  INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    finished_at  INTEGER,
    -- The receiver's last answer, and the last failure (masked).
    status       INTEGER,
    error        TEXT,
    PRIMARY KEY (notifier, period_key, event)
);
CREATE INDEX IF NOT EXISTS scheduler_notifications_due
    ON scheduler_notifications (state, next_try_at);
CREATE INDEX IF NOT EXISTS scheduler_notifications_job
    ON scheduler_notifications (job, created_at);
