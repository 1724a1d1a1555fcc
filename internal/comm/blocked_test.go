package comm

import (
	"context"
	"testing"
	"time"
)

// TestBlockedTimeCountsWaits: a rank that enters a collective 150 ms
// before its peer spends those 150 ms blocked, in a synchronous call and
// in Work.Wait alike, and BlockedTime counts them.
func TestBlockedTimeCountsWaits(t *testing.T) {
	const late = 150 * time.Millisecond
	for _, async := range []bool{false, true} {
		before := BlockedTime()
		runInProc(t, 2, testOpts("tcp"), func(g Group) error {
			if err := g.Barrier(context.Background()); err != nil {
				return err
			}
			if g.Rank() == 1 {
				time.Sleep(late)
			}
			v := []float64{1}
			if async {
				return g.AllReduceAsync(context.Background(), F64(v), Sum).Wait()
			}
			return g.AllReduce(context.Background(), F64(v), Sum)
		})
		if got := BlockedTime() - before; got < late*9/10 {
			t.Errorf("async %v: BlockedTime grew by %v, want at least the %v rank 0 waited", async, got, late)
		}
	}
}
