//go:build cgo

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/aggify"
	"github.com/titan-go/titan/internal/runstore"
)

// readAnalysis reads FILE.sql, or the built-in analysis of that name.
func readAnalysis(arg string) (string, error) {
	b, err := os.ReadFile(arg)
	if err == nil {
		return string(b), nil
	}
	if bi, ok := aggify.LookupBuiltin(strings.TrimSuffix(filepath.Base(arg), ".sql")); ok && !strings.ContainsRune(arg, os.PathSeparator) {
		return bi.Source, nil
	}
	return "", fmt.Errorf("%w (built-in analyses: %s)", err, builtinNames())
}

func builtinNames() string {
	var names []string
	for _, b := range aggify.Builtins() {
		names = append(names, b.Name)
	}
	return strings.Join(names, ", ")
}

func newAggifyCmd() *cobra.Command {
	var dialect string
	var list bool
	cmd := &cobra.Command{
		Use:   "aggify FILE.sql",
		Short: "Rewrite PL/pgSQL cursor loops into custom aggregates (Aggify)",
		Long: `Compile every FOR rec IN SELECT … LOOP of the PL/pgSQL functions in FILE.sql
into a custom aggregate and print the PostgreSQL script: per loop a state
type, a transition and a final function and CREATE AGGREGATE, then
<name>_aggified with the function's parameters and result, which runs the
aggregate in one query instead of the loop. FILE may also name a built-in
analysis (--list). A loop that cannot be rewritten is refused with the
construct and line.

--dialect sqlite prints what titan analyze registers on a SQLite run store
instead: per loop the aggregate's name and arguments (the fetched columns,
then the pre-loop values of its parameters and state), registered with the
modernc.org/sqlite driver with the loop body as its Go step, and the one
query SELECT <agg>(columns…, pre-loop values… ORDER BY …) FROM (cursor
query) AS _q that replaces the loop (an outer loop whose body holds inner
loops runs client-side, the inner ones as aggregates). A cursor query
SQLite cannot run as written (casts, LATERAL, …) is refused with the
reason; a file's own query (leaderboard's ranking) is not rewritten:
titan analyze runs it with the aggregates' results in place of its calls.`,
		Example: `  titan aggify analyses/loss_ema.sql --dialect postgres
  titan aggify loss_ema
  titan aggify best_step --dialect sqlite
  titan aggify --list`,
		Args: func(cmd *cobra.Command, args []string) error {
			if list {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if list {
				for _, b := range aggify.Builtins() {
					fmt.Fprintln(cmd.OutOrStdout(), b.Name)
				}
				return nil
			}
			if dialect != "postgres" && dialect != "sqlite" {
				return fmt.Errorf("--dialect %q: want postgres or sqlite", dialect)
			}
			src, err := readAnalysis(args[0])
			if err != nil {
				return err
			}
			p, err := aggify.CompileFile(src)
			if err != nil {
				return err
			}
			if dialect == "sqlite" {
				text, err := p.SQLiteText()
				if err != nil {
					return err
				}
				fmt.Fprint(cmd.OutOrStdout(), text)
				return nil
			}
			for _, r := range p.Rewrites {
				for _, l := range r.Loops {
					fmt.Fprintf(cmd.OutOrStdout(), "-- %s, loop at line %d: fetch %v, state %v, parameters %v, locals %v, results %v, order %v, early exit %v\n",
						r.Func.Name, l.Line, l.Fetch, l.State, l.Params, l.Locals, l.Results, l.OrderBy, l.EarlyExit)
					if len(l.OrderBy) > 0 {
						fmt.Fprintln(cmd.OutOrStdout(), "--   rows that tie on the ORDER BY keys may reach the aggregate in another order than the loop saw them: keep the keys unique (e.g. end with step)")
					}
				}
			}
			fmt.Fprint(cmd.OutOrStdout(), p.SQL())
			return nil
		},
	}
	cmd.Flags().StringVar(&dialect, "dialect", "postgres", "target database: postgres or sqlite")
	cmd.Flags().BoolVar(&list, "list", false, "list the built-in analyses")
	return cmd
}

func newAnalyzeCmd() *cobra.Command {
	var db, mode, cache string
	cmd := &cobra.Command{
		Use:   "analyze FILE.sql [ARG...]",
		Short: "Run a cursor-loop analysis, or its aggified rewrite, on PostgreSQL or a SQLite run store",
		Long: `Install the functions of FILE.sql (or a built-in analysis) and their rewrites
on the database and run the file's last query, or else its function called
with ARGs (cast to the parameter types). --mode loop runs the function as
written, aggregate the _aggified one, client the function interpreted in Go
over rows fetched from the database (the client-side loop); auto runs both
loop and aggregate the first time a file
is analysed, checks they agree, prints the faster one's result and records
the choice in --cache, which later auto runs follow (delete it to measure
again: the choice reflects the data it was measured on).

--db may also be a SQLite run store (a file path, as titan runs takes).
SQLite has no PL/pgSQL: loop then interprets the function in Go over the
rows of its cursor queries (translated to SQLite SQL), aggregate runs each
loop as one query of an aggregate registered with the driver (see titan
aggify --dialect sqlite), auto picks the faster as on PostgreSQL (recorded
apart). The file's own query (e.g. leaderboard's ranking over runs) runs in
SQLite with each call of a file function in FROM replaced by a table of its
results, the function run once per distinct argument tuple (loop or
aggregate as the mode says).`,
		Example: `  titan analyze loss_ema --db postgres://localhost/titan run-42 0.1
  titan analyze leaderboard --db "$DATABASE_URL" --mode aggregate
  titan analyze best_step --db runs.db --mode aggregate run-42`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := runstore.Target(db, os.Getenv) // as titan runs: --db, else $TITAN_DB, else the user's run store
			if err != nil {
				return err
			}
			m := aggify.Mode(mode)
			if m != aggify.ModeLoop && m != aggify.ModeAggregate && m != aggify.ModeAuto && m != "client" {
				return fmt.Errorf("--mode %q: want loop, aggregate, auto or client", mode)
			}
			src, err := readAnalysis(args[0])
			if err != nil {
				return err
			}
			p, err := aggify.CompileFile(src)
			if err != nil {
				return err
			}
			ctx := context.Background()
			if cache == "" {
				dir, err := os.UserCacheDir()
				if err != nil {
					dir = os.TempDir()
				}
				cache = filepath.Join(dir, "titan", "aggify-modes.json")
			}
			kind, where, err := runstore.ParseTarget(db)
			if err != nil {
				return err
			}
			if kind == runstore.SQLite {
				if m == "client" {
					return fmt.Errorf("--mode client: on SQLite the loop already runs client-side (--mode loop)")
				}
				lite, err := p.OpenSQLite(where)
				if err != nil {
					return err
				}
				defer lite.Close()
				res, err := p.AnalyzeSQLite(ctx, lite, m, args[1:], cache)
				if err != nil {
					return err
				}
				printResult(cmd, res)
				return nil
			}
			conn, err := pgx.Connect(ctx, db)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			if err := p.Install(ctx, conn); err != nil {
				return err
			}
			var res *aggify.Result
			if m == "client" {
				res, err = p.Client(ctx, conn, args[1:])
			} else {
				res, err = p.Analyze(ctx, conn, m, args[1:], cache)
			}
			if err != nil {
				return err
			}
			printResult(cmd, res)
			return nil
		},
	}
	cmd.Flags().StringVar(&db, "db", "", "PostgreSQL connection URL, or a SQLite run store file (default: $TITAN_DB, else the user's run store, as titan runs)")
	cmd.Flags().StringVar(&mode, "mode", "auto", "loop, aggregate, auto or client")
	cmd.Flags().StringVar(&cache, "cache", "", "where auto records its choice (default: the user cache folder, titan/aggify-modes.json)")
	return cmd
}

// printResult writes an analysis result as a table, its mode and time and
// auto's note on stderr.
func printResult(cmd *cobra.Command, res *aggify.Result) {
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(res.Columns, "\t"))
	for _, row := range res.Rows {
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
	w.Flush()
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", res.Mode, res.Elapsed)
	if res.Note != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), res.Note)
	}
}
