package comm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestChunkBounds(t *testing.T) {
	for _, tc := range []struct{ n, parts int }{{0, 1}, {0, 4}, {1, 4}, {3, 4}, {10, 4}, {10, 3}, {7, 7}, {1000003, 8}, {math.MaxInt32 + 11, 3}, {1 << 40, 7}} {
		prev := 0
		for i := range tc.parts {
			lo, hi := ChunkBounds(tc.n, tc.parts, i)
			// The documented formula, computed exactly.
			want := new(big.Int).Div(new(big.Int).Mul(big.NewInt(int64(i)), big.NewInt(int64(tc.n))), big.NewInt(int64(tc.parts)))
			if lo != prev || int64(lo) != want.Int64() {
				t.Errorf("ChunkBounds(%d, %d, %d) lo = %d, want %d", tc.n, tc.parts, i, lo, want)
			}
			if d := hi - lo; d != tc.n/tc.parts && d != tc.n/tc.parts+1 {
				t.Errorf("ChunkBounds(%d, %d, %d) = [%d, %d): length %d", tc.n, tc.parts, i, lo, hi, d)
			}
			if ChunkLen(tc.n, tc.parts, i) != hi-lo {
				t.Errorf("ChunkLen disagrees with ChunkBounds")
			}
			prev = hi
		}
		if prev != tc.n {
			t.Errorf("chunks of %d over %d end at %d", tc.n, tc.parts, prev)
		}
	}
}

func TestBF16Rounding(t *testing.T) {
	// Reference: round to nearest even on the exact value with big.Float.
	ref := func(f float32) uint16 {
		if f != f {
			return 0x7fc0
		}
		if a := math.Abs(float64(f)); a < 0x1p-126 {
			// Subnormal: the bfloat16 spacing is 2^-133.
			h := uint16(math.RoundToEven(a * 0x1p133))
			if f < 0 || math.Signbit(float64(f)) {
				h |= 0x8000
			}
			return h
		}
		b := new(big.Float).SetPrec(8).SetMode(big.ToNearestEven)
		b.SetFloat64(float64(f))
		g, _ := b.Float32()
		return uint16(math.Float32bits(g) >> 16)
	}
	vals := []float32{0, 1, -1, 1.00390625, 1.01171875, 3.14159, 65504, 1e-30, -2.5e20, float32(math.Inf(1)), math.MaxFloat32}
	for i := range uint32(20000) {
		vals = append(vals, math.Float32frombits(uint32(mix(7, 0, int(i)))))
	}
	for _, v := range vals {
		if math.IsNaN(float64(v)) {
			if h := Float32ToBF16(v); h&0x7f80 != 0x7f80 || h&0x7f == 0 {
				t.Errorf("Float32ToBF16(NaN %x) = %x, not a NaN", math.Float32bits(v), h)
			}
			continue
		}
		if v > 0x1.fefffep127 || v < -0x1.fefffep127 { // rounds to ±Inf: big.Float keeps the finite value
			continue
		}
		if got, want := Float32ToBF16(v), ref(v); got != want {
			t.Errorf("Float32ToBF16(%g) = %#x, want %#x", v, got, want)
		}
	}
	if BF16ToFloat32(0x3f80) != 1 || BF16ToFloat32(0xc000) != -2 {
		t.Error("BF16ToFloat32 of 1 or -2 wrong")
	}
}

func TestFoldAliasing(t *testing.T) {
	// dst may be one of the sources, at any position in the order.
	for pos := range 3 {
		srcs := make([][]float32, 3)
		for k := range srcs {
			srcs[k] = make([]float32, 1500)
			for i := range srcs[k] {
				srcs[k][i] = float32(hval(mix(3, k, i)))
			}
		}
		want := make([]float32, 1500)
		for i := range want {
			want[i] = (srcs[0][i] + srcs[1][i]) + srcs[2][i]
		}
		b := [][]byte{bytesOf(srcs[0]), bytesOf(srcs[1]), bytesOf(srcs[2])}
		fold(Float32, Sum, b[pos], b)
		for i := range want {
			if srcs[pos][i] != want[i] {
				t.Fatalf("fold into source %d: element %d = %v, want %v", pos, i, srcs[pos][i], want[i])
			}
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int{"64MiB": 64 << 20, "1GiB": 1 << 30, "4096": 4096, "4k": 4096, "2M": 2 << 20, "100MB": 100e6, "1.5KiB": 1536, "8B": 8} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "MiB", "-1", "x12", "12 parsecs"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) succeeded", bad)
		}
	}
}

