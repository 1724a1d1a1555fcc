package comm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// The shared-memory transport maps one segment per group (a file in
// ShmDir, unlinked as soon as every member mapped it). Each rank owns a
// control block and three staging slots in it. A rank publishes progress
// by bumping its step counter; peers wait for a counter to reach a value,
// spinning briefly and then sleeping on a futex. Every rank executes the
// same sequence of steps, so step values line up across ranks.
//
// Every operation starts with an entry step: each rank writes a descriptor
// of the operation (kind, dtype, reduction, sequence number, size) and
// checks everyone else's, so that mismatched collectives are reported, and
// so that a timeout can tell which ranks never entered.
//
// Reductions are direct: in round k, each rank copies piece k of every
// other rank's chunk into its slot, then folds the pieces of its own chunk
// from all slots in rank order (the same order as the TCP transport, so
// the results are bitwise equal), writes the result into its buffer and
// slot, and, for an all-reduce, copies the other ranks' reduced pieces out
// of their slots. Three slots let round k+1 be staged while peers still
// read round k.

const (
	shmSlots     = 3
	shmHeader    = 4096
	ctrlFlag     = 0
	ctrlSleepers = 64
	ctrlEntered  = 128
	ctrlDesc     = 192 // two descriptors of 8 uint64
	ctrlCounts   = 320 // two sets of 2n int64 (all-to-all counts)
	shmMagic     = 0x5454534d454d3031
	shmSpins     = 200
	shmFoldBlock = 16 << 10
)

type shmState struct {
	mem        []byte
	n, me      int
	slotBytes  int
	ctrlStride int
	dataOff    int
	step       uint32
	spin       time.Duration // how long to spin before sleeping
}

func align(x, a int) int { return (x + a - 1) / a * a }

func shmLayout(n, slot int) (ctrlStride, dataOff, size int) {
	ctrlStride = align(ctrlCounts+2*2*8*n, 128)
	dataOff = align(shmHeader+n*ctrlStride, 4096)
	return ctrlStride, dataOff, dataOff + n*shmSlots*slot
}

func (s *shmState) ptr(off int) unsafe.Pointer { return unsafe.Pointer(&s.mem[off]) }
func (s *shmState) ctrl(r, off int) unsafe.Pointer {
	return s.ptr(shmHeader + r*s.ctrlStride + off)
}
func (s *shmState) flag(r int) *uint32     { return (*uint32)(s.ctrl(r, ctrlFlag)) }
func (s *shmState) sleepers(r int) *uint32 { return (*uint32)(s.ctrl(r, ctrlSleepers)) }
func (s *shmState) entered(r int) *uint64  { return (*uint64)(s.ctrl(r, ctrlEntered)) }
func (s *shmState) desc(r int, seq uint64) []uint64 {
	return unsafe.Slice((*uint64)(s.ctrl(r, ctrlDesc+64*int(seq%2))), 8)
}
func (s *shmState) counts(r int, seq uint64) []int64 {
	return unsafe.Slice((*int64)(s.ctrl(r, ctrlCounts+16*s.n*int(seq%2))), 2*s.n)
}

// slot returns rank r's staging slot for round k.
func (s *shmState) slot(r, k int) []byte {
	off := s.dataOff + (r*shmSlots+k%shmSlots)*s.slotBytes
	return s.mem[off : off+s.slotBytes : off+s.slotBytes]
}

func (s *shmState) close() {
	if s.mem != nil {
		shmUnmap(s.mem)
		s.mem = nil
	}
}

