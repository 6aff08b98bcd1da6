-- How a manual attempt was asked for (`force`, `early`) and by whom (the
-- API token's name, or `cli` and the user); NULL for a scheduled attempt.
ALTER TABLE scheduler_attempts ADD COLUMN IF NOT EXISTS asked TEXT;
ALTER TABLE scheduler_attempts ADD COLUMN IF NOT EXISTS requested_by TEXT;
