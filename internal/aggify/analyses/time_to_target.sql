-- Seconds from a run's first logged step until its loss first reaches
-- p_target; NULL when it never does (or the run is empty).
CREATE FUNCTION time_to_target(p_run text, p_target float8) RETURNS float8 LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; t0 float8 := NULL; tt float8 := NULL;
BEGIN
  FOR rec IN SELECT elapsed_s, loss FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF t0 IS NULL THEN t0 := rec.elapsed_s; END IF;
    IF rec.loss <= p_target THEN
      tt := rec.elapsed_s - t0;
      EXIT;
    END IF;
  END LOOP;
  RETURN tt;
END $$;