// setupShm creates (group rank 0) or maps (others) the group's segment.
func (g *group) setupShm(ctx context.Context) error {
	n := g.size
	slot := g.opts.ShmSlotBytes
	if slot <= 0 {
		// About 48 MiB per group, slots between 1 and 8 MiB: large slots
		// mean fewer synchronisations per operation.
		slot = min(max(48<<20/(shmSlots*n), 1<<20), 8<<20) &^ (64<<10 - 1)
	}
	slot = max(slot, align(n*64, 64))
	stride, dataOff, size := shmLayout(n, slot)
	s := &shmState{n: n, me: g.rank, slotBytes: slot, ctrlStride: stride, dataOff: dataOff}
	if n <= runtime.NumCPU() {
		s.spin = 20 * time.Microsecond
	}
	deadline, _ := ctx.Deadline()
	for _, p := range g.peers {
		if p != nil {
			p.ctrl.SetDeadline(deadline)
			defer p.ctrl.SetDeadline(time.Time{})
		}
	}
	if g.rank == 0 {
		sweepShm(g.opts.ShmDir)
		var id [8]byte
		rand.Read(id[:])
		path := filepath.Join(g.opts.ShmDir, fmt.Sprintf("titan-comm-%d-%s", pidOf(), hex.EncodeToString(id[:])))
		mem, err := shmCreate(path, size)
		msg := path
		if err != nil {
			msg = "!" + err.Error()
		} else {
			s.mem = mem
			h := unsafe.Slice((*uint64)(s.ptr(0)), 3)
			h[0], h[1], h[2] = shmMagic, uint64(n), uint64(slot)
		}
		var firstErr error
		for _, p := range g.peers {
			if p != nil {
				if werr := writeMsg(p.ctrl, msgShmName, []byte(msg)); werr != nil && firstErr == nil {
					firstErr = fmt.Errorf("rank %d: %w", p.world, werr)
				}
			}
		}
		for _, p := range g.peers {
			if p == nil || err != nil {
				continue
			}
			typ, payload, rerr := readMsg(p.ctrl)
			switch {
			case rerr != nil:
				rerr = fmt.Errorf("rank %d did not map the shared memory: %w", p.world, rerr)
			case typ != msgShmOK:
				rerr = fmt.Errorf("rank %d sent message %d instead of mapping the shared memory", p.world, typ)
			case len(payload) > 0:
				rerr = fmt.Errorf("rank %d could not map the shared memory: %s", p.world, payload)
			}
			if rerr != nil && firstErr == nil {
				firstErr = rerr
			}
		}
		if err == nil {
			shmUnlink(path)
		}
		if err == nil {
			err = firstErr
		}
		if err != nil {
			s.close()
			return err
		}
		g.shm = s
		return nil
	}
	p0 := g.peers[0]
	typ, payload, err := readMsg(p0.ctrl)
	if err != nil {
		return fmt.Errorf("waiting for rank %d to create the shared memory: %w", p0.world, err)
	}
	if typ != msgShmName {
		return fmt.Errorf("rank %d sent message %d instead of the shared memory name", p0.world, typ)
	}
	path := string(payload)
	if msg, ok := strings.CutPrefix(path, "!"); ok {
		return fmt.Errorf("rank %d could not create the shared memory: %s", p0.world, msg)
	}
	mem, err := shmOpen(path, size)
	if err == nil {
		h := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), 3)
		if h[0] != shmMagic || h[1] != uint64(n) || h[2] != uint64(slot) {
			shmUnmap(mem)
			err = fmt.Errorf("shared memory %s has layout (%d ranks, %d-byte slots), want (%d, %d)", path, h[1], h[2], n, slot)
		}
	}
	reply := ""
	if err != nil {
		reply = err.Error()
	}
	if werr := writeMsg(p0.ctrl, msgShmOK, []byte(reply)); werr != nil && err == nil {
		shmUnmap(mem)
		err = fmt.Errorf("rank %d: %w", p0.world, werr)
	}
	if err != nil {
		// Rank 0 unlinks once everyone answered; if it died, clean up.
		shmUnlink(path)
		return err
	}
	s.mem = mem
	g.shm = s
	return nil
}

type shmOp struct {
	g        *group
	r        *request
	s        *shmState
	deadline time.Time
}

