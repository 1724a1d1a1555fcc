//go:build !cgo

package cuda

import (
	"fmt"

	"github.com/titan-go/titan/internal/cudart"
)

// Props are a GPU's properties.
type Props struct {
	Ordinal        int
	Name           string
	Major, Minor   int
	SMs            int
	ClockKHz       int
	MemoryBytes    int64
	DriverVersion  int
	KernelsCached  bool
	KernelCacheKey string
}

// Open fails: the CUDA backend needs cgo.
func Open(ordinal int, opt Options) (*Backend, error) {
	return nil, fmt.Errorf("%w: %v", ErrNoGPU, cudart.ErrNoCgo)
}

// Properties reports no GPU.
func (b *Backend) Properties() (Props, bool) { return Props{}, false }

// Stream is 0 without a GPU.
func (b *Backend) Stream() uintptr { return 0 }
