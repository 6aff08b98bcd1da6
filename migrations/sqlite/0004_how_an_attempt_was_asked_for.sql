-- How a manual attempt was asked for (`force`, `early`) and by whom (the
-- API token's name, or `cli` and the user); NULL for a scheduled attempt.
ALTER TABLE scheduler_attempts ADD COLUMN asked TEXT;
ALTER TABLE scheduler_attempts ADD COLUMN requested_by TEXT;