func (o *shmOp) publish() uint32 {
	s := o.s
	s.step++
	f := s.flag(s.me)
	atomic.StoreUint32(f, s.step)
	if atomic.LoadUint32(s.sleepers(s.me)) != 0 {
		futexWake(f)
	}
	return s.step
}

func reached(v, target uint32) bool { return int32(v-target) >= 0 }

// wait blocks until rank q's step counter reaches target.
func (o *shmOp) wait(q int, target uint32) error {
	s := o.s
	f := s.flag(q)
	for range shmSpins {
		if reached(atomic.LoadUint32(f), target) {
			return nil
		}
	}
	if s.spin > 0 {
		// As many ranks as cores: a peer is likely running right now, so
		// spinning a little beats a futex sleep and wake-up.
		start := time.Now()
		for i := 0; ; i++ {
			if reached(atomic.LoadUint32(f), target) {
				return nil
			}
			if i%64 == 63 && time.Since(start) > s.spin {
				break
			}
		}
	}
	sl := s.sleepers(q)
	for {
		v := atomic.LoadUint32(f)
		if reached(v, target) {
			return nil
		}
		if pe := o.g.peers[q].goneErr(); pe != nil {
			if reached(atomic.LoadUint32(f), target) {
				return nil
			}
			return pe
		}
		if o.g.isBroken() {
			return errOpAborted
		}
		now := time.Now()
		if !now.Before(o.deadline) {
			return o.blame(target)
		}
		atomic.AddUint32(sl, 1)
		futexWait(f, v, min(o.deadline.Sub(now), 5*time.Millisecond))
		atomic.AddUint32(sl, ^uint32(0))
	}
}

func (o *shmOp) waitAll(target uint32) error {
	for q := range o.s.n {
		if q != o.s.me {
			if err := o.wait(q, target); err != nil {
				return err
			}
		}
	}
	return nil
}

func (o *shmOp) blame(target uint32) error {
	s, g := o.s, o.g
	w := &waitErr{op: o.r.kind.String(), seq: o.r.seq}
	for q := range s.n {
		if q == s.me || reached(atomic.LoadUint32(s.flag(q)), target) {
			continue
		}
		w.waiting = append(w.waiting, g.world[q])
		if atomic.LoadUint64(s.entered(q)) < o.r.seq {
			w.notEntered = append(w.notEntered, g.world[q])
		}
	}
	return w
}

func (g *group) shmRun(r *request, deadline time.Time) error {
	o := &shmOp{g: g, r: r, s: g.shm, deadline: deadline}
	if err := o.enter(); err != nil {
		return err
	}
	switch r.kind {
	case opBarrier:
		return nil
	case opAllReduce:
		lo, hi := ChunkBounds(r.a.n, g.size, g.rank)
		return o.reduce(r.a, r.a.Slice(lo, hi), true)
	case opReduceScatter:
		return o.reduce(r.a, r.b, false)
	case opAllGather:
		return o.allGather()
	case opBroadcast:
		return o.broadcast()
	case opAllToAll:
		return o.allToAll()
	}
	return fmt.Errorf("unknown operation %v", r.kind)
}

func (o *shmOp) descriptor() [8]uint64 {
	h := o.r.header()
	return [8]uint64{uint64(h.kind), uint64(h.dtype), uint64(h.op), h.seq, uint64(h.count), uint64(h.root)}
}

func descHeader(d []uint64) opHeader {
	return opHeader{kind: opKind(d[0]), dtype: DType(d[1]), op: ReduceOp(d[2]), seq: d[3], count: int64(d[4]), root: int64(d[5])}
}

