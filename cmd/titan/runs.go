package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/runstore"
)

func newRunsCmd() *cobra.Command {
	var db string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List, show and compare recorded training runs",
		Long: `List, show and compare the runs recorded in the run store.

Every titan train records its run (metrics.enable_db, on by default): the
resolved recipe, host, titan version, layout, status and every logged step.
The store is --db when given, else $TITAN_DB, else the user's default file
(` + defaultStoreHelp() + `); a recipe names its own with metrics.db. It is a
SQLite file, or PostgreSQL with a postgres:// URL.

A run's status is running, finished, failed (with the error) or interrupted.
A run whose recording process was killed (SIGKILL, out of memory) cannot
record its end: these commands show it interrupted, with the reason, once
its process is gone from this host or no heartbeat came for ` + runstore.StaleAfter.String() + `.`,
		Example: `  titan runs list
  titan runs show 20261201-102653-3fa9
  titan runs show 20261201-1026 --recipe > again.toml
  titan runs compare 20261201-102653-3fa9 20261201-110412-07bc
  titan runs list --json --db postgres://titan@db.example/titan`,
	}
	cmd.PersistentFlags().StringVar(&db, "db", "", "run store: a SQLite file or a postgres:// URL (default $TITAN_DB, else the user's runs.db)")
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print one JSON object per line instead of a table")

	// open opens the store for reading; ok is false when there is none
	// yet (a SQLite file that does not exist).
	open := func(ctx context.Context) (s *runstore.Store, target string, err error) {
		target, err = runstore.Target(db, os.Getenv)
		if err != nil {
			return nil, "", err
		}
		if s, err = runstore.OpenExisting(ctx, target); err != nil {
			return nil, target, err
		}
		host, _ := os.Hostname()
		if _, err := s.Reconcile(ctx, host, time.Now(), runstore.StaleAfter); err != nil {
			fmt.Fprintf(os.Stderr, "titan: checking the running runs' processes in %s: %v\n", runstore.Redact(target), err)
		}
		return s, target, nil
	}

	var limit int
	list := &cobra.Command{
		Use:     "list",
		Short:   "The newest runs: ID, recipe, model, layout, status, steps, final loss, tokens/s, start",
		Example: "  titan runs list -n 5",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return fmt.Errorf("--limit %d: want the number of runs to show, or 0 for all", limit)
			}
			s, target, err := open(cmd.Context())
			if errors.Is(err, runstore.ErrNoStore) {
				if !asJSON {
					fmt.Fprintf(cmd.OutOrStdout(), "no runs recorded in %s\n", runstore.Redact(target))
				}
				return nil
			}
			if err != nil {
				return err
			}
			defer s.Close()
			return runstore.List(cmd.Context(), cmd.OutOrStdout(), s, runstore.ListOptions{Limit: limit, JSON: asJSON})
		},
	}
	list.Flags().IntVarP(&limit, "limit", "n", 20, "show the newest N runs (0: all)")

	var recipe bool
	show := &cobra.Command{
		Use:     "show ID",
		Short:   "A run's metadata, its logged steps and the other runs of its job (ID or a unique prefix)",
		Example: "  titan runs show 20261201-1026\n  titan runs show 20261201-1026 --recipe",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if recipe && asJSON {
				return errors.New("--recipe prints the run's recipe as TOML; --json prints the run as JSON (whose recipe field holds it): choose one")
			}
			s, _, err := open(cmd.Context())
			if err != nil {
				return err
			}
			defer s.Close()
			return runstore.Show(cmd.Context(), cmd.OutOrStdout(), s, args[0], runstore.ShowOptions{JSON: asJSON, Recipe: recipe})
		},
	}
	show.Flags().BoolVar(&recipe, "recipe", false, "print only the run's resolved recipe (TOML)")

	compare := &cobra.Command{
		Use:     "compare ID ID...",
		Short:   "Runs side by side: final loss, loss at equal tokens, mean tokens/s, MFU, peak memory",
		Example: "  titan runs compare 20261201-1026 20261201-1104",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, _, err := open(cmd.Context())
			if err != nil {
				return err
			}
			defer s.Close()
			return runstore.Compare(cmd.Context(), cmd.OutOrStdout(), s, args, runstore.CompareOptions{JSON: asJSON})
		},
	}
	flush := &cobra.Command{
		Use:   "flush DUMP_FOLDER...",
		Short: "Write the records a run spooled in its dump folder (its store was unreachable) to the run store",
		Long: `A run whose store could not be reached spools its records into
<dump_folder>/` + runstore.SpoolFile + `; the next run in that folder flushes them. flush
writes them now, without training, and removes the spool.`,
		Example: "  titan runs flush outputs/llama3_debug",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, dirs []string) error {
			target, err := runstore.Target(db, os.Getenv)
			if err != nil {
				return err
			}
			for _, dir := range dirs {
				n, bad, err := runstore.FlushSpool(cmd.Context(), target, dir)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %d events written to %s", dir, n, runstore.Redact(target))
				if bad > 0 {
					fmt.Fprintf(cmd.OutOrStdout(), " (%d unreadable lines skipped)", bad)
				}
				fmt.Fprintln(cmd.OutOrStdout())
			}
			return nil
		},
	}
	cmd.AddCommand(list, show, compare, flush)
	return cmd
}

// defaultStoreHelp names the default run store for the help text.
func defaultStoreHelp() string {
	if p, err := runstore.DefaultPath(); err == nil {
		return p
	}
	return "$XDG_DATA_HOME/titan/runs.db or ~/.local/share/titan/runs.db"
}