func TestBusFactor(t *testing.T) {
	for _, tc := range []struct {
		op   string
		n    int
		want float64
	}{{"allreduce", 4, 1.5}, {"allreduce", 2, 1}, {"reduce_scatter", 4, 0.75}, {"all_gather", 2, 0.5}, {"all_to_all", 3, 2.0 / 3}, {"broadcast", 4, 1}, {"sendrecv", 4, 1}} {
		if got, err := BusFactor(tc.op, tc.n); err != nil || math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("BusFactor(%s, %d) = %v, %v; want %v", tc.op, tc.n, got, err, tc.want)
		}
	}
	if _, err := BusFactor("gossip", 2); err == nil {
		t.Error("BusFactor of an unknown op succeeded")
	}
}

func TestBenchCollective(t *testing.T) {
	for _, op := range BenchOps {
		runInProc(t, 2, testOpts("auto"), func(g Group) error {
			r, err := BenchCollective(context.Background(), g, op, 1<<16, 2, 1)
			if err != nil {
				return err
			}
			f, _ := BusFactor(op, 2)
			if r.Op != op || r.NProc != 2 || r.SizeBytes != 1<<16 || r.TimeS <= 0 ||
				math.Abs(r.AlgBW-float64(r.SizeBytes)/r.TimeS/1e9) > 1e-9*r.AlgBW || math.Abs(r.BusBW-r.AlgBW*f) > 1e-9*r.BusBW {
				return fmt.Errorf("inconsistent result %+v", r)
			}
			return nil
		})
	}
}

func TestStores(t *testing.T) {
	fs, err := NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]Store{"file": fs, "mem": NewMemStore()} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			got := make(chan []byte)
			go func() {
				v, err := s.Get(ctx, "a/b c")
				if err != nil {
					t.Error(err)
				}
				got <- v
			}()
			time.Sleep(20 * time.Millisecond)
			if err := s.Set(ctx, "a/b c", []byte("v1")); err != nil {
				t.Fatal(err)
			}
			if v := <-got; string(v) != "v1" {
				t.Errorf("Get = %q, want v1", v)
			}
			s.Set(ctx, "a/b c", []byte("v2"))
			if v, _ := s.Get(ctx, "a/b c"); string(v) != "v2" {
				t.Errorf("Get after overwrite = %q", v)
			}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			defer cancel()
			if _, err := s.Get(cctx, "missing"); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Get of a missing key: %v", err)
			}
		})
	}
}

func TestErrorMessage(t *testing.T) {
	e := &Error{Group: "dp", Ranks: []int{0, 1, 2, 3}, Op: "allreduce", Seq: 17, Timeout: true, After: 5 * time.Second,
		Peers: []int{2}, Err: &waitErr{waiting: []int{2}, notEntered: []int{2}, op: "allreduce", seq: 17}}
	want := "comm: allreduce #17 on group dp (ranks [0 1 2 3]) timed out after 5s waiting for rank 2 (it never entered allreduce #17)"
	if e.Error() != want {
		t.Errorf("got  %s\nwant %s", e, want)
	}
	if !errors.Is(e, ErrTimeout) {
		t.Error("timeout error does not match ErrTimeout")
	}
	d := &Error{Group: "pp", Ranks: []int{1, 5}, Op: "recv", Seq: 3, Err: &peerErr{rank: 5, kind: peerDead, reason: "connection closed without notice"}}
	if !errors.Is(d, ErrPeerDied) || !strings.Contains(d.Error(), "rank 5 died") {
		t.Errorf("dead-peer error %q", d)
	}
}

