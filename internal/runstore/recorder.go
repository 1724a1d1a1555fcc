package runstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/titan-go/titan/internal/metrics"
)

// Options tune a Recorder. The zero value of each field takes the
// default in its comment.
type Options struct {
	// Target is the store (see Target and ParseTarget).
	Target string
	// Spool is the file that holds what could not reach the store,
	// normally <dump_folder>/runstore_spool.jsonl (SpoolFile). A spool
	// left by an earlier run is flushed first. "" keeps such records in
	// memory only (up to Queue of them; older ones are dropped).
	Spool string
	// Queue bounds the records waiting for the background writer
	// (1024); when it is full, Step drops the record rather than wait.
	Queue int
	// Batch is how many records make the writer flush at once (64).
	Batch int
	// Interval is the longest a record waits before a flush (500 ms).
	Interval time.Duration
	// RetryMin and RetryMax bound the backoff between attempts to reach
	// a store that failed (250 ms doubling up to 30 s). Meanwhile
	// records go to the spool.
	RetryMin, RetryMax time.Duration
	// OpTimeout bounds one attempt: opening the store or one write
	// (10 s).
	OpTimeout time.Duration
	// Heartbeat is how often the run's heartbeat is recorded (30 s; see
	// Store.Reconcile).
	Heartbeat time.Duration
}

func (o *Options) defaults() {
	def := func(x *int, v int) {
		if *x <= 0 {
			*x = v
		}
	}
	defd := func(x *time.Duration, v time.Duration) {
		if *x <= 0 {
			*x = v
		}
	}
	def(&o.Queue, 1024)
	def(&o.Batch, 64)
	defd(&o.Interval, 500*time.Millisecond)
	defd(&o.RetryMin, 250*time.Millisecond)
	defd(&o.RetryMax, 30*time.Second)
	defd(&o.OpTimeout, 10*time.Second)
	defd(&o.Heartbeat, 30*time.Second)
}

// Recorder writes one run to a store from a background goroutine, so that
// training never waits for the database: Step only puts the record on a
// bounded queue. The goroutine writes a batch every Batch records or
// Interval; when the store cannot be reached or a write fails, the batch
// is appended to the spool instead, and the goroutine tries the store
// again with exponential backoff, first replaying the spool (every write
// is an upsert, so a record replayed twice is stored once).
//
// Step and Close are called from one goroutine (the training loop);
// Notes may be called from any.
type Recorder struct {
	opt     Options
	id      string
	ch      chan event
	closeCh chan closeReq
	done    chan struct{}
	closed  atomic.Bool
	dropped atomic.Int64
	// stop cancels the background writes in flight when Close starts,
	// so that Close's own flush begins at once.
	ctx  context.Context
	stop context.CancelFunc

	hasNotes atomic.Bool
	mu       sync.Mutex
	notes    []string

	result Result // set by the goroutine before done closes
}

// Result is what Close reports.
type Result struct {
	// Stored counts the events (run start, steps, end) of this run
	// written to the store; Replayed those of an earlier spool.
	Stored, Replayed int
	// Spooled counts this run's events left in the spool at the end,
	// Dropped those lost (queue full, or the spool unwritable).
	Spooled, Dropped int
	// Spool is the spool file that holds them.
	Spool string
	// Err is the last store error, when events were spooled or dropped.
	Err error
}

type closeReq struct {
	end      event
	deadline time.Time
}

// Start begins recording run r (its ID set, status Running) to o.Target
// and returns at once; opening the store happens in the background.
func Start(r Run, o Options) *Recorder {
	o.defaults()
	if r.Status == "" {
		r.Status = Running
	}
	rec := &Recorder{
		opt:     o,
		id:      r.ID,
		ch:      make(chan event, o.Queue),
		closeCh: make(chan closeReq),
		done:    make(chan struct{}),
	}
	rec.ctx, rec.stop = context.WithCancel(context.Background())
	rec.ch <- event{Kind: "run", RunID: r.ID, Run: &r}
	go rec.loop()
	return rec
}

// ID is the run's ID.
func (r *Recorder) ID() string { return r.id }

