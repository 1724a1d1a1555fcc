package comm

import (
	"errors"
	"fmt"
	"time"
)

// Error is the error of a failed operation. Its message names the group,
// the operation and its sequence number, and the peers at fault, e.g.
//
//	comm: allreduce #17 on group dp (ranks [0 1 2 3]) timed out after 5s waiting for rank 2 (it never entered allreduce #17)
//
// Ranks in Error are world ranks.
type Error struct {
	Group   string // group name
	Ranks   []int  // world ranks of the group members
	Op      string // "allreduce", "send", ...
	Seq     uint64 // sequence number of the operation in its group (p2p: per peer)
	Peers   []int  // the peers at fault, when known
	Timeout bool   // the operation timed out
	After   time.Duration
	Err     error // the cause
}

func (e *Error) Error() string {
	head := fmt.Sprintf("comm: %s #%d on group %s (ranks %v)", e.Op, e.Seq, e.Group, e.Ranks)
	if e.Timeout {
		return fmt.Sprintf("%s timed out after %v %v", head, e.After, e.Err)
	}
	return fmt.Sprintf("%s failed: %v", head, e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// ErrTimeout is matched (errors.Is) by every timeout error.
var ErrTimeout = errors.New("comm: timeout")

// ErrPeerDied is matched by errors caused by a peer process that went
// away without closing its groups.
var ErrPeerDied = errors.New("comm: peer died")

// ErrAborted is matched by errors of operations on a group that an earlier
// failure, a peer's abort or a cancelled context aborted.
var ErrAborted = errors.New("comm: group aborted")

// ErrClosed is returned by operations on a closed group.
var ErrClosed = errors.New("comm: group closed")

// waitErr is the cause of a timeout: who we were waiting for.
type waitErr struct {
	waiting    []int // world ranks
	notEntered []int // subset that never entered the operation
	op         string
	seq        uint64
}

func (w *waitErr) Error() string {
	s := "waiting for " + rankList(w.waiting)
	if len(w.notEntered) > 0 {
		it := "it"
		if len(w.notEntered) > 1 {
			it = "they"
		}
		if len(w.notEntered) == len(w.waiting) {
			s += fmt.Sprintf(" (%s never entered %s #%d)", it, w.op, w.seq)
		} else {
			s += fmt.Sprintf(" (%s never entered %s #%d)", rankList(w.notEntered), w.op, w.seq)
		}
	}
	return s
}

func (w *waitErr) Is(target error) bool { return target == ErrTimeout }

func rankList(r []int) string {
	if len(r) == 1 {
		return fmt.Sprintf("rank %d", r[0])
	}
	return fmt.Sprintf("ranks %v", r)
}

// peerErr says a peer went away or aborted.
type peerErr struct {
	rank   int // world rank
	kind   int // peerDead, peerAborted, peerBye
	reason string
}

func (p *peerErr) Error() string {
	switch p.kind {
	case peerDead:
		return fmt.Sprintf("rank %d died: %s", p.rank, p.reason)
	case peerAborted:
		return fmt.Sprintf("rank %d aborted the group: %s", p.rank, p.reason)
	}
	return fmt.Sprintf("rank %d closed the group", p.rank)
}

func (p *peerErr) Is(target error) bool {
	switch p.kind {
	case peerDead:
		return target == ErrPeerDied
	case peerAborted:
		return target == ErrAborted
	}
	return target == ErrClosed
}

// abortedErr wraps the error that aborted a group, for later operations.
type abortedErr struct{ cause error }

func (a *abortedErr) Error() string { return "group aborted earlier: " + a.cause.Error() }
func (a *abortedErr) Unwrap() error { return a.cause }
func (a *abortedErr) Is(target error) bool {
	return target == ErrAborted
}
