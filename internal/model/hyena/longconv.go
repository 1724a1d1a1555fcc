package hyena

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// longConv returns be's long causal convolution (backend.LongConv:
// channel-major [B, C, L] buffers, h [C, L], y[b,c,t] = Σ_{s≤t}
// h[c, t-s]·x[b,c,s]; the backward accumulates dx and dh), or an error
// naming the backend when it has none.
func longConv(be backend.Backend) (backend.LongConv, error) {
	lc, ok := be.(backend.LongConv)
	if !ok {
		return nil, fmt.Errorf("hyena: the %s backend has no long convolution (backend.LongConv)", be.Name())
	}
	return lc, nil
}
