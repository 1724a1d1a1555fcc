package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The elastic rendezvous. The launchers of a job meet in rounds, kept in
// an rdzvStore under "/titan/rdzv/<job id>/":
//
//	state             {round, restarts, reason, fatal, done}: the current round
//	r/<k>/join/<id>   a node taking part in round k (bound to its lease)
//	r/<k>/members     the closed round: its nodes, in node-rank order
//	r/<k>/endpoint    the control server of round k (hosted by node rank 0)
//	r/<k>/wait/<id>   a node that came after round k closed (its lease)
//
// Round k is open until it closes: when MaxNodes have joined, or when
// MinNodes have and LastCall passed without another joining. Node ids sort
// as node ranks, so the lowest live member hosts the round's control
// server. Round k ends when its state is swapped to round k+1, by the
// first launcher to see a reason: a failed worker (a restart, counted
// against --max-restarts), a member whose lease expired (the node left;
// counted too), or a node waiting to join while the round has fewer than
// MaxNodes (not counted). Every member stops its workers and joins round
// k+1; workers of round k present the job id of round k, which the
// control server of round k+1 refuses.

// rdzvConfig configures the elastic rendezvous.
type rdzvConfig struct {
	MinNodes, MaxNodes int
	MaxRestarts        int
	// JoinTimeout bounds the wait for MinNodes nodes in a round.
	JoinTimeout time.Duration
	// LastCall is how long a round with at least MinNodes but fewer than
	// MaxNodes stays open for more after the last one joined.
	LastCall time.Duration
	// LeaseTTL is how long a node's membership outlives its launcher's
	// last keep-alive (sent every LeaseTTL/4).
	LeaseTTL time.Duration
}

// rdzvState is the value of the state key.
type rdzvState struct {
	Round    int    `json:"round"`
	Restarts int    `json:"restarts"`
	Reason   string `json:"reason,omitempty"` // why the previous round ended
	Failure  bool   `json:"failure,omitempty"`
	Fatal    string `json:"fatal,omitempty"` // the job failed for good
	Done     bool   `json:"done,omitempty"`  // round Round finished the job
}

func (s rdzvState) encode() string { b, _ := json.Marshal(s); return string(b) }

// roundInfo is a closed round as one node sees it.
type roundInfo struct {
	Round    int
	Restarts int
	Nodes    []string // node ids in node-rank order
	NodeRank int
	// Reason is why the previous round ended ("" for the first).
	Reason string
}

// errJobDone: the job finished in an earlier round.
var errJobDone = errors.New("the job already finished")

// errNoRestarts is wrapped by the error of a job that failed after
// --max-restarts restarts.
var errNoRestarts = errors.New("no restarts left")

type rendezvous struct {
	store  rdzvStore
	cfg    rdzvConfig
	prefix string
	id     string
	lease  int64
	lost   chan struct{} // closed when the lease could not be kept alive
	stop   context.CancelFunc
}

// newRendezvous grants this node's lease and keeps it alive until close.
func newRendezvous(ctx context.Context, store rdzvStore, cfg rdzvConfig, jobID, nodeID string) (*rendezvous, error) {
	lease, err := store.Grant(ctx, cfg.LeaseTTL)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	kctx, stop := context.WithCancel(context.Background())
	r := &rendezvous{store: store, cfg: cfg, prefix: "/titan/rdzv/" + jobID + "/", id: nodeID, lease: lease, lost: make(chan struct{}), stop: stop}
	go r.keepAlive(kctx)
	return r, nil
}

func (r *rendezvous) keepAlive(ctx context.Context) {
	t := time.NewTicker(r.cfg.LeaseTTL / 4)
	defer t.Stop()
	failedSince := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/2)
		err := r.store.KeepAlive(cctx, r.lease)
		cancel()
		switch {
		case err == nil:
			failedSince = time.Time{}
		case errors.Is(err, errLeaseGone):
			close(r.lost)
			return
		case failedSince.IsZero():
			failedSince = time.Now()
		case time.Since(failedSince) > r.cfg.LeaseTTL:
			close(r.lost)
			return
		}
	}
}

// close revokes the lease: this node leaves at once.
func (r *rendezvous) close() {
	r.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	r.store.Revoke(ctx, r.lease)
	cancel()
}

func (r *rendezvous) key(round int, parts ...string) string {
	return r.prefix + "r/" + strconv.Itoa(round) + "/" + strings.Join(parts, "/")
}

// snapshot lists everything under the prefix and decodes the state.
func (r *rendezvous) snapshot(ctx context.Context) (map[string]string, rdzvState, int64, error) {
	kvs, rev, err := r.store.List(ctx, r.prefix)
	if err != nil {
		return nil, rdzvState{}, 0, fmt.Errorf("rendezvous: %w", err)
	}
	var st rdzvState
	if v, ok := kvs[r.prefix+"state"]; ok {
		if err := json.Unmarshal([]byte(v), &st); err != nil {
			return nil, rdzvState{}, 0, fmt.Errorf("rendezvous: state %q: %w", v, err)
		}
	}
	return kvs, st, rev, nil
}

