-- Exponential moving average of the loss, in step order (alpha weights the
-- newest value); NULL losses leave it unchanged.
CREATE FUNCTION loss_ema(p_run text, p_alpha float8) RETURNS float8 LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; ema float8 := NULL;
BEGIN
  FOR rec IN SELECT loss FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF rec.loss IS NULL THEN
      CONTINUE;
    ELSIF ema IS NULL THEN
      ema := rec.loss;
    ELSE
      ema := p_alpha * rec.loss + (1 - p_alpha) * ema;
    END IF;
  END LOOP;
  RETURN ema;
END $$;