// enter is the first step of every operation: publish and compare the
// operation descriptors (and all-to-all counts).
func (o *shmOp) enter() error {
	s, r := o.s, o.r
	mine := o.descriptor()
	copy(s.desc(s.me, r.seq), mine[:])
	if r.kind == opAllToAll {
		c := s.counts(s.me, r.seq)
		for i := range s.n {
			c[i], c[s.n+i] = int64(r.sendCounts[i]), int64(r.recvCounts[i])
		}
	}
	atomic.StoreUint64(s.entered(s.me), r.seq)
	if err := o.waitAll(o.publish()); err != nil {
		return err
	}
	for q := range s.n {
		theirs := s.desc(q, r.seq)
		if q != s.me && [8]uint64(theirs) != mine {
			return fmt.Errorf("rank %d issued %v while this rank issued %v", o.g.world[q], descHeader(theirs), descHeader(mine[:]))
		}
	}
	if r.kind == opAllToAll {
		for i := range s.n {
			for j := range s.n {
				sent, recv := s.counts(i, r.seq)[j], s.counts(j, r.seq)[s.n+i]
				if sent != recv {
					return fmt.Errorf("all-to-all counts disagree: rank %d sends %d elements to rank %d, which expects %d",
						o.g.world[i], sent, o.g.world[j], recv)
				}
			}
		}
	}
	return nil
}

func (o *shmOp) reduce(send, out Buffer, gather bool) error {
	s := o.s
	n, me := s.n, s.me
	N, dt, op := send.n, send.dtype, o.r.op
	es := dt.Size()
	P := s.slotBytes / (n * es)
	pb := P * es
	R := (ChunkLen(N, n, n-1) + P - 1) / P
	if R == 0 {
		return nil
	}
	lo, _ := ChunkBounds(N, n, me)
	piece := func(j, k int) (int, int) {
		cl, ch := ChunkBounds(N, n, j)
		return min(cl+k*P, ch), min(cl+(k+1)*P, ch)
	}
	stage := func(k int) {
		sl := s.slot(me, k)
		for j := range n {
			if j != me {
				plo, phi := piece(j, k)
				copy(sl[j*pb:], send.bytes(plo, phi))
			}
		}
	}
	srcs := make([][]byte, n)
	reduceMine := func(k int) {
		plo, phi := piece(me, k)
		if plo == phi {
			return
		}
		l := (phi - plo) * es
		for q := range n {
			if q == me {
				srcs[q] = send.bytes(plo, phi)
			} else {
				srcs[q] = s.slot(q, k)[me*pb : me*pb+l]
			}
		}
		dst := out.bytes(plo-lo, phi-lo)
		if !gather {
			fold(dt, op, dst, srcs)
			return
		}
		// Fold in L1-sized blocks and publish each block to the slot
		// while it is still in cache.
		res := s.slot(me, k)[me*pb : me*pb+l]
		part := make([][]byte, n)
		for b := 0; b < l; b += shmFoldBlock {
			e := min(b+shmFoldBlock, l)
			for q := range n {
				part[q] = srcs[q][b:e]
			}
			fold(dt, op, dst[b:e], part)
			copy(res[b:e], dst[b:e])
		}
	}
	copyOut := func(k int) {
		for q := range n {
			if q != me {
				plo, phi := piece(q, k)
				copy(send.bytes(plo, phi), s.slot(q, k)[q*pb:])
			}
		}
	}
	stage(0)
	staged := o.publish()
	for k := range R {
		if err := o.waitAll(staged); err != nil {
			return err
		}
		if !gather {
			if k+1 < R {
				stage(k + 1)
				staged = o.publish()
			}
			reduceMine(k)
			continue
		}
		reduceMine(k)
		reduced := o.publish()
		if k+1 < R {
			stage(k + 1)
			staged = o.publish()
		}
		if err := o.waitAll(reduced); err != nil {
			return err
		}
		copyOut(k)
	}
	return nil
}

