-- Steps whose gradient norm exceeds p_factor times the mean of all earlier
-- (non-NULL) norms, once at least 10 have been seen.
CREATE FUNCTION grad_spike_count(p_run text, p_factor float8) RETURNS int LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; n int := 0; s float8 := 0; spikes int := 0;
BEGIN
  FOR rec IN SELECT grad_norm FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    CONTINUE WHEN rec.grad_norm IS NULL;
    IF n >= 10 AND rec.grad_norm > p_factor * (s / n) THEN
      spikes := spikes + 1;
    END IF;
    n := n + 1;
    s := s + rec.grad_norm;
  END LOOP;
  RETURN spikes;
END $$;
