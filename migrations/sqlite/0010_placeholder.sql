-- Placeholder for migration 0010, which another change of issue 12 takes: replaced by
-- that change's file when both are merged.
SELECT 1;