// TestAnalyzeFlight checks the analysis on hand-written dumps: on group dp
// ranks 0 and 1 wait in allreduce #8, which rank 2 never entered (last #7)
// and rank 3 (no dump) is unknown; group tp is healthy.
func TestAnalyzeFlight(t *testing.T) {
	dir := t.TempDir()
	write := func(d FlightDump) {
		b, _ := json.Marshal(d)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("flight-rank%d.json", d.Rank)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dp := func(started, completed uint64) FlightGroup {
		return FlightGroup{Group: "dp", GroupKey: "w/dp", GroupRanks: []int{0, 1, 2, 3}, LastScheduled: started, LastStarted: started, LastCompleted: completed}
	}
	tp := func(r int) FlightGroup {
		return FlightGroup{Group: "tp", GroupKey: fmt.Sprintf("w/tp%d", r/2), GroupRanks: []int{r / 2 * 2, r/2*2 + 1}, LastStarted: 4, LastCompleted: 4}
	}
	entry := FlightEntry{GroupKey: "w/dp", Seq: 8, Op: "reduce_scatter", State: StateStarted}
	write(FlightDump{Rank: 0, WorldSize: 4, Groups: []FlightGroup{dp(8, 7), tp(0)}, Entries: []FlightEntry{entry}})
	write(FlightDump{Rank: 1, WorldSize: 4, Groups: []FlightGroup{dp(8, 7), tp(1)}, Entries: []FlightEntry{entry}})
	write(FlightDump{Rank: 2, WorldSize: 4, Groups: []FlightGroup{dp(7, 7), tp(2)}})
	rep, err := AnalyzeFlight(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rep.Ranks, rep.MissingDumps) != "[0 1 2] [3]" {
		t.Errorf("ranks %v, missing dumps %v", rep.Ranks, rep.MissingDumps)
	}
	if len(rep.Stalls) != 1 {
		t.Fatalf("stalls %+v, want one", rep.Stalls)
	}
	s := rep.Stalls[0]
	if s.Group != "dp" || s.Seq != 8 || s.Op != "reduce_scatter" || fmt.Sprint(s.Waiting, s.Missing) != "[0 1] [2]" || s.LastSeq[2] != 7 {
		t.Errorf("stall %+v", s)
	}
	for _, want := range []string{"reduce_scatter #8", "never entered by rank 2 (last started #7)", "no dump from rank 3"} {
		if !strings.Contains(rep.Summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, rep.Summary)
		}
	}
	if _, err := AnalyzeFlight(t.TempDir()); err == nil {
		t.Error("AnalyzeFlight of an empty folder succeeded")
	}
}

func TestRecvTimeoutNamesPeer(t *testing.T) {
	opts := testOpts("auto")
	opts.Timeout = 300 * time.Millisecond
	runInProc(t, 2, opts, func(g Group) error {
		if g.Rank() == 1 {
			time.Sleep(600 * time.Millisecond)
			return nil
		}
		err := g.Recv(context.Background(), F32(make([]float32, 4)), 1)
		var e *Error
		if !errors.As(err, &e) || !e.Timeout || fmt.Sprint(e.Peers) != "[1]" ||
			!strings.Contains(err.Error(), "waiting for rank 1 (it never entered the matching send #1)") {
			return fmt.Errorf("recv without a send: %v", err)
		}
		return nil
	})
}

func TestWorldMissingRank(t *testing.T) {
	_, err := NewWorld(context.Background(), NewMemStore(), 0, 2, Options{InitTimeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "address of rank 1") {
		t.Fatalf("NewWorld without rank 1: %v", err)
	}
}

func TestTransportChoice(t *testing.T) {
	st := NewMemStore()
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			// Different hosts: auto picks TCP.
			g, err := NewWorld(context.Background(), st, r, 2, Options{HostID: fmt.Sprint("host", r), Timeout: 10 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			defer g.Close()
			if g.Transport() != "tcp" {
				errs <- fmt.Errorf("transport %s across hosts, want tcp", g.Transport())
				return
			}
			_, err = g.NewGroup(context.Background(), []int{0, 1}, "x")
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	st = NewMemStore()
	for r := range 2 {
		go func() {
			_, err := NewWorld(context.Background(), st, r, 2, Options{Transport: "shm", HostID: fmt.Sprint("host", r), Timeout: 10 * time.Second})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err == nil || !strings.Contains(err.Error(), "one host") {
			t.Errorf("shm across hosts: %v", err)
		}
	}
	_, err := NewWorld(context.Background(), NewMemStore(), 0, 1, Options{Transport: "carrier-pigeon"})
	if err == nil || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Errorf("unknown transport: %v", err)
	}
}

func TestSweepShm(t *testing.T) {
	dir := t.TempDir()
	dead := filepath.Join(dir, "titan-comm-4194303-00aa") // no such process (above the default pid_max)
	alive := filepath.Join(dir, fmt.Sprintf("titan-comm-%d-00bb", os.Getpid()))
	other := filepath.Join(dir, "something-else")
	for _, f := range []string{dead, alive, other} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sweepShm(dir)
	for f, want := range map[string]bool{dead: false, alive: true, other: true} {
		if _, err := os.Stat(f); (err == nil) != want {
			t.Errorf("%s exists = %v, want %v", filepath.Base(f), err == nil, want)
		}
	}
}
