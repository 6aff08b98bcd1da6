-- A fingerprint of the job's definition each attempt ran under (schedule,
-- zone, period rule, action after ${VAR} expansion; a hash, never a secret).
ALTER TABLE scheduler_attempts ADD COLUMN definition TEXT;
