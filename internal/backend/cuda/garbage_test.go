package cuda_test

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cuda"
)

// countingDev is a device that only allocates (at made-up addresses) and
// counts its frees.
type countingDev struct {
	next  uintptr
	frees atomic.Int64
}

func (d *countingDev) Name() string { return "counting" }
func (d *countingDev) Malloc(bytes int) (uintptr, error) {
	d.next += 1 << 20
	return d.next, nil
}
func (d *countingDev) Free(uintptr) error                          { d.frees.Add(1); return nil }
func (d *countingDev) Memset(uintptr, int) error                   { return nil }
func (d *countingDev) Sync() error                                 { return nil }
func (d *countingDev) CopyHtoD(uintptr, unsafe.Pointer, int) error { panic("unused") }
func (d *countingDev) CopyDtoH(unsafe.Pointer, uintptr, int) error { panic("unused") }
func (d *countingDev) CopyDtoD(uintptr, uintptr, int) error        { panic("unused") }
func (d *countingDev) Launch(string, cuda.Dim3, cuda.Dim3, ...any) error {
	panic("unused")
}

// TestGarbageFreedAtSync: device memory whose tensors became garbage is
// freed at the next Sync, never by the collector's cleanup itself (an op
// reads its tensors' addresses and then launches on them: memory freed
// in between went to the op's own scratch, or under a running kernel).
func TestGarbageFreedAtSync(t *testing.T) {
	dev := &countingDev{}
	b := cuda.NewWithDevice(dev, cuda.Options{})
	for range 3 {
		b.Alloc(backend.Float32, 16) // garbage at once
	}
	for range 20 {
		runtime.GC()
		time.Sleep(5 * time.Millisecond) // the cleanups run meanwhile
	}
	if n := dev.frees.Load(); n != 0 {
		t.Fatalf("%d allocations freed before any Sync", n)
	}
	for deadline := time.Now().Add(10 * time.Second); dev.frees.Load() < 3 && time.Now().Before(deadline); {
		runtime.GC()
		b.Sync()
		time.Sleep(time.Millisecond)
	}
	if n := dev.frees.Load(); n != 3 {
		t.Errorf("%d of 3 garbage allocations freed by Sync", n)
	}
}
