-- A recipe leaderboard: a per-run loop (smoothed final loss, best loss,
-- steps logged) and an outer query that ranks the runs of every recipe.
CREATE FUNCTION run_summary(p_run text, p_alpha float8,
    OUT final_ema float8, OUT best_loss float8, OUT steps int) LANGUAGE plpgsql STABLE AS $$
DECLARE rec record;
BEGIN
  steps := 0;
  FOR rec IN SELECT loss FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    steps := steps + 1;
    CONTINUE WHEN rec.loss IS NULL OR rec.loss = 'NaN'::float8;
    IF final_ema IS NULL THEN
      final_ema := rec.loss;
    ELSE
      final_ema := p_alpha * rec.loss + (1 - p_alpha) * final_ema;
    END IF;
    IF best_loss IS NULL OR rec.loss < best_loss THEN best_loss := rec.loss; END IF;
  END LOOP;
END $$;

SELECT r.recipe_path, r.run_id, s.final_ema, s.best_loss, s.steps,
       rank() OVER (PARTITION BY r.recipe_path ORDER BY s.final_ema NULLS LAST) AS place
  FROM runs r, LATERAL run_summary(r.run_id, 0.1) s
 ORDER BY r.recipe_path, place, r.run_id;
