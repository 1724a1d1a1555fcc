package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/top"
)

// headerLines are the lines of titan top's view above and below the rank
// rows: the two job lines, the table's heading, the "not shown" line.
const headerLines = 4

func newTopCmd() *cobra.Command {
	var addr string
	var interval time.Duration
	var once bool
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Live view of a running job's ranks, from the launcher's metrics endpoint (titan train --metrics-addr)",
		Long: `top scrapes the Prometheus endpoint that titan train --metrics-addr serves
and shows the job (step, loss, steps/s, tokens/s, MFU, straggler reports)
over one row per rank: host, step time, compute time and share, peak
memory, and a bar of its step time against the slowest rank's
(█ compute, ░ communication). On a terminal it redraws in place every
--interval until interrupted; with --once, or when the output is not a
terminal, it prints the view once.`,
		Example: `  titan train --recipe recipes/llama3_debug.toml --nproc 4 --metrics-addr 127.0.0.1:9400 &
  titan top --metrics-addr 127.0.0.1:9400
  titan top --metrics-addr http://node7:9400/metrics --once`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			u, err := top.URL(addr)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			o := top.Options{URL: u, Interval: interval, Once: once, Terminal: metrics.IsTerminal(out)}
			if f, ok := out.(*os.File); ok && o.Terminal {
				if h := top.TerminalRows(f); h > headerLines {
					o.Rows = h - headerLines
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return top.Run(ctx, out, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "metrics-addr", "127.0.0.1:9400", "the job's metrics endpoint: HOST:PORT (of titan train --metrics-addr) or a URL")
	f.DurationVar(&interval, "interval", time.Second, "time between refreshes on a terminal")
	f.BoolVar(&once, "once", false, "print the view once and exit")
	return cmd
}
