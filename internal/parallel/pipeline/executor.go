package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/trace"
)

// Stage is one activation set of a model stage, what the executor runs
// an action on. Several sets of one stage (one per microbatch in flight)
// share its parameters and gradients.
type Stage interface {
	// Forward runs the stage on this rank's tokens of one microbatch;
	// a stage other than the first reads its input from Input().
	Forward(tokens, targets []int32) error
	// LossSum is the last Forward's sum of per-token losses (last stage).
	LossSum() float64
	// Backward runs the whole backward with loss scale scale; a stage
	// other than the last reads its output gradient from GradOutput().
	// BackwardInput and BackwardWeight are its two halves.
	Backward(scale float32) error
	BackwardInput(scale float32) error
	BackwardWeight() error
	// ReserveSplit allocates the memory n split backwards keep between
	// their halves, shared by the stage's sets.
	ReserveSplit(n int)
	Input() backend.Tensor
	Output() backend.Tensor
	GradOutput() backend.Tensor
	GradInput() backend.Tensor
}

// Stats are one rank's measurements of the passes since the last Reset.
type Stats struct {
	// Busy and Wall are the compute time and the elapsed time.
	Busy, Wall time.Duration
	// Time and Count are the compute time and number of actions of each
	// stage (indexed by stage, every stage of the schedule) and Kind.
	Time  [][numKinds]time.Duration
	Count [][numKinds]int
}

// msgKey names a transfer: the input (activation) or the output gradient
// of a stage for a microbatch, as the receiving stage sees it.
type msgKey struct {
	grad      bool
	stage, mb int
}

// peer is the receive side of one neighbouring pipeline rank: the
// messages it sends this rank in its order, with one receive posted ahead.
type peer struct {
	rank  int
	queue []msgKey
	pos   int
	work  *comm.Work
	buf   []float32
}

// sent is a transfer to another rank in flight and the buffer it sends.
type sent struct {
	work *comm.Work
	buf  []float32
}

// Executor runs one pipeline rank's actions of a Schedule on its stages,
// exchanging activations and gradients with the other ranks of the
// pipeline group. It holds, for each of the rank's stages, as many
// activation sets as the schedule keeps alive at its peak.
type Executor struct {
	Sched Schedule
	// Rank is this rank's place in the pipeline group.
	Rank  int
	group comm.Group // nil: one rank
	be    backend.Backend
	sets  map[int][]Stage      // every activation set of each local stage
	free  map[int][]Stage      // the free ones
	live  map[[2]int]Stage     // by (stage, microbatch)
	mail  map[msgKey][]float32 // delivered, not yet consumed
	sends []sent               // transfers in flight, in issue order
	// pool holds the free transfer buffers; every receive, send and
	// delivered message takes one and gives it back when it is done,
	// so that the buffers are allocated once, not per transfer.
	pool    [][]float32
	buffers int   // transfer buffers allocated
	held    int   // of them in receives, the mailbox and consumption
	heldMax int   // the most held at once (see MessageBuffers)
	sendErr error // of a transfer reaped before the end of Run
	stats   Stats
	// GradientSync, when set, is told before each backward action
	// (Backward, BackwardInput, BackwardWeight) whether it is its stage's
	// last of the run, the one that completes the stage's gradients:
	// data parallelism reduces them then, once for all the microbatches
	// (torch.distributed.pipelining's no-sync backwards).
	GradientSync func(stage int, sync bool)
}

// LastGradients returns the index in list (one rank's actions) of each
// stage's last backward action (Backward or BackwardWeight): the one
// that completes the stage's gradients of the pass.
func LastGradients(list []Action) map[int]int {
	last := map[int]int{}
	for i, a := range list {
		if a.Kind == Backward || a.Kind == BackwardWeight {
			last[a.Stage] = i
		}
	}
	return last
}

// ctx is the context of the executor's transfers; timeouts come from the
// group's options.
var ctx = context.Background()

// ActivationSets returns, for each stage rank holds, the number of
// activation sets its list needs at its peak (microbatches whose forward
// ran and whose backward has not finished; at least 1), and, for a list
// that splits backwards, the peak number of microbatches between their
// BackwardInput and their BackwardWeight (whose output gradients the
// stage keeps meanwhile; nil when the list does not split). NewExecutor
// allocates exactly these; memory planning counts them.
func (s Schedule) ActivationSets(rank int) (peak, split map[int]int) {
	live, held := map[int]int{}, map[int]int{}
	peak = map[int]int{}
	for _, st := range s.Stages(rank) {
		peak[st] = 1
	}
	for _, a := range s.Actions[rank] {
		switch a.Kind {
		case BackwardInput:
			if split == nil {
				split = map[int]int{}
			}
			held[a.Stage]++
			split[a.Stage] = max(split[a.Stage], held[a.Stage])
		case Forward:
			live[a.Stage]++
			peak[a.Stage] = max(peak[a.Stage], live[a.Stage])
		case Backward:
			live[a.Stage]--
		case BackwardWeight:
			live[a.Stage]--
			held[a.Stage]--
		}
	}
	return peak, split
}

