-- What a job owes, fixed at its first sighting: the instant from which its
-- fires run on their own (its latest fire then, if within catch_up, else
-- the sighting), so that a later change of its calendar, dates or jitter
-- never makes a fire from before the sighting owed. NULL on rows written
-- before this migration: their owed instant is worked out from
-- `first_seen` as before.
ALTER TABLE scheduler_jobs ADD COLUMN owed_from INTEGER;
