-- Every attempt's whole output, within its job's `output_max` (the head and
-- the tail), in chunks written as the job prints, secrets masked: any
-- replica reads it, also once the one that ran the attempt is gone. `seq`
-- orders an attempt's chunks across both streams; `at_byte` is where a
-- chunk starts in all the attempt printed (as kept: secrets masked), so a
-- gap before a chunk is what was not kept (`lost`: bytes that could not be
-- written in time; the rest of a gap: the middle past `output_max`). `at`
-- (milliseconds) is when it was written, for `keep_output`.
CREATE TABLE IF NOT EXISTS scheduler_output (
    period_key TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    job        TEXT NOT NULL,
    stream     TEXT NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    at_byte    BIGINT NOT NULL,
    lost       BIGINT NOT NULL DEFAULT 0,
    at         BIGINT NOT NULL,
    text       TEXT NOT NULL,
    PRIMARY KEY (period_key, attempt, seq)
);
CREATE INDEX IF NOT EXISTS scheduler_output_job_at ON scheduler_output (job, at);
