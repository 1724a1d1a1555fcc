package runstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/testenv"
)

// fastOptions retry and flush quickly, for tests.
func fastOptions(target, spool string) Options {
	return Options{Target: target, Spool: spool, Batch: 4, Interval: 5 * time.Millisecond,
		RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond, OpTimeout: 5 * time.Second}
}

// unreachableStore is a SQLite target under a file (blocker) where a
// folder should be, so that the store cannot be opened until blocker is
// removed, and the spool in the run's folder dir.
func unreachableStore(t *testing.T) (dir, blocker, target, spool string) {
	t.Helper()
	dir = t.TempDir()
	blocker = filepath.Join(dir, "blocker")
	if err := os.WriteFile(blocker, []byte("not a folder"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, blocker, filepath.Join(blocker, "runs.db"), filepath.Join(dir, SpoolFile)
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// spoolLines is the number of lines of the spool file (0 when absent).
func spoolLines(path string) int {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return bytes.Count(raw, []byte("\n"))
}

// checkRecorded requires that run id is in the store with status and
// exactly the steps 1..n of testSteps(n).
func checkRecorded(t *testing.T, target, id string, status Status, n int) {
	t.Helper()
	s := openT(t, target)
	r, err := s.Get(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != status || r.EndedAt == nil && status != Running {
		t.Errorf("run %s: status %s, ended %v; want %s", id, r.Status, r.EndedAt, status)
	}
	var rows int
	if err := s.DB().QueryRowContext(ctxT(t), s.q(`SELECT count(*) FROM metrics WHERE run_id = ?`), id).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	got, err := s.Steps(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rows != n || !reflect.DeepEqual(got, testSteps(n)) {
		t.Errorf("run %s: %d metric rows, steps %v; want each of steps 1..%d once", id, rows, stepNumbers(got), n)
	}
}

func stepNumbers(rs []metrics.Record) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = r.Step
	}
	return out
}

// TestRecorderSpoolsAndFlushes: while the SQLite file cannot be opened
// (its folder is a regular file), records go to the spool; once it can,
// the spool reaches the store with every record exactly once — on the
// writer's next retry during the run, or at the next run in the same dump
// folder (and a spool replayed twice changes nothing).
func TestRecorderSpoolsAndFlushes(t *testing.T) {
	for _, mode := range []string{"retry during the run", "next run"} {
		t.Run(mode, func(t *testing.T) {
			_, blocker, target, spool := unreachableStore(t)
			opt := fastOptions(target, spool)
			steps := testSteps(20)

			rec := Start(testRun("run1", time.Now()), opt)
			for _, s := range steps[:10] {
				rec.Step(s)
			}
			waitFor(t, "the spool", func() bool { return spoolLines(spool) >= 11 })
			if mode == "retry during the run" {
				os.Remove(blocker)
			}
			for _, s := range steps[10:] {
				rec.Step(s)
			}
			res, err := rec.Close(Finished, "", 5*time.Second)
			notes := strings.Join(rec.Notes(), "\n")
			if !strings.Contains(notes, "unavailable") {
				t.Errorf("notes lack the store's failure:\n%s", notes)
			}
			if mode == "retry during the run" {
				if err != nil || res.Spooled != 0 || res.Stored != 22 {
					t.Fatalf("Close: %+v, %v; want 22 events stored", res, err)
				}
				if !strings.Contains(notes, "is back") {
					t.Errorf("notes lack the store's return:\n%s", notes)
				}
				checkRecorded(t, target, "run1", Finished, 20)
				if _, err := os.Stat(spool); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("spool left behind: %v", err)
				}
				return
			}
			if err == nil || res.Spooled != 22 || !strings.Contains(err.Error(), spool) {
				t.Fatalf("Close with the store down: %+v, %v; want 22 events spooled to %s", res, err, spool)
			}
			if n := spoolLines(spool); n != 22 {
				t.Fatalf("spool has %d lines, want 22", n)
			}
			saved, _ := os.ReadFile(spool)

			// The next run in the same folder, with the store back.
			os.Remove(blocker)
			for i, want := range []int{22, 22} {
				id := fmt.Sprintf("run%d", i+2)
				rec := Start(testRun(id, time.Now()), opt)
				for _, s := range steps[:2] {
					rec.Step(s)
				}
				res, err := rec.Close(Finished, "", 5*time.Second)
				if err != nil || res.Replayed != want || res.Stored != 4 {
					t.Fatalf("%s: %+v, %v; want the earlier 22 events replayed", id, res, err)
				}
				checkRecorded(t, target, "run1", Finished, 20)
				checkRecorded(t, target, id, Finished, 2)
				if _, err := os.Stat(spool); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("spool left behind: %v", err)
				}
				// Replay the same spool again: nothing changes.
				os.WriteFile(spool, saved, 0o644)
			}
		})
	}
}

// TestRecorderPostgresStoppedMidRun: PostgreSQL stops after 10 steps and
// comes back after 20; the run's 30 steps and its end are stored exactly
// once, and the spool is gone.
func TestRecorderPostgresStoppedMidRun(t *testing.T) {
	pg := testenv.Postgres(t)
	spool := filepath.Join(t.TempDir(), SpoolFile)
	rec := Start(testRun("pg-run", time.Now()), fastOptions(pg.URL, spool))
	steps := testSteps(30)
	reader := openT(t, pg.URL)
	stored := func(n int) func() bool {
		return func() bool {
			var rows int
			err := reader.DB().QueryRow(`SELECT count(*) FROM metrics WHERE run_id = 'pg-run'`).Scan(&rows)
			return err == nil && rows == n
		}
	}
	for _, s := range steps[:10] {
		rec.Step(s)
	}
	waitFor(t, "10 steps in PostgreSQL", stored(10))
	reader.Close()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, s := range steps[10:20] {
		rec.Step(s)
	}
	waitFor(t, "10 spooled steps", func() bool { return spoolLines(spool) >= 10 })
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	for _, s := range steps[20:] {
		rec.Step(s)
	}
	res, err := rec.Close(Finished, "", 20*time.Second)
	if err != nil || res.Spooled != 0 || res.Stored != 32 {
		t.Fatalf("Close: %+v, %v; want all 32 events stored", res, err)
	}
	notes := strings.Join(rec.Notes(), "\n")
	if !strings.Contains(notes, "unavailable") || !strings.Contains(notes, "is back") {
		t.Errorf("notes:\n%s", notes)
	}
	checkRecorded(t, pg.URL, "pg-run", Finished, 30)
	if _, err := os.Stat(spool); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("spool left behind: %v", err)
	}
}

