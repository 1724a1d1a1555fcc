-- The largest relative drop of tokens/s below its running peak (0..1).
CREATE FUNCTION throughput_drawdown(p_run text) RETURNS float8 LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; peak float8 := 0; dd float8; max_dd float8 := 0;
BEGIN
  FOR rec IN SELECT tokens_per_sec FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF rec.tokens_per_sec > peak THEN peak := rec.tokens_per_sec; END IF;
    IF peak > 0 THEN
      dd := (peak - rec.tokens_per_sec) / peak;
      IF dd > max_dd THEN max_dd := dd; END IF;
    END IF;
  END LOOP;
  RETURN max_dd;
END $$;
