package comm

import (
	"sync/atomic"
	"time"
)

// blockedNanos is the time callers spent blocked on operations (see
// BlockedTime).
var blockedNanos atomic.Int64

// BlockedTime is the total time this process's callers have spent
// blocked on communication: inside synchronous operations and in
// Work.Wait until the operation completed. A step's time minus the
// BlockedTime it added is the time the rank spent computing — what sets a
// straggler apart, since every other rank of a synchronous job waits for
// it inside its collectives. Two atomic adds per operation.
func BlockedTime() time.Duration { return time.Duration(blockedNanos.Load()) }

// waitBlocked is Wait, adding the time it blocked to BlockedTime.
func (w *Work) waitBlocked() error {
	select {
	case <-w.done:
		return w.err
	default:
	}
	start := time.Now()
	<-w.done
	blockedNanos.Add(int64(time.Since(start)))
	return w.err
}