// TestRecorderCloseDeadline: against a server that accepts connections and
// never answers, Close returns within its deadline with everything in the
// spool, synced.
func TestRecorderCloseDeadline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	target := fmt.Sprintf("postgres://titan@%s/db?sslmode=disable&connect_timeout=600", l.Addr())
	sp := filepath.Join(t.TempDir(), SpoolFile)
	rec := Start(testRun("stuck", time.Now()), fastOptions(target, sp))
	for _, s := range testSteps(5) {
		rec.Step(s)
	}
	time.Sleep(20 * time.Millisecond) // let the writer start its attempt
	start := time.Now()
	res, err := rec.Close(Failed, "boom", 300*time.Millisecond)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v with a 300ms deadline", d)
	}
	if err == nil || res.Spooled != 7 || spoolLines(sp) != 7 {
		t.Fatalf("Close: %+v, %v, spool %d lines; want 7 events spooled", res, err, spoolLines(sp))
	}
	evs, bad, err := (&spool{path: sp}).read()
	if err != nil || bad != 0 || evs[6].Kind != "end" || evs[6].End.Status != Failed || evs[6].End.Error != "boom" {
		t.Errorf("spooled end: %+v, %d bad, %v", evs[len(evs)-1], bad, err)
	}
}

// TestStepNeverBlocks: with the queue full, Step drops the record at once.
func TestStepNeverBlocks(t *testing.T) {
	r := &Recorder{id: "x", ch: make(chan event, 4)} // no writer draining it
	start := time.Now()
	for _, s := range testSteps(100) {
		r.Step(s)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("100 Steps into a full queue took %v", d)
	}
	if len(r.ch) != 4 || r.dropped.Load() != 96 {
		t.Errorf("queued %d, dropped %d; want 4 and 96", len(r.ch), r.dropped.Load())
	}
	var nilRec *Recorder
	nilRec.Step(metrics.Record{}) // a nil Recorder records nothing
}

