-- Which claims can be taken again: SQLite's claim rule, the same as
-- PostgreSQL's `scheduler_claimable` (schema/postgres/scheduler_claimable.sql).
-- A lease that ran out (unless the process holds expired leases after an
-- outage or its start: :hold), a released claim whose runner confirmed the
-- stop or whose lease ran out, a failed one whose retry is due (or any
-- failed one when :manual), a succeeded one when :force.
--
-- Not a migration: the store reads this text and puts SQL in for :now (the
-- clock in milliseconds), :manual, :force and :hold (a parameter or a
-- literal) in every statement that claims or lists claimable rows. Its
-- unqualified columns name the existing row in an upsert's
-- `DO UPDATE … WHERE`.
((state = 'running' AND lease_until < :now AND NOT :hold)
  OR (state = 'released' AND (lease_until IS NULL OR lease_until < :now))
  OR (state = 'failed' AND (:manual OR retry_at <= :now))
  OR (state = 'succeeded' AND :force))
