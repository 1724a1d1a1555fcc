package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/runstore"
)

func newPlotCmd() *cobra.Command {
	var db, metric, out, relative string
	var smooth float64
	cmd := &cobra.Command{
		Use:   "plot RUN...",
		Short: "Plot a metric of recorded runs against step (raw and smoothed, overlaid)",
		Example: `  titan plot 20261201-102653-3fa9 --metric loss --out loss.png
  titan plot 20261201-1026 20261201-1104 --metric tokens_per_sec --out tps.png
  titan plot 20261201-1104 20261201-1131 --relative-to 20261201-1026 --out vs_baseline.png`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			if out == "" {
				return errors.New("--out: name the PNG file to write")
			}
			if !strings.EqualFold(filepath.Ext(out), ".png") {
				return fmt.Errorf("--out %s: titan plot writes PNG; name a .png file", out)
			}
			target, err := runstore.Target(db, os.Getenv)
			if err != nil {
				return err
			}
			s, err := runstore.OpenExisting(cmd.Context(), target)
			if err != nil {
				return err
			}
			defer s.Close()
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			err = runstore.Plot(cmd.Context(), s, ids, runstore.PlotOptions{Metric: metric, Smooth: smooth, RelativeTo: relative}, f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(out)
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "titan: wrote %s\n", out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&db, "db", "", "run store: a SQLite file or a postgres:// URL (default $TITAN_DB, else the user's runs.db)")
	f.StringVar(&metric, "metric", "loss", "per-step metric: loss, grad_norm, lr, tokens_per_sec, mfu, mem_gib, val_loss, ...")
	f.StringVar(&out, "out", "", "PNG file to write")
	f.StringVar(&relative, "relative-to", "", "baseline RUN: draw each run's relative difference to it, in percent")
	f.Float64Var(&smooth, "smooth", 0.9, "weight of the past in the moving average, in [0, 1)")
	return cmd
}