// TestSpoolSkipsTornLine: a line cut short (a crash mid-write) is skipped;
// the others are replayed.
func TestSpoolSkipsTornLine(t *testing.T) {
	p := filepath.Join(t.TempDir(), SpoolFile)
	sp := &spool{path: p}
	r := testRun("torn", time.Now())
	st := testSteps(1)[0]
	if err := sp.append([]event{{Kind: "run", RunID: r.ID, Run: &r}, {Kind: "step", RunID: r.ID, Step: &st}}); err != nil {
		t.Fatal(err)
	}
	sp.close()
	f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"kind":"step","run_id":"torn","st`)
	f.Close()
	evs, bad, err := sp.read()
	if err != nil || bad != 1 || len(evs) != 2 {
		t.Fatalf("read: %d events, %d bad, %v", len(evs), bad, err)
	}
	target := filepath.Join(t.TempDir(), "runs.db")
	s := openT(t, target)
	if err := s.apply(ctxT(t), evs); err != nil {
		t.Fatal(err)
	}
	checkRecorded(t, target, "torn", Running, 1)
}

// BenchmarkRecorderStep is what recording costs the training loop per
// logged step: one Step, with the writer storing to SQLite behind it. (A
// loop that does nothing else outruns the writer, so records are dropped
// once the queue fills; the training loop logs at most once a step.)
func BenchmarkRecorderStep(b *testing.B) {
	rec := Start(testRun("bench", time.Now()), Options{Target: filepath.Join(b.TempDir(), "runs.db"), Spool: filepath.Join(b.TempDir(), SpoolFile), Queue: 1 << 20})
	r := testSteps(1)[0]
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.Step = i + 1
		rec.Step(r)
	}
	b.StopTimer()
	res, _ := rec.Close(Finished, "", time.Minute)
	if res.Stored+res.Dropped != b.N+2 || res.Spooled != 0 {
		b.Fatalf("%d steps: %+v", b.N, res)
	}
	b.ReportMetric(float64(res.Dropped)/float64(b.N), "dropped/op")
}

// TestFlushSpool: a run spooled while its store was unreachable is
// written by FlushSpool without another run, once (flushing again finds
// nothing), and the spool is removed.
func TestFlushSpool(t *testing.T) {
	dir, blocker, target, spool := unreachableStore(t)
	rec := Start(testRun("run1", time.Now()), fastOptions(target, spool))
	for _, s := range testSteps(5) {
		rec.Step(s)
	}
	if res, err := rec.Close(Finished, "", 5*time.Second); err == nil || res.Spooled == 0 {
		t.Fatalf("Close with the store down: %+v, %v; want events spooled", res, err)
	}
	os.Remove(blocker)
	n, bad, err := FlushSpool(context.Background(), target, dir)
	if err != nil || n != 7 || bad != 0 {
		t.Fatalf("FlushSpool: %d events, %d bad, %v; want the run's 7 (start, 5 steps, end)", n, bad, err)
	}
	checkRecorded(t, target, "run1", Finished, 5)
	if _, err := os.Stat(spool); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("spool left behind: %v", err)
	}
	if n, _, err := FlushSpool(context.Background(), target, dir); err != nil || n != 0 {
		t.Errorf("flushing again: %d events, %v; want none", n, err)
	}
}
