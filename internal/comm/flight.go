package comm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Flight recorder states of an operation.
const (
	StateScheduled = "scheduled" // issued, waiting for earlier operations
	StateStarted   = "started"   // executing
	StateCompleted = "completed"
	StateFailed    = "failed"
)

// FlightEntry is one operation in a flight recorder dump.
type FlightEntry struct {
	ID         uint64     `json:"id"`
	Group      string     `json:"group"`
	GroupKey   string     `json:"group_key"`
	GroupRanks []int      `json:"group_ranks"`
	Seq        uint64     `json:"seq"`
	Op         string     `json:"op"`
	Peer       *int       `json:"peer,omitempty"` // send/recv: the peer's world rank
	DType      string     `json:"dtype,omitempty"`
	Count      int        `json:"count"`
	Bytes      int64      `json:"bytes"`
	State      string     `json:"state"`
	Scheduled  time.Time  `json:"scheduled"`
	Started    *time.Time `json:"started,omitempty"`
	Ended      *time.Time `json:"ended,omitempty"`
	Error      string     `json:"error,omitempty"`
}

// FlightGroup summarises a group's collectives in a dump, including those
// that fell out of the ring buffer.
type FlightGroup struct {
	Group         string `json:"group"`
	GroupKey      string `json:"group_key"`
	GroupRanks    []int  `json:"group_ranks"`
	LastScheduled uint64 `json:"last_scheduled"`
	LastStarted   uint64 `json:"last_started"`
	LastCompleted uint64 `json:"last_completed"`
}

// FlightDump is the content of a flight-rank<R>.json file.
type FlightDump struct {
	Rank      int           `json:"rank"`
	WorldSize int           `json:"world_size"`
	PID       int           `json:"pid"`
	Host      string        `json:"host"`
	Time      time.Time     `json:"time"`
	Reason    string        `json:"reason,omitempty"`
	Groups    []FlightGroup `json:"groups"`
	Entries   []FlightEntry `json:"entries"`
}

type flight struct {
	mu      sync.Mutex
	rank    int
	size    int
	ring    []FlightEntry
	next    uint64 // id of the next entry; ids start at 1
	groups  map[string]*FlightGroup
	dumpMu  sync.Mutex
	dumped  map[string]time.Time
	started time.Time
}

// newFlight returns a recorder of the last capacity operations; capacity
// <= 0 returns one that records nothing and never dumps.
func newFlight(rank, size, capacity int) *flight {
	capacity = max(capacity, 0)
	return &flight{rank: rank, size: size, ring: make([]FlightEntry, capacity), next: 1,
		groups: make(map[string]*FlightGroup), dumped: make(map[string]time.Time), started: time.Now()}
}

// disabled reports a recorder of capacity 0 (comm.trace_buf_size = 0).
func (f *flight) disabled() bool { return len(f.ring) == 0 }

func (f *flight) add(g *group, r *request) uint64 {
	e := FlightEntry{
		Group: g.name, GroupKey: g.key, GroupRanks: g.world, Seq: r.seq, Op: r.kind.String(),
		Count: r.count(), State: StateScheduled, Scheduled: time.Now(),
	}
	if r.kind != opBarrier {
		e.DType = r.dtype.String()
		e.Bytes = int64(e.Count) * int64(r.dtype.Size())
	}
	if r.kind == opSend || r.kind == opRecv {
		p := g.world[r.peer]
		e.Peer = &p
	}
	if f.disabled() {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e.ID = f.next
	f.next++
	f.ring[e.ID%uint64(len(f.ring))] = e
	if e.Peer == nil {
		f.group(g).LastScheduled = r.seq
	}
	return e.ID
}

func (f *flight) group(g *group) *FlightGroup {
	fg := f.groups[g.key]
	if fg == nil {
		fg = &FlightGroup{Group: g.name, GroupKey: g.key, GroupRanks: g.world}
		f.groups[g.key] = fg
	}
	return fg
}

func (f *flight) entry(id uint64) *FlightEntry {
	if f.disabled() {
		return nil
	}
	e := &f.ring[id%uint64(len(f.ring))]
	if e.ID != id {
		return nil
	}
	return e
}

func (f *flight) start(id uint64) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if e := f.entry(id); e != nil {
		e.State, e.Started = StateStarted, &now
		if e.Peer == nil {
			if fg := f.groups[e.GroupKey]; fg != nil {
				fg.LastStarted = e.Seq
			}
		}
	}
}