// idsUnder returns the node ids of the keys under dir, sorted.
func idsUnder(kvs map[string]string, dir string) []string {
	var ids []string
	for k := range kvs {
		if id, ok := strings.CutPrefix(k, dir); ok && id != "" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// waitChange waits for a change after rev, or until deadline.
func (r *rendezvous) waitChange(ctx context.Context, rev int64, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := r.store.Wait(wctx, r.prefix, rev)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		// A store error: try again shortly rather than spin.
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// next joins the current round and returns it once closed with this node
// in it. A node that comes after a round closed waits (registered under
// the round's wait/ keys, which makes the members end it when there is
// room) for the next one. It fails after JoinTimeout without MinNodes
// nodes, and with errJobDone or the fatal error once the job ended.
func (r *rendezvous) next(ctx context.Context) (roundInfo, error) {
	start := time.Now()
	joined := -1
	var quorumAt time.Time // when the round last grew to at least MinNodes
	lastCount := 0
	for {
		select {
		case <-r.lost:
			return roundInfo{}, fmt.Errorf("rendezvous: this node's lease expired (the store was unreachable for more than %v)", r.cfg.LeaseTTL)
		default:
		}
		kvs, st, rev, err := r.snapshot(ctx)
		if err != nil {
			return roundInfo{}, err
		}
		if _, ok := kvs[r.prefix+"state"]; !ok {
			if _, err := r.store.Swap(ctx, r.prefix+"state", "", rdzvState{}.encode()); err != nil {
				return roundInfo{}, fmt.Errorf("rendezvous: %w", err)
			}
			continue
		}
		switch {
		case st.Fatal != "" && st.Failure:
			return roundInfo{}, fmt.Errorf("%w: %s", errNoRestarts, st.Fatal)
		case st.Fatal != "":
			return roundInfo{}, fmt.Errorf("the job failed: %s", st.Fatal)
		case st.Done:
			return roundInfo{}, errJobDone
		}
		k := st.Round
		if v, ok := kvs[r.key(k, "members")]; ok {
			var nodes []string
			if err := json.Unmarshal([]byte(v), &nodes); err != nil {
				return roundInfo{}, fmt.Errorf("rendezvous: members of round %d %q: %w", k, v, err)
			}
			if i := slices.Index(nodes, r.id); i >= 0 {
				return roundInfo{Round: k, Restarts: st.Restarts, Nodes: nodes, NodeRank: i, Reason: st.Reason}, nil
			}
			// Too late for round k: wait for the next.
			if _, err := r.store.Create(ctx, r.key(k, "wait", r.id), "", r.lease); err != nil {
				return roundInfo{}, fmt.Errorf("rendezvous: %w", err)
			}
			if err := r.waitChange(ctx, rev, time.Now().Add(time.Minute)); err != nil {
				return roundInfo{}, err
			}
			continue
		}
		if joined != k {
			if _, err := r.store.Create(ctx, r.key(k, "join", r.id), "", r.lease); err != nil {
				return roundInfo{}, fmt.Errorf("rendezvous: %w", err)
			}
			joined, start, quorumAt, lastCount = k, time.Now(), time.Time{}, 0
			continue
		}
		nodes := idsUnder(kvs, r.key(k, "join")+"/")
		n := len(nodes)
		if n != lastCount {
			lastCount = n
			if n >= r.cfg.MinNodes {
				quorumAt = time.Now()
			}
		}
		closeNow := n >= r.cfg.MaxNodes || (n >= r.cfg.MinNodes && !quorumAt.IsZero() && time.Since(quorumAt) >= r.cfg.LastCall)
		if closeNow {
			nodes = nodes[:min(n, r.cfg.MaxNodes)]
			b, _ := json.Marshal(nodes)
			if _, err := r.store.Create(ctx, r.key(k, "members"), string(b), 0); err != nil {
				return roundInfo{}, fmt.Errorf("rendezvous: %w", err)
			}
			continue
		}
		deadline := start.Add(r.cfg.JoinTimeout)
		if n < r.cfg.MinNodes && time.Now().After(deadline) {
			return roundInfo{}, fmt.Errorf("rendezvous: only %d of the at least %d nodes (--nnodes %d:%d) joined round %d within the join timeout of %v",
				n, r.cfg.MinNodes, r.cfg.MinNodes, r.cfg.MaxNodes, k, r.cfg.JoinTimeout)
		}
		if !quorumAt.IsZero() {
			deadline = quorumAt.Add(r.cfg.LastCall)
		}
		if err := r.waitChange(ctx, rev, deadline); err != nil {
			return roundInfo{}, err
		}
	}
}

// publishEndpoint records the control server of round k.
func (r *rendezvous) publishEndpoint(ctx context.Context, k int, endpoint string) error {
	if _, err := r.store.Create(ctx, r.key(k, "endpoint"), endpoint, 0); err != nil {
		return fmt.Errorf("rendezvous: %w", err)
	}
	return nil
}

// endpoint waits for the control server of round info; "" with a nil
// error when the round ended first (or a member left, which ends it).
func (r *rendezvous) endpoint(ctx context.Context, info roundInfo) (string, error) {
	k := info.Round
	for {
		kvs, st, rev, err := r.snapshot(ctx)
		if err != nil {
			return "", err
		}
		if ep, ok := kvs[r.key(k, "endpoint")]; ok {
			return ep, nil
		}
		if st.Round != k || st.Fatal != "" {
			return "", nil
		}
		if left := r.left(kvs, info); len(left) > 0 {
			_, err := r.end(ctx, k, leftReason(left), endFailure)
			return "", err
		}
		if err := r.waitChange(ctx, rev, time.Now().Add(time.Minute)); err != nil {
			return "", err
		}
	}
}

// How a round ends (rendezvous.end).
const (
	endChange  = iota // membership changed: no restart counted
	endFailure        // a worker or node failed: a restart counted
	endFatal          // the job cannot go on: it fails
)

// end ends round k for reason, as kind says, unless it already ended, and
// returns the state that follows it.
func (r *rendezvous) end(ctx context.Context, k int, reason string, kind int) (rdzvState, error) {
	for {
		kvs, st, _, err := r.snapshot(ctx)
		if err != nil {
			return rdzvState{}, err
		}
		if st.Round != k || st.Fatal != "" || st.Done {
			return st, nil
		}
		next := rdzvState{Round: k + 1, Restarts: st.Restarts, Reason: reason, Failure: kind == endFailure}
		switch {
		case kind == endFatal:
			next.Fatal = reason
		case kind == endFailure && st.Restarts >= r.cfg.MaxRestarts:
			next.Fatal = fmt.Sprintf("%s; %d restarts used (--max-restarts %d)", reason, st.Restarts, r.cfg.MaxRestarts)
		case kind == endFailure:
			next.Restarts++
		}
		ok, err := r.store.Swap(ctx, r.prefix+"state", kvs[r.prefix+"state"], next.encode())
		if err != nil {
			return rdzvState{}, fmt.Errorf("rendezvous: %w", err)
		}
		if ok {
			return next, nil
		}
	}
}

// finish marks the job done in round k.
func (r *rendezvous) finish(ctx context.Context, k int) error {
	for {
		kvs, st, _, err := r.snapshot(ctx)
		if err != nil {
			return err
		}
		if st.Round != k || st.Done || st.Fatal != "" {
			return nil
		}
		st.Done = true
		ok, err := r.store.Swap(ctx, r.prefix+"state", kvs[r.prefix+"state"], st.encode())
		if err != nil || ok {
			return err
		}
	}
}

// watch returns a channel that delivers why round info must end — it ended
// (the reason its ender gave), a member left, or nodes wait to join while
// there is room — and is closed, without a value, when ctx ends or the job
// is done.
func (r *rendezvous) watch(ctx context.Context, info roundInfo) <-chan string {
	ch := make(chan string, 1)
	k := info.Round
	go func() {
		defer close(ch)
		for {
			kvs, st, rev, err := r.snapshot(ctx)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				var reason string
				waiting := idsUnder(kvs, r.key(k, "wait")+"/")
				left := r.left(kvs, info)
				switch {
				case st.Done:
					return
				case st.Fatal != "":
					reason = st.Fatal
				case st.Round != k:
					reason = st.Reason
				case len(left) > 0:
					reason = leftReason(left)
					if st, err = r.end(ctx, k, reason, endFailure); err == nil && st.Fatal != "" {
						reason = st.Fatal
					}
				case len(waiting) > 0 && len(info.Nodes) < r.cfg.MaxNodes:
					reason = fmt.Sprintf("node %s waits to join (%d of at most %d nodes run)", strings.Join(waiting, ", "), len(info.Nodes), r.cfg.MaxNodes)
					r.end(ctx, k, reason, endChange)
				}
				if reason != "" {
					ch <- reason
					return
				}
			}
			select {
			case <-r.lost:
				ch <- fmt.Sprintf("this node's lease expired (the rendezvous store was unreachable for more than %v)", r.cfg.LeaseTTL)
				return
			default:
			}
			if r.waitChange(ctx, rev, time.Now().Add(r.cfg.LeaseTTL/2)) != nil {
				return
			}
		}
	}()
	return ch
}

// left returns the members of round info whose lease ended.
func (r *rendezvous) left(kvs map[string]string, info roundInfo) []string {
	var left []string
	for _, id := range info.Nodes {
		if _, ok := kvs[r.key(info.Round, "join", id)]; !ok {
			left = append(left, id)
		}
	}
	return left
}

func leftReason(left []string) string {
	return fmt.Sprintf("node %s left the rendezvous (its lease expired)", strings.Join(left, ", "))
}

// awaitLeft waits, at most timeout, until every other member of round info
// has left the rendezvous (its launcher ended and revoked its lease).
func (r *rendezvous) awaitLeft(ctx context.Context, info roundInfo, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		kvs, _, rev, err := r.snapshot(ctx)
		if err != nil {
			return
		}
		if len(r.left(kvs, info)) >= len(info.Nodes)-1 {
			return
		}
		if r.waitChange(ctx, rev, deadline) != nil {
			return
		}
	}
}
