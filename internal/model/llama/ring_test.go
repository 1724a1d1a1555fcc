package llama

import (
	"math"
	"runtime"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/model"
)

// loopRing is a ParallelComm whose ring shift hands a rank its own
// block back, as a ring of identical ranks would: it allocates nothing,
// so the allocations counted are the model's.
type loopRing struct{ planOnlyComm }

func (loopRing) RingShiftAsync(send, recv []float32) func() error {
	copy(recv, send)
	return func() error { return nil }
}

// planOnlyComm fails every collective but the one a test overrides.
type planOnlyComm struct{}

func (planOnlyComm) AllGatherSeq(send, recv []float32) error     { panic("unused") }
func (planOnlyComm) ReduceScatterSeq(send, recv []float32) error { panic("unused") }
func (planOnlyComm) AllReduceTP(x []float32, max bool) error     { panic("unused") }

// allocBytesPerRun is the heap bytes one call of f allocates: the least
// average over three batches of runs calls, after a warm-up call, so
// that the one-time growth of the backend's per-worker scratch (a worker
// that picks up a kind of block for the first time) does not count.
func allocBytesPerRun(runs int, f func()) float64 {
	f()
	least := math.Inf(1)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			f()
		}
		runtime.ReadMemStats(&after)
		least = min(least, float64(after.TotalAlloc-before.TotalAlloc)/float64(runs))
	}
	return least
}

// TestRingAttentionDoesNotAllocate checks that ring attention's forward
// and backward stage their key/value rotations in the buffer New
// allocated (counted by HostBytesFor, which memplan adds), so that no
// garbage grows the heap step after step: a forward and backward
// allocate less than 1/16 of that buffer (before, each allocated about
// twice its size). What is left are small objects of the backend's
// interface (the host slices boxed by Upload and Download, the kernels'
// closures), which testing.AllocsPerRun counts one by one but which do
// not scale with the blocks.
func TestRingAttentionDoesNotAllocate(t *testing.T) {
	cfg := parallelTestConfig()
	cfg.MaxSeqLen = 2048
	for _, cp := range []int{2, 4} {
		plan := Plan{CP: cp, Comm: loopRing{}}
		m, err := New(cpu.New(1), cfg, 1, 2048, plan)
		if err != nil {
			t.Fatal(err)
		}
		a := &m.layers[0]
		got := allocBytesPerRun(4, func() {
			if err := m.attention(a); err != nil {
				t.Fatal(err)
			}
			if err := m.attentionBackward(a, m.dv); err != nil {
				t.Fatal(err)
			}
		})
		ring := float64(len(m.ring) * 4)
		if got > ring/16 {
			t.Errorf("cp %d: ring attention allocates %.0f bytes per forward and backward; its buffer is %.0f", cp, got, ring)
		}
		staging, own, err := HostBytesFor(cfg, 1, 2048, plan)
		if err != nil {
			t.Fatal(err)
		}
		if staging != int64(len(m.ring))*4 || own != int64(len(m.hLoss))*4 || len(m.ring) != m.ringHostLen() {
			t.Errorf("cp %d: HostBytesFor %d + %d, the model holds %d + %d", cp, staging, own, len(m.ring)*4, len(m.hLoss)*4)
		}
		// Models sharing a rank's staging memory share the ring buffer.
		plan.Host = &model.HostScratch{}
		m1, err1 := New(cpu.New(1), cfg, 1, 2048, plan)
		m2, err2 := New(cpu.New(1), cfg, 1, 2048, plan)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if &m1.ring[0] != &m2.ring[0] {
			t.Errorf("cp %d: two models of one HostScratch have their own ring buffers", cp)
		}
	}
}
