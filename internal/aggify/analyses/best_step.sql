-- The step with the lowest training loss (the first one on ties); NULL and
-- NaN losses are skipped.
CREATE FUNCTION best_step(p_run text) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; best float8 := NULL; at bigint := NULL;
BEGIN
  FOR rec IN SELECT step, loss FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF rec.loss IS NULL OR rec.loss = 'NaN'::float8 THEN
      CONTINUE;
    END IF;
    IF best IS NULL OR rec.loss < best THEN
      best := rec.loss;
      at := rec.step;
    END IF;
  END LOOP;
  RETURN at;
END $$;
