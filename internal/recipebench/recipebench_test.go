package recipebench

import (
	"math"
	"testing"

	"github.com/titan-go/titan/internal/metrics"
)

// TestLossAt interpolates linearly in tokens and clamps at the ends.
func TestLossAt(t *testing.T) {
	c := []Point{{100, 8}, {200, 6}, {300, 5}}
	for _, tc := range []struct {
		tokens int64
		want   float64
	}{{50, 8}, {100, 8}, {150, 7}, {200, 6}, {250, 5.5}, {400, 5}} {
		if got := lossAt(c, tc.tokens); got != tc.want {
			t.Errorf("lossAt(%d) = %g, want %g", tc.tokens, got, tc.want)
		}
	}
	if !math.IsNaN(lossAt(nil, 1)) {
		t.Error("an empty curve has a loss")
	}
}

// TestSummarize: means skip the first (start-up) step, memory is the
// peak, and equalize compares at the tokens every run reached.
func TestSummarize(t *testing.T) {
	a := summarize([]metrics.Record{
		{Step: 1, Loss: 8, TokensPerSec: 10, MFU: 1, MemGiB: 1, Tokens: 100},
		{Step: 2, Loss: 6, TokensPerSec: 100, MFU: 10, MemGiB: 3, Tokens: 200},
		{Step: 3, Loss: 4, TokensPerSec: 200, MFU: 20, MemGiB: 2, Tokens: 300},
	})
	if a.TokensPerSec != 150 || a.MFU != 15 || a.MemGiB != 3 || a.FinalLoss != 4 || a.Steps != 3 || a.Tokens != 300 {
		t.Errorf("summary %+v", a)
	}
	b := summarize([]metrics.Record{{Step: 1, Loss: 9, Tokens: 50}, {Step: 2, Loss: 7, Tokens: 250}})
	rs := []Result{a, b}
	equalize(rs)
	if rs[0].EqualTokens != 250 || rs[0].LossAtEqualTokens != 5 || rs[1].LossAtEqualTokens != 7 {
		t.Errorf("at equal tokens: %d, %g and %g; want 250, 5 and 7", rs[0].EqualTokens, rs[0].LossAtEqualTokens, rs[1].LossAtEqualTokens)
	}
}

// TestRunID finds the run store's id in a training log.
func TestRunID(t *testing.T) {
	log := "titan: llama3 debug\n[rank 0] titan: run 20261201-102653-3fa9, recording to /x/runs.db (spooled into the dump folder while it cannot be reached)\nstep 1\n"
	if got := runID(log); got != "20261201-102653-3fa9" {
		t.Errorf("runID = %q", got)
	}
	if got := runID("no store\n"); got != "" {
		t.Errorf("runID of a log without a store = %q", got)
	}
}