// NewExecutor builds the executor of pipeline rank rank (its place in
// group, nil for a pipeline of one rank), creating with newSet the
// activation sets of each of its stages that the schedule needs at its
// peak and, when the schedule splits backwards, reserving through the
// stage's first set the split backward's memory for as many microbatches
// as are ever between their two halves (which a stage's sets share).
func NewExecutor(be backend.Backend, s Schedule, group comm.Group, rank int, newSet func(stage int) (Stage, error)) (*Executor, error) {
	x := &Executor{Sched: s, Rank: rank, group: group, be: be,
		sets: map[int][]Stage{}, free: map[int][]Stage{}, live: map[[2]int]Stage{}, mail: map[msgKey][]float32{}}
	peak, split := s.ActivationSets(rank)
	for _, st := range s.Stages(rank) {
		for i := 0; i < peak[st]; i++ {
			set, err := newSet(st)
			if err != nil {
				return nil, fmt.Errorf("pipeline stage %d: %w", st, err)
			}
			x.sets[st] = append(x.sets[st], set)
		}
		if split[st] > 0 {
			x.sets[st][0].ReserveSplit(split[st])
		}
		x.free[st] = append([]Stage(nil), x.sets[st]...)
	}
	return x, nil
}

// Sets returns every activation set of local stage s.
func (x *Executor) Sets(s int) []Stage { return x.sets[s] }

// Stats returns the measurements since the last ResetStats.
func (x *Executor) Stats() Stats { return x.stats }

// ResetStats clears the measurements.
func (x *Executor) ResetStats() {
	S := len(x.Sched.StageRank)
	x.stats = Stats{Time: make([][numKinds]time.Duration, S), Count: make([][numKinds]int, S)}
}

func (x *Executor) acquire(s, mb int) (Stage, error) {
	f := x.free[s]
	if len(f) == 0 {
		return nil, fmt.Errorf("pipeline: rank %d has no free activation set of stage %d for microbatch %d", x.Rank, s, mb)
	}
	set := f[len(f)-1]
	x.free[s] = f[:len(f)-1]
	x.live[[2]int{s, mb}] = set
	return set, nil
}

func (x *Executor) release(s, mb int) {
	k := [2]int{s, mb}
	x.free[s] = append(x.free[s], x.live[k])
	delete(x.live, k)
}

// peers lists, for every other rank that sends this rank something while
// running actions (each rank's list), the messages in the sender's order.
func (x *Executor) peers(actions [][]Action) map[int]*peer {
	out := map[int]*peer{}
	for q, queue := range x.Sched.inbound(actions, x.Rank) {
		out[q] = &peer{rank: q, queue: queue}
	}
	return out
}

// outbound returns the message action a sends (ok unset: none).
func (s Schedule) outbound(a Action) (k msgKey, ok bool) {
	switch {
	case a.Kind == Forward && a.Stage < len(s.StageRank)-1:
		return msgKey{false, a.Stage + 1, a.Microbatch}, true
	case (a.Kind == Backward || a.Kind == BackwardInput) && a.Stage > 0:
		return msgKey{true, a.Stage - 1, a.Microbatch}, true
	}
	return msgKey{}, false
}

// wants returns the message action a consumes (ok unset: none).
func (s Schedule) wants(a Action) (k msgKey, ok bool) {
	switch {
	case a.Kind == Forward && a.Stage > 0:
		return msgKey{false, a.Stage, a.Microbatch}, true
	case (a.Kind == Backward || a.Kind == BackwardInput) && a.Stage < len(s.StageRank)-1:
		return msgKey{true, a.Stage, a.Microbatch}, true
	}
	return msgKey{}, false
}

// sender is the rank that sends message k.
func (s Schedule) sender(k msgKey) int {
	if k.grad {
		return s.StageRank[k.stage+1]
	}
	return s.StageRank[k.stage-1]
}

// inbound lists, for every other rank that sends rank something while
// running actions (each rank's list), the messages in the sender's order.
func (s Schedule) inbound(actions [][]Action, rank int) map[int][]msgKey {
	out := map[int][]msgKey{}
	for q, list := range actions {
		if q == rank {
			continue
		}
		for _, a := range list {
			if k, ok := s.outbound(a); ok && s.StageRank[k.stage] == rank {
				out[q] = append(out[q], k)
			}
		}
	}
	return out
}

