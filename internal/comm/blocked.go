package comm

import (
	"sync/atomic"
	"time"

	"github.com/titan-go/titan/internal/memsnap"
	"github.com/titan-go/titan/internal/trace"
)

// inFlight is the bytes of the operations issued and not finished (see
// InFlightBytes).
var inFlight memsnap.Gauge

// InFlightBytes is the size of the buffers of the operations this process
// has issued that have not completed: the communication buffers in use
// (memory snapshots sample it).
func InFlightBytes() int64 { return inFlight.Load() }

// InFlightPeak is the most InFlightBytes since its last call.
func InFlightPeak() int64 { return inFlight.TakePeak() }

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
	blocked(w.kind, start)
	return w.err
}

// blocked counts the time since start in BlockedTime and, while a trace
// records, as a wait span on the main track: a pipeline bubble for a
// point-to-point transfer, exposed communication for a collective.
func blocked(kind opKind, start time.Time) {
	now := time.Now()
	blockedNanos.Add(int64(now.Sub(start)))
	if trace.Enabled() {
		cat := trace.CatWait
		if kind == opSend || kind == opRecv {
			cat = trace.CatBubble
		}
		trace.Interval(cat, kind.String(), trace.MainTrack, start, now, 0)
	}
}

// traceOp records an executed operation on its group's track while a
// trace records, with its bytes.
func (g *group) traceOp(r *request) {
	if !trace.Enabled() || r.started.IsZero() {
		return
	}
	var bytes int64
	if r.kind != opBarrier {
		bytes = int64(r.count()) * int64(r.dtype.Size())
	}
	trace.Interval(trace.CatComm, r.kind.String(), "comm "+g.name, r.started, time.Now(), bytes)
}
