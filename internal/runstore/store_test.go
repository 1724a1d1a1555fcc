package runstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/testenv"
)

// backend makes fresh, empty stores of one kind.
type backend struct {
	name string
	// fresh returns the target of a new empty database.
	fresh func(t *testing.T) string
}

// backends are SQLite (a file in a temporary folder) and PostgreSQL (one
// database each on a server shared by the package's tests).
func backends(t *testing.T) []backend {
	return []backend{
		{"sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "runs.db") }},
		{"postgres", func(t *testing.T) string {
			shared.once.Do(func() { shared.pg, shared.err = testenv.StartPostgres() })
			testenv.RequirePostgres(t, shared.err)
			return newDatabase(t, shared.pg.URL, fmt.Sprintf("titan_test_%d", shared.n.Add(1)))
		}},
	}
}

// shared is the package's PostgreSQL server, started by the first test
// that needs it and stopped by TestMain.
var shared struct {
	once sync.Once
	pg   *testenv.PG
	err  error
	n    atomic.Int64
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.pg != nil {
		shared.pg.Close()
	}
	os.Exit(code)
}

// newDatabase creates database name on the server of base and returns its
// URL.
func newDatabase(t *testing.T, base, name string) string {
	t.Helper()
	db, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(base)
	u.Path = "/" + name
	return u.String()
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func openT(t *testing.T, target string) *Store {
	t.Helper()
	s, err := Open(ctxT(t), target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func testRun(id string, start time.Time) Run {
	return Run{ID: id, RecipePath: "recipes/llama3_debug.toml", Model: "llama3", Flavor: "tiny_bench",
		Layout: "pp 1 × dp_replicate 1 × dp_shard 2 × cp 1 × tp 1", World: 2, Host: "h1", Version: "v-test",
		Description: "a test", DumpFolder: "/tmp/x", StepsPlanned: 3, TokensPerStep: 64,
		Recipe: "[training]\nsteps = 3\n", StartedAt: start}
}

func testSteps(n int) []metrics.Record {
	out := make([]metrics.Record, n)
	for i := range out {
		s := i + 1
		out[i] = metrics.Record{Step: s, Loss: 5 - 0.5*float64(s), GradNorm: 1.5, LR: 1e-3 * float64(s), TokensPerSec: 1000 * float64(s),
			TFLOPs: 0.01, MFU: 2.5 * float64(s), MemGiB: 0.25 * float64(s), StateGiB: 0.05, GatheredUnits: s % 3, ElapsedS: float64(s)}
		if s%2 == 0 {
			v := 4.25
			out[i].ValLoss = &v
		}
	}
	return out
}

// TestStoreRoundTrip: a run, its steps and its end come back as written
// on both backends; steps written again are replaced, not duplicated;
// runs are found by ID prefix and summarised.
func TestStoreRoundTrip(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := ctxT(t)
			s := openT(t, b.fresh(t))
			start := time.Date(2026, 12, 1, 10, 26, 53, 123e6, time.UTC)
			r := testRun("20261201-102653-aaaa", start)
			if err := s.PutRun(ctx, r); err != nil {
				t.Fatal(err)
			}
			steps := testSteps(3)
			if err := s.PutSteps(ctx, r.ID, steps[:2]); err != nil {
				t.Fatal(err)
			}
			// Step 2 again (a replayed spool) and step 3.
			if err := s.PutSteps(ctx, r.ID, steps[1:]); err != nil {
				t.Fatal(err)
			}
			// A second start of the same run changes nothing.
			r2 := r
			r2.Host = "other"
			if err := s.PutRun(ctx, r2); err != nil {
				t.Fatal(err)
			}
			end := start.Add(90 * time.Second)
			if err := s.EndRun(ctx, r.ID, Failed, "step 3: boom", end); err != nil {
				t.Fatal(err)
			}
			other := testRun("20261201-110000-bbbb", start.Add(time.Hour))
			if err := s.PutRun(ctx, other); err != nil {
				t.Fatal(err)
			}

			got, err := s.Get(ctx, "20261201-1026")
			if err != nil {
				t.Fatal(err)
			}
			want := r
			want.Status, want.Error, want.EndedAt, want.Heartbeat = Failed, "step 3: boom", &end, &start // the start is the first heartbeat
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Get:\n got %+v\nwant %+v", got, want)
			}
			gotSteps, err := s.Steps(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(gotSteps, steps) {
				t.Errorf("Steps:\n got %+v\nwant %+v", gotSteps, steps)
			}

			list, err := s.List(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 2 || list[0].ID != other.ID || list[1].ID != r.ID {
				t.Fatalf("List: %+v", list)
			}
			if o := list[0]; o.Steps != 0 || o.FinalLoss != nil || o.Status != Running || o.EndedAt != nil {
				t.Errorf("run without steps: %+v", o)
			}
			sm := list[1]
			// Means over the steps after the first: tokens/s 2000, 3000; MFU 5, 7.5.
			if sm.Steps != 3 || sm.LastStep != 3 || *sm.FinalLoss != 3.5 || *sm.MeanTokensPerSec != 2500 || *sm.MeanMFU != 6.25 || *sm.PeakMemGiB != 0.75 {
				t.Errorf("summary: steps %d last %d loss %v tps %v mfu %v mem %v", sm.Steps, sm.LastStep, *sm.FinalLoss, *sm.MeanTokensPerSec, *sm.MeanMFU, *sm.PeakMemGiB)
			}
			if one, err := s.List(ctx, 1); err != nil || len(one) != 1 || one[0].ID != other.ID {
				t.Errorf("List(1): %v %+v", err, one)
			}
			if sums, err := s.Summaries(ctx, []string{r.ID, "20261201-11"}); err != nil || len(sums) != 2 || sums[0].ID != r.ID || sums[1].ID != other.ID {
				t.Errorf("Summaries: %v %+v", err, sums)
			}

			for _, c := range []struct{ id, err string }{
				{"2026", "ambiguous"},
				{"nope", "no such run"},
				{"", "empty"},
			} {
				if _, err := s.Get(ctx, c.id); err == nil || !strings.Contains(err.Error(), c.err) {
					t.Errorf("Get(%q): %v, want %q", c.id, err, c.err)
				}
			}
			if _, err := s.Get(ctx, "nope"); !errors.Is(err, ErrNotFound) {
				t.Errorf("Get(nope) = %v, want ErrNotFound", err)
			}
		})
	}
}

// TestNonFinite: a NaN or infinite figure survives on PostgreSQL and
// reads back as NaN from SQLite (which stores NaN as NULL), and never
// breaks a summary.
func TestNonFinite(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := ctxT(t)
			s := openT(t, b.fresh(t))
			r := testRun("r1", time.Now())
			if err := s.PutRun(ctx, r); err != nil {
				t.Fatal(err)
			}
			rec := metrics.Record{Step: 1, Loss: math.NaN(), GradNorm: math.Inf(1)}
			if err := s.PutSteps(ctx, r.ID, []metrics.Record{rec}); err != nil {
				t.Fatal(err)
			}
			got, err := s.Steps(ctx, r.ID)
			if err != nil || len(got) != 1 {
				t.Fatal(err, got)
			}
			if !math.IsNaN(got[0].Loss) || !math.IsInf(got[0].GradNorm, 1) {
				t.Errorf("loss %v grad_norm %v, want NaN and +Inf", got[0].Loss, got[0].GradNorm)
			}
			sums, err := s.List(ctx, 0)
			if err != nil || len(sums) != 1 || sums[0].FinalLoss != nil {
				t.Errorf("List: %v %+v", err, sums)
			}
		})
	}
}