// MessageBuffers returns the transfer buffers rank's executor holds at
// most at once on its receiving side during one pass of the schedule's
// actions: the receive posted ahead from each sending rank, the messages
// that arrived before they are needed (a sender's order is not the
// order this rank consumes them in, or a stage on this rank sent them),
// and the one being consumed. Like the executor it receives from a
// sender only when it needs one of its messages. Sends add their buffers
// while in flight; the executor gives each back when its send finished
// and reuses it.
func (s Schedule) MessageBuffers(rank int) int {
	in := s.inbound(s.Actions, rank)
	pos := map[int]int{}
	mail := map[msgKey]bool{}
	held := 0
	for _, q := range in {
		if len(q) > 0 {
			held++
		}
	}
	peak := held
	for _, a := range s.Actions[rank] {
		if k, ok := s.wants(a); ok {
			if mail[k] {
				delete(mail, k)
			} else {
				q := s.sender(k)
				for pos[q] < len(in[q]) {
					got := in[q][pos[q]]
					pos[q]++
					if pos[q] < len(in[q]) {
						held++ // the next receive posted
					}
					if got == k {
						break
					}
					mail[got] = true
				}
			}
			peak = max(peak, held)
			held-- // consumed
		}
		if k, ok := s.outbound(a); ok && s.StageRank[k.stage] == rank {
			held++
			mail[k] = true
			peak = max(peak, held)
		}
	}
	return peak
}

// post starts the receive of p's next message, if any, into a buffer of
// n elements.
func (x *Executor) post(p *peer, n int) {
	if p.pos >= len(p.queue) {
		p.work = nil
		return
	}
	p.buf = x.take(n)
	x.hold(1)
	p.work = x.group.RecvAsync(ctx, comm.F32(p.buf), p.rank)
}

// take returns a free transfer buffer of n elements, allocating one only
// when every buffer is in use (after taking back those of the finished
// sends).
func (x *Executor) take(n int) []float32 {
	x.reap(false)
	for len(x.pool) > 0 {
		b := x.pool[len(x.pool)-1]
		x.pool = x.pool[:len(x.pool)-1]
		if len(b) == n {
			return b
		}
		x.buffers-- // another size (an evaluation pass): let it go
	}
	x.buffers++
	return make([]float32, n)
}

// give returns a transfer buffer to the pool.
func (x *Executor) give(b []float32) { x.pool = append(x.pool, b) }

// hold counts buffers entering (d > 0) or leaving the receive side.
func (x *Executor) hold(d int) {
	x.held += d
	x.heldMax = max(x.heldMax, x.held)
}

// reap takes back the buffers of the sends that finished (with wait, of
// every send), in issue order.
func (x *Executor) reap(wait bool) {
	n := 0
	for _, s := range x.sends {
		if !wait && !finished(s.work) {
			break
		}
		x.sendErr = errors.Join(x.sendErr, s.work.Wait())
		x.give(s.buf)
		n++
	}
	x.sends = x.sends[:copy(x.sends, x.sends[n:])]
}

func finished(w *comm.Work) bool {
	select {
	case <-w.Done():
		return true
	default:
		return false
	}
}

// Buffers returns the transfer buffers allocated so far and the most of
// them held at once by posted receives, the mailbox and the message being
// consumed (the rest are sends in flight).
func (x *Executor) Buffers() (allocated, heldMax int) { return x.buffers, x.heldMax }

// recv returns the message k, receiving (in each sender's order) until it
// arrives; the caller consumes it and hands the buffer to done.
func (x *Executor) recv(peers map[int]*peer, k msgKey, n int) ([]float32, error) {
	if b, ok := x.mail[k]; ok {
		delete(x.mail, k)
		return b, nil
	}
	p := peers[x.Sched.sender(k)]
	for p != nil && p.work != nil {
		if err := p.work.Wait(); err != nil {
			return nil, fmt.Errorf("pipeline: receiving from rank %d: %w", p.rank, err)
		}
		got, b := p.queue[p.pos], p.buf
		p.pos++
		x.post(p, n) // the next receive takes a buffer before b is consumed
		if got == k {
			return b, nil
		}
		x.mail[got] = b
	}
	return nil, fmt.Errorf("pipeline: rank %d never receives %+v", x.Rank, k)
}

// done gives back the buffer of a consumed message.
func (x *Executor) done(b []float32) {
	x.hold(-1)
	x.give(b)
}

