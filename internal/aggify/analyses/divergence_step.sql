-- The first step whose loss is NaN (or NULL: SQLite stores a NaN as NULL)
-- or more than p_ratio times the best loss so far; NULL when the run never
-- diverges.
CREATE FUNCTION divergence_step(p_run text, p_ratio float8) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; best float8 := NULL; bad bigint := NULL;
BEGIN
  FOR rec IN SELECT step, loss FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF rec.loss IS NULL OR rec.loss = 'NaN'::float8 OR (best IS NOT NULL AND rec.loss > p_ratio * best) THEN
      bad := rec.step;
      EXIT;
    END IF;
    IF best IS NULL OR rec.loss < best THEN best := rec.loss; END IF;
  END LOOP;
  RETURN bad;
END $$;
