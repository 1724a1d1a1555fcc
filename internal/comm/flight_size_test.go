package comm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestFlightSize: the recorder keeps the last FlightSize operations, and a
// negative size (comm.trace_buf_size = 0, through FlightSizeOf) records
// nothing and dumps nothing.
func TestFlightSize(t *testing.T) {
	const ops = 6
	tests := []struct {
		traceBufSize int
		want         func(n int) bool
		desc         string
	}{
		{3, func(n int) bool { return n == 3 }, "exactly 3"},
		{1000, func(n int) bool { return n >= ops }, fmt.Sprintf("at least %d", ops)},
		{0, func(n int) bool { return n == 0 }, "none"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint("trace_buf_size=", tc.traceBufSize), func(t *testing.T) {
			dir := t.TempDir()
			opts := testOpts("auto")
			opts.FlightSize = FlightSizeOf(tc.traceBufSize)
			runInProc(t, 2, opts, func(g Group) error {
				ctx := context.Background()
				for range ops {
					if err := g.AllReduce(ctx, F32(make([]float32, 4)), Sum); err != nil {
						return err
					}
				}
				f := g.(*group).hub.flight
				if n := len(f.snapshot("test").Entries); !tc.want(n) {
					return fmt.Errorf("recorder holds %d operations, want %s", n, tc.desc)
				}
				if err := f.write(dir, "test"); err != nil {
					return err
				}
				_, err := os.Stat(filepath.Join(dir, fmt.Sprintf("flight-rank%d.json", g.Rank())))
				if dumped := err == nil; dumped != (tc.traceBufSize > 0) {
					return fmt.Errorf("dump written = %v with trace_buf_size %d", dumped, tc.traceBufSize)
				}
				return g.Barrier(ctx)
			})
		})
	}
	if FlightSizeOf(0) >= 0 || FlightSizeOf(7) != 7 {
		t.Errorf("FlightSizeOf(0) = %d, FlightSizeOf(7) = %d", FlightSizeOf(0), FlightSizeOf(7))
	}
}