// Step queues one logged step. It never blocks: with the queue full the
// record is dropped (and counted in Result.Dropped). A nil Recorder does
// nothing.
func (r *Recorder) Step(rec metrics.Record) {
	if r == nil || r.closed.Load() {
		return
	}
	if rec.ValLoss != nil {
		v := *rec.ValLoss
		rec.ValLoss = &v
	}
	select {
	case r.ch <- event{Kind: "step", RunID: r.id, Step: &rec}:
	default:
		if r.dropped.Add(1) == 1 {
			r.note("the run store's queue is full: dropping records")
		}
	}
}

// Notes returns, and forgets, the recorder's messages for the log since the
// last call: the store becoming unavailable or coming back, spool
// replays. It is cheap when there are none.
func (r *Recorder) Notes() []string {
	if r == nil || !r.hasNotes.Load() {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.notes
	r.notes = nil
	r.hasNotes.Store(false)
	return n
}

func (r *Recorder) note(format string, args ...any) {
	r.mu.Lock()
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
	r.hasNotes.Store(true)
	r.mu.Unlock()
}

// Close records the run's end (status, and errText for a failed run),
// flushes everything queued to the store — or, failing that before
// timeout, to the spool, which it syncs to disk — and stops the
// goroutine. It returns within about timeout. The error is non-nil when
// some of the run's events did not reach the store; they are in the spool
// (Result.Spool) unless counted as dropped.
func (r *Recorder) Close(status Status, errText string, timeout time.Duration) (Result, error) {
	if r == nil || r.closed.Swap(true) {
		return Result{}, errors.New("runstore: recorder already closed")
	}
	deadline := time.Now().Add(timeout)
	r.stop()
	end := event{Kind: "end", RunID: r.id, End: &runEnd{Status: status, Error: errText, At: time.Now()}}
	select {
	case r.closeCh <- closeReq{end: end, deadline: deadline}:
	case <-time.After(timeout):
		return Result{}, fmt.Errorf("runstore: the recorder did not stop within %v", timeout)
	}
	select {
	case <-r.done:
	case <-time.After(time.Until(deadline) + time.Second):
		return Result{}, fmt.Errorf("runstore: the recorder did not stop within %v", timeout)
	}
	res := r.result
	res.Dropped += int(r.dropped.Load())
	if res.Spooled > 0 || res.Dropped > 0 {
		var what string
		if res.Spooled > 0 {
			what = fmt.Sprintf("%d events spooled to %s (flushed at the next run in the same dump folder)", res.Spooled, res.Spool)
		}
		if res.Dropped > 0 {
			if what != "" {
				what += ", "
			}
			what += fmt.Sprintf("%d dropped (the queue was full)", res.Dropped)
		}
		if res.Err != nil {
			what += ": " + res.Err.Error()
		}
		return res, fmt.Errorf("runstore: run %s not fully recorded in %s: %s", r.id, Redact(r.opt.Target), what)
	}
	return res, nil
}

// writer is the background goroutine's state.
type writer struct {
	r       *Recorder
	store   *Store
	pending []event // received, not yet written anywhere
	spool   *spool
	// spooled counts this run's events in the spool; replay is set while
	// the spool holds anything (this run's or an earlier one's).
	spooled int
	replay  bool
	// retryAt is when the store may be tried again after a failure.
	retryAt time.Time
	backoff time.Duration
	lastErr error
	down    bool // the last attempt failed
	res     Result
}

func (r *Recorder) loop() {
	w := &writer{r: r}
	defer close(r.done)
	if r.opt.Spool != "" {
		w.spool = &spool{path: r.opt.Spool}
		if fi, err := os.Stat(r.opt.Spool); err == nil && fi.Size() > 0 {
			w.replay = true
		}
	}
	tick := time.NewTicker(r.opt.Interval)
	defer tick.Stop()
	lastBeat := time.Now()
	for {
		select {
		case ev := <-r.ch:
			w.pending = append(w.pending, ev)
			if len(w.pending) >= r.opt.Batch {
				w.flush(false, time.Time{})
			}
		case now := <-tick.C:
			if now.Sub(lastBeat) >= r.opt.Heartbeat {
				lastBeat = now
				at := now.UTC()
				w.pending = append(w.pending, event{Kind: "beat", RunID: r.id, At: &at})
			}
			w.flush(false, time.Time{})
		case req := <-r.closeCh:
			for drained := false; !drained; {
				select {
				case ev := <-r.ch:
					w.pending = append(w.pending, ev)
				default:
					drained = true
				}
			}
			w.pending = append(w.pending, req.end)
			w.flush(true, req.deadline)
			w.finish()
			return
		}
	}
}

// flush writes the pending events: to the store when it is reachable
// (after replaying the spool), else to the spool. final is Close's flush,
// which tries the store whatever the backoff says, until deadline.
func (w *writer) flush(final bool, deadline time.Time) {
	if len(w.pending) == 0 && !w.replay {
		return
	}
	o := w.r.opt
	if !final && time.Now().Before(w.retryAt) {
		w.toSpool()
		return
	}
	parent := context.Background()
	if !final {
		if w.r.ctx.Err() != nil {
			return // Close has begun: its final flush takes the events
		}
		parent, deadline = w.r.ctx, time.Now().Add(o.OpTimeout)
	}
	ctx, cancel := context.WithDeadline(parent, deadline)
	defer cancel()
	if w.store == nil {
		st, err := Open(ctx, o.Target)
		if err != nil {
			w.fail(err)
			return
		}
		w.store = st
	}
	if w.replay {
		evs, bad, err := w.spool.read()
		if err != nil {
			w.fail(err)
			return
		}
		if bad > 0 {
			w.r.note("%s: skipped %d unreadable lines", w.spool.path, bad)
		}
		if err := w.store.apply(ctx, evs); err != nil {
			w.fail(err)
			return
		}
		if err := w.spool.reset(); err != nil {
			w.r.note("%s: %v (its %d events are in the store; replaying them again is harmless)", w.spool.path, err, len(evs))
		}
		mine := w.spooled
		w.res.Stored += mine
		w.res.Replayed += len(evs) - mine
		w.spooled, w.replay = 0, false
		w.r.note("flushed %d spooled events from %s to %s", len(evs), w.spool.path, Redact(o.Target))
	}
	if len(w.pending) > 0 {
		if err := w.store.apply(ctx, w.pending); err != nil {
			w.fail(err)
			return
		}
		w.res.Stored += len(w.pending)
		w.pending = w.pending[:0]
	}
	if w.down {
		w.r.note("run store %s is back", Redact(o.Target))
	}
	w.down, w.backoff, w.retryAt, w.lastErr = false, 0, time.Time{}, nil
}

// fail notes a failed attempt, schedules the next one and spools the
// pending events.
func (w *writer) fail(err error) {
	o := w.r.opt
	if errors.Is(err, context.Canceled) && w.r.ctx.Err() != nil {
		// Close cancelled this flush to take over: not the store's fault,
		// and its final flush writes the pending events.
		return
	}
	if !w.down {
		where := "memory"
		if w.spool != nil {
			where = w.spool.path
		}
		w.r.note("run store %s unavailable (%v); spooling records to %s, retrying", Redact(o.Target), err, where)
	}
	w.down, w.lastErr = true, err
	w.backoff = min(max(2*w.backoff, o.RetryMin), o.RetryMax)
	w.retryAt = time.Now().Add(w.backoff)
	// The next attempt opens the store afresh (and checks its schema).
	if w.store != nil {
		w.store.Close()
		w.store = nil
	}
	w.toSpool()
}

// toSpool appends the pending events to the spool (without a spool, keeps
// the newest Queue of them in memory).
func (w *writer) toSpool() {
	if len(w.pending) == 0 {
		return
	}
	if w.spool == nil {
		if extra := len(w.pending) - w.r.opt.Queue; extra > 0 {
			w.res.Dropped += extra
			w.pending = append(w.pending[:0], w.pending[extra:]...)
		}
		return
	}
	if err := w.spool.append(w.pending); err != nil {
		if w.res.Dropped == 0 {
			w.r.note("cannot write the spool %s (%v): dropping records", w.spool.path, err)
		}
		w.res.Dropped += len(w.pending)
		w.lastErr = errors.Join(w.lastErr, err)
	} else {
		w.spooled += len(w.pending)
		w.replay = true
	}
	w.pending = w.pending[:0]
}

// finish closes the spool (synced) and the store and publishes the result.
func (w *writer) finish() {
	w.toSpool() // what the final flush could not write
	if w.spool != nil {
		if err := w.spool.close(); err != nil {
			w.lastErr = errors.Join(w.lastErr, err)
		}
		w.res.Spool = w.spool.path
	}
	if w.store != nil {
		w.store.Close()
	}
	w.res.Spooled = w.spooled
	if w.spool == nil {
		w.res.Dropped += len(w.pending)
	}
	if w.res.Spooled > 0 || w.res.Dropped > 0 {
		w.res.Err = w.lastErr
	}
	w.r.result = w.res
}

// spool is the append-only JSON-lines file of events that did not reach
// the store. It is written with the OS's buffering and synced on close.
type spool struct {
	path string
	f    *os.File
}

func (s *spool) openFile() error {
	if s.f != nil {
		return nil
	}
	f, err := os.OpenFile(s.path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	s.f = f
	return nil
}

// append writes evs, one JSON object per line, in one write.
func (s *spool) append(evs []event) error {
	if err := s.openFile(); err != nil {
		return err
	}
	var b bytes.Buffer
	for i := range evs {
		line, err := json.Marshal(&evs[i])
		if err != nil {
			return fmt.Errorf("spool %s: %w", s.path, err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if _, err := s.f.Write(b.Bytes()); err != nil {
		return fmt.Errorf("spool %s: %w", s.path, err)
	}
	return nil
}

// read returns the spool's events in order and the number of lines that
// could not be read (a line cut short by a crash, say).
func (s *spool) read() ([]event, int, error) {
	raw, err := os.ReadFile(s.path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, 0, nil
		}
		return nil, 0, fmt.Errorf("spool: %w", err)
	}
	var evs []event
	bad := 0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil || ev.RunID == "" {
			bad++
			continue
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("spool %s: %w", s.path, err)
	}
	return evs, bad, nil
}

// reset empties the spool once its events are in the store.
func (s *spool) reset() error {
	if s.f != nil {
		return s.f.Truncate(0)
	}
	return os.Truncate(s.path, 0)
}

// close syncs and closes the spool, removing it when empty.
func (s *spool) close() error {
	if s.f == nil {
		if fi, err := os.Stat(s.path); err == nil && fi.Size() == 0 {
			os.Remove(s.path)
		}
		return nil
	}
	f := s.f
	s.f = nil
	err := f.Sync()
	fi, serr := f.Stat()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if serr == nil && fi.Size() == 0 {
		os.Remove(s.path)
	}
	if err != nil {
		return fmt.Errorf("spool %s: %w", s.path, err)
	}
	return nil
}

// FlushSpool writes the events spooled in dumpFolder (SpoolFile: records
// of runs whose store could not be reached) to the store at target and
// empties the spool. It returns the number of events written and of
// unreadable lines skipped; a folder without a spool flushes nothing.
func FlushSpool(ctx context.Context, target, dumpFolder string) (written, skipped int, err error) {
	s := &spool{path: filepath.Join(dumpFolder, SpoolFile)}
	evs, bad, err := s.read()
	if err != nil || len(evs) == 0 {
		return 0, bad, err
	}
	st, err := Open(ctx, target)
	if err != nil {
		return 0, bad, err
	}
	defer st.Close()
	if err := st.apply(ctx, evs); err != nil {
		return 0, bad, fmt.Errorf("runstore: %s: %w", s.path, err)
	}
	if err := os.Remove(s.path); err != nil {
		return len(evs), bad, fmt.Errorf("runstore: %s is in the store but could not be removed (flushing it again is harmless): %w", s.path, err)
	}
	return len(evs), bad, nil
}
