-- When each job fires, as its latest sighting saw it: a fingerprint of its
-- schedule, zone, period rule, dates, calendars and jitter. A sighting that
-- finds another one records the change: the job owes its fires as it is
-- timed now from the change on (owed_from moves there), so no mode runs,
-- and no view lists, a fire the new schedule would have made before it was
-- in force. `owed_period` is the start of the first period owed from then
-- (that of the first fire at or after owed_from): a job of periods longer
-- than a fire keeps owing it, and those after it, wherever a change moves
-- their fires. NULL on rows written before this migration: the next
-- sighting records both and moves nothing.
ALTER TABLE scheduler_jobs ADD COLUMN IF NOT EXISTS timing TEXT;
ALTER TABLE scheduler_jobs ADD COLUMN IF NOT EXISTS owed_period TIMESTAMPTZ;
