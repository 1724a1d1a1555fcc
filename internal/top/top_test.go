package top

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/livemetrics"
)

// endpoint serves snapshot s (ok false: before the first step) the way
// the launcher does.
func endpoint(t *testing.T, s livemetrics.Snapshot, ok bool) *httptest.Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "live.json")
	if ok {
		if err := livemetrics.Write(path, s); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(livemetrics.Handler("j7", path))
	t.Cleanup(srv.Close)
	return srv
}

var snap = livemetrics.Snapshot{Time: time.Unix(1000, 0), Step: 12, Steps: 40, Loss: 3.14159, StepsPerSec: 2.5, TokensPerSec: 160, MFU: 0.75, Stragglers: 2,
	Ranks: []livemetrics.Rank{
		{Rank: 1, Host: "nodeB", StepS: 0.2, ComputeS: 0.05, MemGiB: 2},
		{Rank: 0, Host: "nodeA", StepS: 0.1, ComputeS: 0.075, MemGiB: 1.5},
		{Rank: 2, Host: "nodeA", StepS: 0.05, ComputeS: 0.05, MemGiB: 1},
	}}

// TestOnce: one scrape of the launcher's endpoint renders the job line
// and a row per rank, in rank order, with the served figures.
func TestOnce(t *testing.T) {
	srv := endpoint(t, snap, true)
	var b strings.Builder
	if err := Run(context.Background(), &b, Options{URL: srv.URL + "/metrics", Interval: time.Second, Once: true}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 || strings.Contains(out, "\033[") {
		t.Fatalf("want 2 job lines, a heading and 3 rows without escapes:\n%s", out)
	}
	if !strings.Contains(lines[0], "job j7") || lines[1] != "step 12/40  loss 3.1416  2.50 steps/s  160 tokens/s  mfu 0.75%  stragglers reported 2" {
		t.Errorf("job lines:\n%s\n%s", lines[0], lines[1])
	}
	want := []string{ // step ms, compute ms, share, GiB, bar (30 = the slowest step)
		"    0  nodeA     100.00       75.00    75.0%     1.500  " + strings.Repeat("█", 11) + strings.Repeat("░", 4),
		"    1  nodeB     200.00       50.00    25.0%     2.000  " + strings.Repeat("█", 8) + strings.Repeat("░", 22),
		"    2  nodeA      50.00       50.00   100.0%     1.000  " + strings.Repeat("█", 8),
	}
	for i, w := range want {
		if lines[3+i] != w {
			t.Errorf("row %d:\n%q\nwant\n%q", i, lines[3+i], w)
		}
	}
}

func TestRowsLimitShowsSlowest(t *testing.T) {
	srv := endpoint(t, snap, true)
	v, err := Scrape(context.Background(), http.DefaultClient, srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	Render(&b, "x", v, time.Unix(1001, 0), 2)
	out := b.String()
	if !strings.Contains(out, "updated 1.0 s ago") || !strings.Contains(out, "\n    1  nodeB") || strings.Contains(out, "\n    0  ") ||
		strings.Contains(out, "\n    2  ") || !strings.HasSuffix(out, "\n(2 faster ranks not shown)\n") {
		t.Errorf("2 rows: the slowest rank and a count:\n%s", out)
	}
	b.Reset()
	Render(&b, "x", v, time.Unix(1001, 0), 3)
	if strings.Count(b.String(), "nodeA") != 2 || strings.Contains(b.String(), "not shown") {
		t.Errorf("3 rows hold the 3 ranks:\n%s", b.String())
	}
}

func TestBeforeFirstStepAndErrors(t *testing.T) {
	srv := endpoint(t, livemetrics.Snapshot{}, false)
	var b strings.Builder
	if err := Run(context.Background(), &b, Options{URL: srv.URL + "/metrics", Interval: time.Second, Once: true}); err != nil || !strings.Contains(b.String(), "waiting for the job's first step") {
		t.Errorf("before the first step: %v\n%s", err, b.String())
	}
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("titan_job_up 1\ntitan_step{job_id=\"j\" 3\n"))
	}))
	defer bad.Close()
	if err := Run(context.Background(), &b, Options{URL: bad.URL, Interval: time.Second, Once: true}); err == nil || !strings.Contains(err.Error(), "line 2:") {
		t.Errorf("malformed exposition: %v", err)
	}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("go_goroutines 7\n")) }))
	defer other.Close()
	if err := Run(context.Background(), &b, Options{URL: other.URL, Interval: time.Second, Once: true}); err == nil || !strings.Contains(err.Error(), "not a titan metrics endpoint") {
		t.Errorf("another endpoint: %v", err)
	}
}

// syncBuilder is a strings.Builder safe for a writer and a reader.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestTerminalRedrawsInPlace: on a terminal every refresh goes home,
// clears each line's rest and below; a failed scrape is shown and
// retried; cancelling ends it without an error.
func TestTerminalRedrawsInPlace(t *testing.T) {
	srv := endpoint(t, snap, true)
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuilder{}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, out, Options{URL: srv.URL + "/metrics", Interval: 10 * time.Millisecond, Terminal: true})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(out.String(), home) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	srv.Close() // the job ended: the view says so and keeps trying
	for !strings.Contains(out.String(), "next try in") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := out.String()
	frames := strings.Split(s, home)[2:] // [0] empty, [1] the initial clear
	if len(frames) < 3 || !strings.HasSuffix(frames[0], clearDown) || !strings.Contains(frames[0], "stragglers reported 2"+clearEOL+"\n") ||
		!strings.Contains(s, "next try in 10ms") {
		t.Errorf("%d frames: %q", len(frames), s)
	}
}

func TestURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"127.0.0.1:9400", "http://127.0.0.1:9400/metrics"},
		{"localhost:1", "http://localhost:1/metrics"},
		{"http://node7:9400", "http://node7:9400/metrics"},
		{"https://node7/x/metrics", "https://node7/x/metrics"},
		{"ftp://node7", ""},
		{"", ""},
	}
	for _, tc := range tests {
		got, err := URL(tc.in)
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("URL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