func (o *shmOp) allGather() error {
	s, r := o.s, o.r
	n, me := s.n, s.me
	send, recv := r.a, r.b
	es := send.dtype.Size()
	P := s.slotBytes / es
	R := (ChunkLen(recv.n, n, n-1) + P - 1) / P
	lo, hi := ChunkBounds(recv.n, n, me)
	if dst := recv.bytes(lo, hi); len(dst) > 0 && unsafePointer(dst) != unsafePointer(send.b) {
		copy(dst, send.b)
	}
	if R == 0 {
		return nil
	}
	stage := func(k int) {
		copy(s.slot(me, k), send.bytes(min(k*P, send.n), min((k+1)*P, send.n)))
	}
	copyOut := func(k int) {
		for q := range n {
			if q != me {
				cl, ch := ChunkBounds(recv.n, n, q)
				copy(recv.bytes(min(cl+k*P, ch), min(cl+(k+1)*P, ch)), s.slot(q, k))
			}
		}
	}
	return o.rounds(R, stage, copyOut, nil)
}

// rounds runs R rounds of stage(k) → publish → wait(all, or only the ranks
// in from) → consume(k), staging round k+1 before consuming round k.
func (o *shmOp) rounds(R int, stage, consume func(k int), from []int) error {
	stage(0)
	staged := o.publish()
	for k := range R {
		var err error
		if from == nil {
			err = o.waitAll(staged)
		} else {
			for _, q := range from {
				if err = o.wait(q, staged); err != nil {
					break
				}
			}
		}
		if err != nil {
			return err
		}
		if k+1 < R {
			stage(k + 1)
			staged = o.publish()
		}
		consume(k)
	}
	return nil
}

func (o *shmOp) broadcast() error {
	s, r := o.s, o.r
	buf := r.a
	P := s.slotBytes / buf.dtype.Size()
	R := (buf.n + P - 1) / P
	if R == 0 {
		return nil
	}
	piece := func(k int) []byte { return buf.bytes(min(k*P, buf.n), min((k+1)*P, buf.n)) }
	isRoot := s.me == r.root
	stage := func(k int) {
		if isRoot {
			copy(s.slot(s.me, k), piece(k))
		}
	}
	consume := func(k int) {
		if !isRoot {
			copy(piece(k), s.slot(r.root, k))
		}
	}
	var from []int
	if !isRoot {
		from = []int{r.root}
	}
	return o.rounds(R, stage, consume, from)
}

func (o *shmOp) allToAll() error {
	s, r := o.s, o.r
	n, me := s.n, s.me
	send, recv := r.a, r.b
	es := send.dtype.Size()
	P := s.slotBytes / (n * es)
	pb := P * es
	copy(recv.bytes(r.recvOff[me], r.recvOff[me+1]), send.bytes(r.sendOff[me], r.sendOff[me+1]))
	maxC := int64(0)
	for i := range n {
		c := s.counts(i, r.seq)
		for j := range n {
			if i != j {
				maxC = max(maxC, c[j])
			}
		}
	}
	R := int((maxC + int64(P) - 1) / int64(P))
	if R == 0 {
		return nil
	}
	stage := func(k int) {
		sl := s.slot(me, k)
		for j := range n {
			if j != me {
				lo := min(r.sendOff[j]+k*P, r.sendOff[j+1])
				copy(sl[j*pb:], send.bytes(lo, min(lo+P, r.sendOff[j+1])))
			}
		}
	}
	consume := func(k int) {
		for i := range n {
			if i != me {
				lo := min(r.recvOff[i]+k*P, r.recvOff[i+1])
				copy(recv.bytes(lo, min(lo+P, r.recvOff[i+1])), s.slot(i, k)[me*pb:])
			}
		}
	}
	return o.rounds(R, stage, consume, nil)
}

var errNoShm = errors.New("shared memory transport not supported on this system")

// sweepShm removes segments left in dir by processes that died between
// creating a segment and unlinking it (a short window at group creation).
func sweepShm(dir string) {
	names, _ := filepath.Glob(filepath.Join(dir, "titan-comm-*-*"))
	for _, name := range names {
		f := strings.Split(filepath.Base(name), "-")
		if len(f) != 4 {
			continue
		}
		if pid, err := strconv.Atoi(f[2]); err == nil && pid > 0 && !processAlive(pid) {
			shmUnlink(name)
		}
	}
}
