package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/launch"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "bench",
		Short:   "Benchmarks of titan's building blocks",
		Example: "  titan bench comm --op allreduce --size 64MiB --nproc 2",
	}
	cmd.AddCommand(newBenchCommCmd())
	return cmd
}

func newBenchCommCmd() *cobra.Command {
	var lf launchFlags
	var op, size, transport, resultFile string
	var iters, warmup int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "comm",
		Short: "Collective bandwidth across worker processes (nccl-tests style)",
		Long: `Time a collective on float32 buffers across --nproc worker processes and
print the algorithm and bus bandwidth as nccl-tests defines them (busbw =
algbw × 2(n-1)/n for allreduce, × (n-1)/n for reduce_scatter, all_gather and
all_to_all).`,
		Example: `  titan bench comm --op allreduce --size 64MiB --nproc 2
  titan bench comm --op reduce_scatter --size 256MiB --nproc 4 --transport tcp --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bytes, err := comm.ParseSize(size)
			if err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			if _, err := comm.BusFactor(op, 2); err != nil {
				return fmt.Errorf("--op: %w", err)
			}
			spec, err := launch.Detect(os.Environ(), lf.f)
			if err != nil {
				return err
			}
			if spec.Mode == launch.ModeStandalone {
				return fmt.Errorf("bench comm needs at least 2 processes: add --nproc N")
			}
			if spec.Mode == launch.ModeLauncher {
				dir, err := os.MkdirTemp("", "titan-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				resultFile = filepath.Join(dir, "result.json")
				saved := commandArgs
				commandArgs = append(append([]string{}, commandArgs...), "--result-file", resultFile)
				defer func() { commandArgs = saved }()
			}
			err = lf.distributed(cmd.Context(), os.Stderr, commSettings{Timeout: 5 * time.Minute}, func(w *launch.Worker) error {
				g := w.World
				if transport != "auto" && transport != g.Transport() {
					sub, err := comm.NewWorld(cmd.Context(), w.Control, w.Rank, w.WorldSize, comm.Options{Transport: transport, StorePrefix: "bench-" + transport})
					if err != nil {
						return err
					}
					defer sub.Close()
					g = sub
				}
				res, err := comm.BenchCollective(cmd.Context(), g, op, bytes, iters, warmup)
				if err != nil {
					return err
				}
				if w.Rank == 0 && resultFile != "" {
					b, _ := json.Marshal(res)
					return os.WriteFile(resultFile, b, 0o644)
				}
				return nil
			})
			if err != nil || spec.Mode != launch.ModeLauncher {
				return err
			}
			raw, err := os.ReadFile(resultFile)
			if err != nil {
				return fmt.Errorf("bench comm: rank 0 wrote no result: %w", err)
			}
			var res comm.BenchResult
			if err := json.Unmarshal(raw, &res); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(res)
			}
			fmt.Fprintf(out, "#%15s %12s %6s %9s %12s %12s %12s\n", "op", "size(B)", "nproc", "transport", "time(us)", "algbw(GB/s)", "busbw(GB/s)")
			fmt.Fprintf(out, " %15s %12d %6d %9s %12.1f %12.3f %12.3f\n", res.Op, res.SizeBytes, res.NProc, res.Transport, res.TimeS*1e6, res.AlgBW, res.BusBW)
			return nil
		},
	}
	f := cmd.Flags()
	lf.register(cmd)
	f.StringVar(&op, "op", "allreduce", "allreduce, reduce_scatter, all_gather, all_to_all or broadcast")
	f.StringVar(&size, "size", "64MiB", "buffer size (e.g. 1MiB, 64MiB, 1GiB)")
	f.StringVar(&transport, "transport", "auto", "auto (shared memory on one host), tcp or shm")
	f.IntVar(&iters, "iters", 10, "timed iterations")
	f.IntVar(&warmup, "warmup", 2, "untimed iterations first")
	f.BoolVar(&asJSON, "json", false, `print {"op", "size_bytes", "nproc", "time_s", "algbw_gbps", "busbw_gbps"}`)
	f.StringVar(&resultFile, "result-file", "", "where rank 0 writes its result (set by the launcher)")
	f.MarkHidden("result-file")
	return cmd
}

func newDebugCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "debug",
		Short:   "Post-mortem tools for distributed runs",
		Example: "  titan debug flight outputs/llama3_debug/comm_traces",
	}
	var asJSON bool
	flight := &cobra.Command{
		Use:   "flight DIR",
		Short: "Name the ranks that never entered the collective the others wait in",
		Long: `Read the flight-recorder dumps (flight-rank*.json) that workers write on a
collective timeout or on SIGUSR1 (kill -USR1 <worker pid>), by default into
<job.dump_folder>/<comm.save_traces_folder>, and report for each process group
the first collective that some ranks entered and others never reached.`,
		Example: `  titan debug flight outputs/llama3_debug/comm_traces`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := comm.AnalyzeFlight(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
			}
			fmt.Fprintln(cmd.OutOrStdout(), strings.TrimSpace(rep.Summary))
			return nil
		},
	}
	flight.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.AddCommand(flight)
	return cmd
}
