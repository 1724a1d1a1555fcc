//go:build !cgo

package cuda

import (
	"context"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/cudart"
)

// NCCLGroup is an NCCL communicator (unavailable without cgo).
type NCCLGroup struct{}

// NewNCCLGroup returns cudart.ErrNoCgo.
func NewNCCLGroup(ctx context.Context, b *Backend, store comm.Store, name string, rank, size int) (*NCCLGroup, error) {
	return nil, cudart.ErrNoCgo
}
