//go:build cgo

package aggify

import (
	"context"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Benchmarks over 1,000 runs × 1,000 steps (1M metrics rows), loaded once
// per test binary. Run with
//
//	go test -run '^$' -bench Aggify -benchtime 1x ./internal/aggify
//
// They report time and bytes received from the server; nothing asserts on
// timing.

const benchRuns, benchSteps = 1000, 1000

var (
	benchOnce sync.Once
	benchErr  error
)

// countingConn counts the bytes the client reads from the server.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func benchConn(b *testing.B) (*pgx.Conn, *atomic.Int64) {
	b.Helper()
	srv := server(b)
	ctx := context.Background()
	benchOnce.Do(func() {
		conn := freshDB(b, "aggify_bench")
		var runs []genRun
		for i := 0; i < benchRuns; i++ {
			runs = append(runs, genRun{fmt.Sprintf("run-%04d", i), fmt.Sprintf("recipe-%d", i%10), benchSteps, "normal"})
		}
		start := time.Now()
		load(b, conn, runs)
		for _, name := range []string{"loss_ema", "improving_streak"} {
			bi, _ := LookupBuiltin(name)
			p, err := CompileFile(bi.Source)
			if err != nil {
				benchErr = err
				return
			}
			if err := p.Install(ctx, conn); err != nil {
				benchErr = err
				return
			}
		}
		b.Logf("loaded %d rows in %v", benchRuns*benchSteps, time.Since(start))
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	var n atomic.Int64
	cfg, _ := pgx.ParseConfig(srv.URL)
	cfg.Database = "aggify_bench"
	d := &net.Dialer{}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		return countingConn{c, &n}, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(context.Background()) })
	return conn, &n
}

// emaClient is loss_ema as a Go loop over fetched rows (rows ordered by run
// and step).
func emaClient(ctx context.Context, conn *pgx.Conn, alpha float64) (map[string]float64, error) {
	rows, err := conn.Query(ctx, "SELECT run_id, loss FROM metrics ORDER BY run_id, step")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]float64{}
	have := map[string]bool{}
	var id string
	var loss *float64
	for rows.Next() {
		if err := rows.Scan(&id, &loss); err != nil {
			return nil, err
		}
		if loss == nil {
			continue
		}
		if !have[id] {
			out[id], have[id] = *loss, true
		} else {
			out[id] = alpha**loss + (1-alpha)*out[id]
		}
	}
	return out, rows.Err()
}

func scalarRows(ctx context.Context, conn *pgx.Conn, q string) (map[string]float64, error) {
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var id string
		var v *float64
		if err := rows.Scan(&id, &v); err != nil {
			return nil, err
		}
		if v != nil {
			out[id] = *v
		}
	}
	return out, rows.Err()
}

// BenchmarkAggifyClient compares (a) the loop run client-side in Go over
// every row fetched from PostgreSQL with the aggregate pushed into one
// query (GROUP BY over all runs, and the _aggified function per run).
func BenchmarkAggifyClient(b *testing.B) {
	conn, n := benchConn(b)
	ctx := context.Background()
	cases := []struct {
		name string
		run  func() (map[string]float64, error)
	}{
		{"go-loop-over-fetched-rows", func() (map[string]float64, error) { return emaClient(ctx, conn, 0.1) }},
		{"ir-interpreter-over-fetched-rows-per-run", func() (map[string]float64, error) {
			file, err := ParseFile(mustBuiltin("loss_ema"))
			if err != nil {
				return nil, err
			}
			out := map[string]float64{}
			for i := 0; i < benchRuns; i++ {
				id := fmt.Sprintf("run-%04d", i)
				v, err := Interpret(ctx, file.Funcs[0], []Value{id, 0.1}, PgxRows(conn))
				if err != nil {
					return nil, err
				}
				if v[0] != nil {
					out[id] = v[0].(float64)
				}
			}
			return out, nil
		}},
		{"aggregate-group-by", func() (map[string]float64, error) {
			return scalarRows(ctx, conn, "SELECT run_id, loss_ema_agg(m, 0.1, NULL::float8 ORDER BY step) FROM metrics m GROUP BY run_id")
		}},
		{"aggified-per-run-one-query", func() (map[string]float64, error) {
			return scalarRows(ctx, conn, "SELECT run_id, loss_ema_aggified(run_id, 0.1) FROM runs")
		}},
	}
	var ref map[string]float64
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var got map[string]float64
			for i := 0; i < b.N; i++ {
				n.Store(0)
				var err error
				if got, err = c.run(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n.Load()), "B-received/op")
			if ref == nil {
				ref = got
			}
			if len(got) != benchRuns {
				b.Fatalf("%d runs, want %d", len(got), benchRuns)
			}
			for id, v := range ref {
				if math.Abs(got[id]-v) > 1e-9*math.Abs(v) {
					b.Fatalf("%s: %v, Go loop %v", id, got[id], v)
				}
			}
		})
	}
}

// BenchmarkAggifyServer compares (b) the PL/pgSQL loop with the aggified
// function inside PostgreSQL, called for every run in one query.
func BenchmarkAggifyServer(b *testing.B) {
	conn, n := benchConn(b)
	ctx := context.Background()
	for _, fn := range []string{"loss_ema(run_id, 0.1)", "loss_ema_aggified(run_id, 0.1)",
		"longest_improving_streak(run_id)::float8", "longest_improving_streak_aggified(run_id)::float8"} {
		b.Run(fn, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				n.Store(0)
				got, err := scalarRows(ctx, conn, "SELECT run_id, "+fn+" FROM runs")
				if err != nil {
					b.Fatal(err)
				}
				if len(got) != benchRuns {
					b.Fatalf("%d runs", len(got))
				}
			}
			b.ReportMetric(float64(n.Load()), "B-received/op")
		})
	}
}

func mustBuiltin(name string) string {
	b, ok := LookupBuiltin(name)
	if !ok {
		panic(name)
	}
	return b.Source
}