// send hands t's contents to the stage of k, on this rank (into the
// mailbox) or another.
func (x *Executor) send(k msgKey, t backend.Tensor) {
	data := x.take(t.Len)
	x.be.Download(data, t)
	to := x.Sched.StageRank[k.stage]
	if to == x.Rank {
		x.hold(1)
		x.mail[k] = data
		return
	}
	x.sends = append(x.sends, sent{x.group.SendAsync(ctx, comm.F32(data), to), data})
}

// ForwardOnly is the action lists of an evaluation pass over the
// schedule's microbatches: every microbatch forward through the stages
// in order.
func (x *Executor) ForwardOnly() [][]Action {
	actions := make([][]Action, x.Sched.PP)
	for mb := 0; mb < x.Sched.Microbatches; mb++ {
		for s, r := range x.Sched.StageRank {
			actions[r] = append(actions[r], Action{Kind: Forward, Stage: s, Microbatch: mb})
		}
	}
	return actions
}

// Run executes this rank's list of actions (one list per rank) on one
// pass over the schedule's microbatches: inputs and labels hold this
// rank's tokens of each microbatch, per tokens each, in order. It returns
// the sum of the losses of the microbatches whose last stage runs here.
// With train unset only forwards run (evaluation) and each activation
// set is released right after its forward.
func (x *Executor) Run(actions [][]Action, inputs, labels []int32, per int, scale float32, train bool) (float64, error) {
	S := len(x.Sched.StageRank)
	var n int // elements of one transferred hidden state
	for _, sets := range x.sets {
		n = sets[0].Input().Len
	}
	peers := x.peers(actions)
	for _, p := range peers {
		x.post(p, n)
	}
	var lossSum float64
	start := time.Now()
	if len(x.stats.Time) != S {
		x.ResetStats()
	}
	timed := func(a Action, t0 time.Time) {
		dt := time.Since(t0)
		x.stats.Busy += dt
		x.stats.Time[a.Stage][a.Kind] += dt
		x.stats.Count[a.Stage][a.Kind]++
	}
	last := LastGradients(actions[x.Rank])
	for i, a := range actions[x.Rank] {
		s, mb := a.Stage, a.Microbatch
		if a.Kind != Forward && x.GradientSync != nil {
			x.GradientSync(s, i == last[s])
		}
		switch a.Kind {
		case Forward:
			set, err := x.acquire(s, mb)
			if err != nil {
				return 0, err
			}
			if s > 0 {
				in, err := x.recv(peers, msgKey{false, s, mb}, n)
				if err != nil {
					return 0, err
				}
				x.be.Upload(set.Input(), in)
				x.done(in)
			}
			t0, span := time.Now(), trace.BeginAction("F", s, mb)
			err = set.Forward(inputs[mb*per:(mb+1)*per], labels[mb*per:(mb+1)*per])
			span.End()
			timed(a, t0)
			if err != nil {
				return 0, err
			}
			if s == S-1 {
				lossSum += set.LossSum()
			} else {
				x.send(msgKey{false, s + 1, mb}, set.Output())
			}
			if !train {
				x.release(s, mb)
			}
		case Backward, BackwardInput:
			set := x.live[[2]int{s, mb}]
			if s < S-1 {
				g, err := x.recv(peers, msgKey{true, s, mb}, n)
				if err != nil {
					return 0, err
				}
				x.be.Upload(set.GradOutput(), g)
				x.done(g)
			}
			t0, span := time.Now(), trace.BeginAction(a.Kind.String(), s, mb)
			var err error
			if a.Kind == Backward {
				err = set.Backward(scale)
			} else {
				err = set.BackwardInput(scale)
			}
			span.End()
			timed(a, t0)
			if err != nil {
				return 0, err
			}
			if s > 0 {
				x.send(msgKey{true, s - 1, mb}, set.GradInput())
			}
			if a.Kind == Backward {
				x.release(s, mb)
			}
		case BackwardWeight:
			t0, span := time.Now(), trace.BeginAction("W", s, mb)
			err := x.live[[2]int{s, mb}].BackwardWeight()
			span.End()
			timed(a, t0)
			if err != nil {
				return 0, err
			}
			x.release(s, mb)
		}
	}
	x.reap(true)
	err := x.sendErr
	x.sendErr = nil
	if len(x.mail) != 0 {
		err = errors.Join(err, fmt.Errorf("pipeline: rank %d has %d undelivered messages", x.Rank, len(x.mail)))
		for _, b := range x.mail {
			x.done(b)
		}
		clear(x.mail)
	}
	x.stats.Wall += time.Since(start)
	return lossSum, err
}
