-- Two claim functions no scheduler calls any more: the single claim of
-- 0001 (0003 made every claim a batch) and the batch claim without its
-- `p_wait` argument (0007 added the overload that replaced it). Dropped,
-- so that each live function has one body, kept in `schema/postgres/`.
DROP FUNCTION IF EXISTS scheduler_claim(
    TEXT, TEXT, TEXT, TIMESTAMPTZ, TIMESTAMPTZ, TEXT, BIGINT, TEXT, INTEGER, BOOLEAN, BOOLEAN,
    TIMESTAMPTZ);
DROP FUNCTION IF EXISTS scheduler_claim_many(
    TEXT[], TEXT[], TEXT[], TIMESTAMPTZ[], TIMESTAMPTZ[], TIMESTAMPTZ[], TEXT[], INTEGER[],
    BOOLEAN[], BOOLEAN[], TEXT, BIGINT);
