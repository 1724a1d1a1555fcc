-- The longest run of consecutive steps whose loss improved on the previous
-- step's; 0 for an empty run.
CREATE FUNCTION longest_improving_streak(p_run text) RETURNS int LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; prev_loss float8 := NULL; cur int := 0; best int := 0;
BEGIN
  FOR rec IN SELECT loss FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF prev_loss IS NOT NULL AND rec.loss < prev_loss THEN
      cur := cur + 1;
    ELSE
      cur := 0;
    END IF;
    IF cur > best THEN best := cur; END IF;
    prev_loss := rec.loss;
  END LOOP;
  RETURN best;
END $$;