// TestMigrate: a new database migrates from version 0 to SchemaVersion;
// opening it again, or migrating concurrently, changes nothing; a later
// migration upgrades it in place keeping its rows; a database newer than
// this titan is refused.
func TestMigrate(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := ctxT(t)
			target := b.fresh(t)
			var wg sync.WaitGroup
			errs := make([]error, 3)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := Open(ctx, target)
					if err == nil {
						s.Close()
					}
					errs[i] = err
				}()
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatalf("concurrent Open: %v", err)
				}
			}
			s := openT(t, target)
			if v, err := s.Version(ctx); err != nil || v != SchemaVersion() {
				t.Fatalf("version %d (%v), want %d", v, err, SchemaVersion())
			}
			var rows int
			if err := s.DB().QueryRowContext(ctx, "SELECT count(*) FROM schema_version").Scan(&rows); err != nil || rows != 1 {
				t.Errorf("schema_version has %d rows (%v), want 1", rows, err)
			}
			if err := s.PutRun(ctx, testRun("kept", time.Now())); err != nil {
				t.Fatal(err)
			}

			// A version 2 that adds a column, run twice.
			next := append(append([]migration{}, migrations...), migration{
				version:  SchemaVersion() + 1,
				sqlite:   []string{`ALTER TABLE runs ADD COLUMN note TEXT`},
				postgres: []string{`ALTER TABLE runs ADD COLUMN note text`},
			})
			for i := 0; i < 2; i++ {
				if err := s.migrate(ctx, next); err != nil {
					t.Fatalf("upgrade %d: %v", i, err)
				}
			}
			if v, _ := s.Version(ctx); v != SchemaVersion()+1 {
				t.Errorf("after the upgrade: version %d", v)
			}
			var note sql.NullString
			if err := s.DB().QueryRowContext(ctx, s.q("SELECT note FROM runs WHERE run_id = ?"), "kept").Scan(&note); err != nil {
				t.Errorf("row after the upgrade: %v", err)
			}
			// This titan's migrations do not know version 2.
			s.Close()
			if _, err := Open(ctx, target); !errors.Is(err, ErrNewerSchema) {
				t.Errorf("Open of a newer schema: %v, want ErrNewerSchema", err)
			}
		})
	}
}

