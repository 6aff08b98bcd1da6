-- The HTTP API. Times are milliseconds since the Unix epoch on the
-- database's clock, as on SQLite, so both backends share their statements.

-- Idempotency-Keys: one row per (token name, route template, key), decided
-- by the primary key. The key itself is never stored, only a hash of the
-- scope; `request` hashes the method, the concrete path and the canonical
-- JSON body.
CREATE TABLE IF NOT EXISTS scheduler_idempotency (
    scope       TEXT PRIMARY KEY,
    request     TEXT NOT NULL,
    -- 'running': being answered until `bound_at`; 'answered': `status`,
    -- `body` and `location` are replayed (once `run_id`, if any, ended).
    state       TEXT NOT NULL CHECK (state IN ('running', 'answered')),
    status      INTEGER,
    body        TEXT,
    location    TEXT,
    run_id      TEXT,
    bound_at    BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduler_idempotency_expiry
    ON scheduler_idempotency (expires_at);

-- Runs asked for over the API: the replica running one keeps `alive_until`
-- ahead of the clock and writes what each period did into `body` (JSON).
CREATE TABLE IF NOT EXISTS scheduler_api_runs (
    id           TEXT PRIMARY KEY,
    job          TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    owner        TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('running', 'done')),
    body         TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    alive_until  BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduler_api_runs_expiry
    ON scheduler_api_runs (expires_at);