func (f *flight) end(id uint64, err error) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.entry(id)
	if e == nil {
		return
	}
	e.Ended = &now
	if err != nil {
		e.State, e.Error = StateFailed, err.Error()
		return
	}
	e.State = StateCompleted
	if e.Peer == nil {
		if fg := f.groups[e.GroupKey]; fg != nil {
			fg.LastCompleted = e.Seq
		}
	}
}

func (f *flight) snapshot(reason string) FlightDump {
	host, _ := os.Hostname()
	d := FlightDump{Rank: f.rank, WorldSize: f.size, PID: os.Getpid(), Host: host, Time: time.Now(), Reason: reason}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fg := range f.groups {
		d.Groups = append(d.Groups, *fg)
	}
	sort.Slice(d.Groups, func(i, j int) bool { return d.Groups[i].GroupKey < d.Groups[j].GroupKey })
	first := uint64(1)
	if f.next > uint64(len(f.ring)) {
		first = f.next - uint64(len(f.ring))
	}
	for id := first; id < f.next; id++ {
		if e := f.entry(id); e != nil {
			d.Entries = append(d.Entries, *e)
		}
	}
	return d
}

// dumpTo writes the recorder to dir/flight-rank<R>.json (nothing if dir is
// empty). Repeated dumps within a second are skipped.
func (f *flight) dumpTo(dir string) error {
	if dir == "" {
		return nil
	}
	f.dumpMu.Lock()
	defer f.dumpMu.Unlock()
	if t, ok := f.dumped[dir]; ok && time.Since(t) < time.Second {
		return nil
	}
	f.dumped[dir] = time.Now()
	return f.write(dir, "")
}

func (f *flight) write(dir, reason string) error {
	if f.disabled() {
		return nil
	}
	b, err := json.MarshalIndent(f.snapshot(reason), "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("comm: flight recorder dump: %w", err)
	}
	name := filepath.Join(dir, fmt.Sprintf("flight-rank%d.json", f.rank))
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("comm: flight recorder dump: %w", err)
	}
	if err := os.Rename(tmp, name); err != nil {
		return fmt.Errorf("comm: flight recorder dump: %w", err)
	}
	return nil
}

var (
	flightsMu sync.Mutex
	flights   = map[*flight]bool{}
)

func registerFlight(f *flight) {
	flightsMu.Lock()
	flights[f] = true
	flightsMu.Unlock()
}

func unregisterFlight(f *flight) {
	flightsMu.Lock()
	delete(flights, f)
	flightsMu.Unlock()
}