// TestMigrateFailureRollsBack: a migration that fails leaves the database
// at its version, without the half-made tables.
func TestMigrateFailureRollsBack(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, filepath.Join(t.TempDir(), "runs.db"))
	bad := append(append([]migration{}, migrations...), migration{
		version: SchemaVersion() + 1,
		sqlite:  []string{`CREATE TABLE half (x INTEGER)`, `THIS IS NOT SQL`},
	})
	if err := s.migrate(ctx, bad); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("schema version %d", SchemaVersion()+1)) {
		t.Fatalf("bad migration: %v", err)
	}
	if v, _ := s.Version(ctx); v != SchemaVersion() {
		t.Errorf("version %d after a failed migration", v)
	}
	if _, err := s.DB().ExecContext(ctx, "SELECT * FROM half"); err == nil {
		t.Error("table half survived the rollback")
	}
}

// TestOpenExisting: readers do not create a store.
func TestOpenExisting(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "runs.db")
	if _, err := OpenExisting(ctxT(t), p); !errors.Is(err, ErrNoStore) {
		t.Fatalf("OpenExisting of a missing file: %v", err)
	}
	openT(t, p)
	s, err := OpenExisting(ctxT(t), p)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestTarget(t *testing.T) {
	for _, c := range []struct {
		name, db string
		env      map[string]string
		want     string
		err      string
	}{
		{"metrics.db wins", "/a/runs.db", map[string]string{"TITAN_DB": "/b.db", "HOME": "/home/u"}, "/a/runs.db", ""},
		{"TITAN_DB", "", map[string]string{"TITAN_DB": "postgres://u@h/db", "HOME": "/home/u"}, "postgres://u@h/db", ""},
		{"XDG_DATA_HOME", "", map[string]string{"XDG_DATA_HOME": "/x", "HOME": "/home/u"}, "/x/titan/runs.db", ""},
		{"HOME", "", map[string]string{"HOME": "/home/u"}, "/home/u/.local/share/titan/runs.db", ""},
		{"nothing", "", nil, "", "neither XDG_DATA_HOME nor HOME"},
		{"bad scheme", "mysql://h/db", nil, "", "metrics.db: \"mysql://h/db\": unsupported scheme mysql://"},
		{"bad env scheme", "", map[string]string{"TITAN_DB": "sqlite://x"}, "", "TITAN_DB: \"sqlite://x\": unsupported scheme"},
		{"postgresql", "postgresql://h/db", nil, "postgresql://h/db", ""},
		{"question mark", "/a?b.db", nil, "", "may not contain"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Target(c.db, func(k string) string { return c.env[k] })
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Errorf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Errorf("Target = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestStatusOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Status
	}{
		{nil, Finished},
		{context.Canceled, Interrupted},
		{fmt.Errorf("step 3: %w", context.Canceled), Interrupted},
		{errors.New("step 2: loss is NaN"), Failed},
	} {
		if got := StatusOf(c.err); got != c.want {
			t.Errorf("StatusOf(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

func TestRedact(t *testing.T) {
	for _, u := range []string{"postgres://u:secret@h:5432/db", "postgresql://u@h/db?sslmode=disable&password=secret"} {
		if got := Redact(u); strings.Contains(got, "secret") || !strings.Contains(got, "xxxxx") {
			t.Errorf("Redact(%s) = %s", u, got)
		}
	}
	if got := Redact("/a/runs.db"); got != "/a/runs.db" {
		t.Errorf("Redact(path) = %s", got)
	}
}

// benchStore is a SQLite store holding 100k steps: 10 runs of 10,000.
func benchStore(b *testing.B) *Store {
	b.Helper()
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "runs.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	fill(b, s, 10, 10000)
	return s
}

// fill records runs runs of n steps each, 100 steps per transaction.
func fill(b *testing.B, s *Store, runs, n int) {
	ctx := context.Background()
	for r := 0; r < runs; r++ {
		id := fmt.Sprintf("run-%d", r)
		if err := s.PutRun(ctx, testRun(id, time.Now())); err != nil {
			b.Fatal(err)
		}
		recs := testSteps(n)
		for i := 0; i < n; i += 100 {
			if err := s.PutSteps(ctx, id, recs[i:i+100]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkStoreInsert100k: 100k metric rows through PutSteps (upserts, 100
// per transaction) into SQLite, 10 runs of 10,000 steps.
func BenchmarkStoreInsert100k(b *testing.B) {
	for i := 0; i < b.N; i++ {
		s, err := Open(context.Background(), filepath.Join(b.TempDir(), "runs.db"))
		if err != nil {
			b.Fatal(err)
		}
		fill(b, s, 10, 10000)
		s.Close()
	}
	b.ReportMetric(1e5*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkStoreAggregate: a grouped aggregate over 100k metric rows, and
// List's summaries of the 10 runs.
func BenchmarkStoreAggregate(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	b.Run("group-by", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			rows, err := s.DB().QueryContext(ctx, `SELECT run_id, count(*), min(loss), avg(tokens_per_sec), max(mem_gib), avg(val_loss) FROM metrics GROUP BY run_id`)
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for rows.Next() {
				n++
			}
			rows.Close()
			if n != 10 {
				b.Fatalf("%d groups", n)
			}
		}
	})
	b.Run("list", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if runs, err := s.List(ctx, 0); err != nil || len(runs) != 10 {
				b.Fatal(err, len(runs))
			}
		}
	})
}

// TestReconcile: a running run whose process on this host is gone, and one
// without a heartbeat for longer than StaleAfter (another host), are marked
// interrupted with the reason; a live run and a finished one are left as
// they are; a late heartbeat revives a run taken for dead.
func TestReconcile(t *testing.T) {
	dead := exec.Command(os.Args[0], "-test.run=^$")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := ctxT(t)
			s := openT(t, b.fresh(t))
			killed := testRun("killed", now.Add(-time.Minute))
			killed.Host, killed.PID = "here", dead.Process.Pid
			silent := testRun("silent", now.Add(-time.Hour))
			silent.Host, silent.PID = "elsewhere", 1234
			live := testRun("live", now.Add(-time.Hour))
			live.Host, live.PID = "here", os.Getpid()
			done := testRun("done", now.Add(-time.Hour))
			done.Host, done.PID = "here", dead.Process.Pid
			for _, r := range []Run{killed, silent, live, done} {
				if err := s.PutRun(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			beat := now.Add(-time.Minute)
			if err := s.apply(ctx, []event{{Kind: "beat", RunID: "live", At: &beat}}); err != nil {
				t.Fatal(err)
			}
			if err := s.EndRun(ctx, "done", Finished, "", now.Add(-30*time.Minute)); err != nil {
				t.Fatal(err)
			}
			n, err := s.Reconcile(ctx, "here", now, StaleAfter)
			if err != nil || n != 2 {
				t.Fatalf("Reconcile marked %d (%v), want 2", n, err)
			}
			for id, want := range map[string]struct {
				status Status
				reason string
			}{
				"killed": {Interrupted, fmt.Sprintf("(pid %d on here) is gone", dead.Process.Pid)},
				"silent": {Interrupted, "no heartbeat from the recording process (pid 1234 on elsewhere) since"},
				"live":   {Running, ""},
				"done":   {Finished, ""},
			} {
				r, err := s.Get(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if r.Status != want.status || !strings.Contains(r.Error, want.reason) || (want.reason == "") != (r.Error == "") {
					t.Errorf("%s: status %s, error %q; want %s with %q", id, r.Status, r.Error, want.status, want.reason)
				}
				if id == "killed" && (r.EndedAt == nil || r.EndedAt.Sub(killed.StartedAt).Abs() > time.Millisecond) {
					t.Errorf("killed: ended_at %v, want its last heartbeat %v", r.EndedAt, killed.StartedAt)
				}
			}
			late := now
			if err := s.apply(ctx, []event{{Kind: "beat", RunID: "silent", At: &late}}); err != nil {
				t.Fatal(err)
			}
			if r, _ := s.Get(ctx, "silent"); r.Status != Running || r.Error != "" || r.EndedAt != nil || r.Heartbeat == nil {
				t.Errorf("after a late heartbeat: %+v", r)
			}
			if n, err := s.Reconcile(ctx, "here", now, StaleAfter); err != nil || n != 0 {
				t.Errorf("second Reconcile marked %d (%v), want 0", n, err)
			}
		})
	}
}

// TestLineage: a job's runs (interrupted, resumed, then restarted by an
// elastic round) come back oldest first with the steps each trained; a
// fresh start in the same folder begins another job, a run of another
// folder is in none, and a run recorded without its resume step is
// taken to continue; titan runs show lists the job's runs, marking the
// one shown.
func TestLineage(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := ctxT(t)
			s := openT(t, b.fresh(t))
			t0 := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
			steps := testSteps(9)
			for i, tc := range []struct {
				id, dir    string
				resumed    int // -1: not recorded
				first, end int // logged
			}{
				{"20261207-060000-aaaa", "/job", 0, 1, 3},
				{"20261207-060100-bbbb", "/other", 0, 1, 9},
				{"20261207-060200-cccc", "/job", 3, 4, 6},
				{"20261207-060300-dddd", "/job", 6, 8, 9},
				{"20261207-060400-eeee", "/job", 0, 1, 2},
				{"20261207-060500-ffff", "/job", -1, 3, 4},
			} {
				r := testRun(tc.id, t0.Add(time.Duration(i)*time.Minute))
				r.DumpFolder = tc.dir
				if tc.resumed >= 0 {
					r.ResumedFrom = &tc.resumed
				}
				if err := s.PutRun(ctx, r); err != nil {
					t.Fatal(err)
				}
				if err := s.PutSteps(ctx, r.ID, steps[tc.first-1:tc.end]); err != nil {
					t.Fatal(err)
				}
			}
			for id, want := range map[string][]string{
				"20261207-060200-cccc": {"aaaa 1-3", "cccc 4-6", "dddd 7-9"},
				"20261207-060000-aaaa": {"aaaa 1-3", "cccc 4-6", "dddd 7-9"},
				"20261207-060400-eeee": {"eeee 1-2", "ffff 3-4"},
				"20261207-060100-bbbb": {"bbbb 1-9"},
			} {
				got, err := s.Lineage(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				var have []string
				for _, g := range got {
					have = append(have, fmt.Sprintf("%s %s", g.ID[len(g.ID)-4:], trainedSteps(g)))
				}
				if !slices.Equal(have, want) {
					t.Errorf("lineage of %s: %v, want %v", id, have, want)
				}
			}
			var buf bytes.Buffer
			if err := Show(ctx, &buf, s, "20261207-060300-dddd", ShowOptions{}); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			if !strings.Contains(out, "the job's 3 runs in this dump folder") || !regexp.MustCompile(`dddd +\S+ +7-9 +.*\(this run\)`).MatchString(out) ||
				!regexp.MustCompile(`aaaa +\S+ +1-3 `).MatchString(out) || strings.Contains(out, "bbbb") || strings.Contains(out, "eeee") ||
				!strings.Contains(out, "7-9 of 3 trained (resumed from step 6), 2 logged") {
				t.Errorf("runs show:\n%s", out)
			}
			buf.Reset()
			if err := Show(ctx, &buf, s, "20261207-060100-bbbb", ShowOptions{}); err != nil || strings.Contains(buf.String(), "runs in this dump folder") {
				t.Errorf("runs show of a job of one run lists a lineage: %v\n%s", err, buf.String())
			}
		})
	}
}