// DumpFlight writes the flight recorder of every open world of this
// process to dir/flight-rank<R>.json.
func DumpFlight(dir, reason string) error {
	flightsMu.Lock()
	fs := make([]*flight, 0, len(flights))
	for f := range flights {
		fs = append(fs, f)
	}
	flightsMu.Unlock()
	var first error
	for _, f := range fs {
		if err := f.write(dir, reason); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Stall is a collective that some members of a group entered and others
// never reached.
type Stall struct {
	Group      string `json:"group"`
	GroupRanks []int  `json:"group_ranks"`
	Seq        uint64 `json:"seq"`
	Op         string `json:"op"`
	// Waiting are the ranks that started the collective and did not
	// complete it.
	Waiting []int `json:"waiting"`
	// Missing are the ranks whose last collective on the group came
	// before Seq: they never entered it.
	Missing []int `json:"missing"`
	// LastSeq gives, for each missing rank, the last sequence number it
	// started on the group (0: none).
	LastSeq map[int]uint64 `json:"last_seq"`
}

// Report is the result of AnalyzeFlight.
type Report struct {
	Ranks        []int   `json:"ranks"`         // ranks that left a dump
	MissingDumps []int   `json:"missing_dumps"` // ranks of the world without a dump
	Stalls       []Stall `json:"stalls"`
	Summary      string  `json:"summary"`
}

// AnalyzeFlight reads every flight-rank*.json in dir and finds, for each
// group, the lowest sequence number that some members started but others
// never reached, naming those that never entered it.
func AnalyzeFlight(dir string) (Report, error) {
	var rep Report
	files, err := filepath.Glob(filepath.Join(dir, "flight-rank*.json"))
	if err != nil {
		return rep, err
	}
	if len(files) == 0 {
		return rep, fmt.Errorf("comm: no flight-rank*.json dumps in %s", dir)
	}
	dumps := map[int]FlightDump{}
	worldSize := 0
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			return rep, err
		}
		var d FlightDump
		if err := json.Unmarshal(b, &d); err != nil {
			return rep, fmt.Errorf("comm: flight dump %s: %w", name, err)
		}
		dumps[d.Rank] = d
		worldSize = max(worldSize, d.WorldSize)
		rep.Ranks = append(rep.Ranks, d.Rank)
	}
	sort.Ints(rep.Ranks)
	for r := range worldSize {
		if _, ok := dumps[r]; !ok {
			rep.MissingDumps = append(rep.MissingDumps, r)
		}
	}

	type member struct {
		started, completed uint64
		ok                 bool
		ops                map[uint64]string
	}
	type groupView struct {
		name    string
		ranks   []int
		members map[int]*member
	}
	views := map[string]*groupView{}
	var keys []string
	for _, rank := range rep.Ranks {
		d := dumps[rank]
		for _, fg := range d.Groups {
			v := views[fg.GroupKey]
			if v == nil {
				v = &groupView{name: fg.Group, ranks: fg.GroupRanks, members: map[int]*member{}}
				views[fg.GroupKey] = v
				keys = append(keys, fg.GroupKey)
			}
			v.members[rank] = &member{started: fg.LastStarted, completed: fg.LastCompleted, ok: true, ops: map[uint64]string{}}
		}
		for _, e := range d.Entries {
			if v := views[e.GroupKey]; v != nil && e.Peer == nil {
				if m := v.members[rank]; m != nil {
					m.ops[e.Seq] = e.Op
				}
			}
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := views[k]
		// The stalled collective: the lowest sequence number started but
		// not completed by some member.
		var seq uint64
		for _, m := range v.members {
			if m.started > m.completed && (seq == 0 || m.completed+1 < seq) {
				seq = m.completed + 1
			}
		}
		if seq == 0 {
			continue
		}
		st := Stall{Group: v.name, GroupRanks: v.ranks, Seq: seq, LastSeq: map[int]uint64{}}
		for _, r := range v.ranks {
			m := v.members[r]
			if m == nil {
				// No dump, or a dump without the group: treat as missing.
				if _, ok := dumps[r]; ok {
					st.Missing = append(st.Missing, r)
					st.LastSeq[r] = 0
				}
				continue
			}
			if st.Op == "" {
				st.Op = m.ops[seq]
			}
			switch {
			case m.started < seq:
				st.Missing = append(st.Missing, r)
				st.LastSeq[r] = m.started
			case m.completed < seq:
				st.Waiting = append(st.Waiting, r)
			}
		}
		if st.Op == "" {
			st.Op = "collective"
		}
		rep.Stalls = append(rep.Stalls, st)
	}
	rep.Summary = summarize(rep)
	return rep, nil
}

func summarize(rep Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "flight recorder dumps of ranks %v", rep.Ranks)
	if len(rep.MissingDumps) > 0 {
		fmt.Fprintf(&b, "; no dump from ranks %v (dead, or not reachable by SIGUSR1)", rep.MissingDumps)
	}
	b.WriteString("\n")
	if len(rep.Stalls) == 0 {
		b.WriteString("no stalled collective: every rank that started a collective also completed it, or no rank got ahead of another\n")
		return b.String()
	}
	for _, s := range rep.Stalls {
		fmt.Fprintf(&b, "group %s (ranks %v): %s #%d", s.Group, s.GroupRanks, s.Op, s.Seq)
		if len(s.Waiting) > 0 {
			fmt.Fprintf(&b, " was entered by %s", rankList(s.Waiting))
		}
		if len(s.Missing) > 0 {
			parts := make([]string, 0, len(s.Missing))
			for _, r := range s.Missing {
				if last := s.LastSeq[r]; last > 0 {
					parts = append(parts, fmt.Sprintf("rank %d (last started #%d)", r, last))
				} else {
					parts = append(parts, fmt.Sprintf("rank %d (started none)", r))
				}
			}
			fmt.Fprintf(&b, "; never entered by %s", strings.Join(parts, ", "))
		}
		var unknown []int
		for _, r := range s.GroupRanks {
			if slices.Contains(rep.MissingDumps, r) {
				unknown = append(unknown, r)
			}
		}
		if len(unknown) > 0 {
			fmt.Fprintf(&b, "; no dump from %s", rankList(unknown))
		}
		b.WriteString("\n")
	}
	return b.String()
}
