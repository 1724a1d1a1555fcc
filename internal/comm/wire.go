package comm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Connection kinds of a pair of group members.
const (
	connCtrl = 1 // control: setup, abort notices, goodbyes; EOF means the peer died
	connData = 2 // collective data (TCP transport)
	connP2P  = 3 // point-to-point Send/Recv
)

const (
	helloMagic = 0x5454434e // "TTCN"
	hdrMagic   = 0x54544f50 // "TTOP"
	wireVer    = 2
	hdrSize    = 48
	// maxGroupKey bounds the group key of a hello, maxMsg the payload of a
	// control message: both are checked before anything is allocated.
	maxGroupKey = 4096
	maxMsg      = 1 << 20
)

// hello is the first message on every connection: it names the world
// (nonce), the group, the dialing rank and the connection's purpose, and
// carries the dialer's challenge of the authentication (see auth.go).
type hello struct {
	nonce [16]byte
	group string
	from  int // world rank of the dialer
	kind  int
	idx   int
}

func writeHello(w io.Writer, h hello, challenge []byte) error {
	if len(h.group) > maxGroupKey {
		return fmt.Errorf("comm: group key too long (%d bytes)", len(h.group))
	}
	if len(challenge) != authNonceSize {
		return fmt.Errorf("comm: challenge of %d bytes, want %d", len(challenge), authNonceSize)
	}
	b := make([]byte, 0, 36+len(h.group)+authNonceSize)
	b = binary.LittleEndian.AppendUint32(b, helloMagic)
	b = binary.LittleEndian.AppendUint16(b, wireVer)
	b = binary.LittleEndian.AppendUint16(b, uint16(h.kind))
	b = append(b, h.nonce[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.from))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.idx))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.group)))
	b = append(b, h.group...)
	b = append(b, challenge...)
	_, err := w.Write(b)
	return err
}

// readHello reads a hello and the dialer's challenge.
func readHello(r io.Reader) (hello, []byte, error) {
	var b [36]byte
	var h hello
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return h, nil, err
	}
	if binary.LittleEndian.Uint32(b[0:]) != helloMagic {
		return h, nil, errors.New("not a titan comm connection (bad magic)")
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != wireVer {
		return h, nil, fmt.Errorf("wire version %d, want %d", v, wireVer)
	}
	h.kind = int(binary.LittleEndian.Uint16(b[6:]))
	copy(h.nonce[:], b[8:24])
	h.from = int(binary.LittleEndian.Uint32(b[24:]))
	h.idx = int(binary.LittleEndian.Uint32(b[28:]))
	n := binary.LittleEndian.Uint32(b[32:])
	if n > maxGroupKey {
		return h, nil, fmt.Errorf("group key of %d bytes (at most %d)", n, maxGroupKey)
	}
	rest := make([]byte, int(n)+authNonceSize)
	if _, err := io.ReadFull(r, rest); err != nil {
		return h, nil, err
	}
	h.group = string(rest[:n])
	return h, rest[n:], nil
}

// Control messages.
const (
	msgReady   = 1 // payload: JSON groupInfo
	msgShmName = 2 // payload: path of the segment rank 0 created
	msgShmOK   = 3 // payload: empty (mapped) or an error text
	msgAbort   = 4 // payload: reason
	msgBye     = 5 // payload: empty
)

func writeMsg(c io.Writer, typ byte, payload []byte) error {
	if len(payload) > maxMsg {
		return fmt.Errorf("comm: control message of %d bytes (at most %d)", len(payload), maxMsg)
	}
	b := make([]byte, 5+len(payload))
	b[0] = typ
	binary.LittleEndian.PutUint32(b[1:], uint32(len(payload)))
	copy(b[5:], payload)
	_, err := c.Write(b)
	return err
}

func readMsg(c io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(h[1:])
	if n > maxMsg {
		return 0, nil, fmt.Errorf("control message of %d bytes (at most %d)", n, maxMsg)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(c, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}

// opHeader precedes the data of every operation on a TCP connection, so
// that mismatched operations are reported instead of corrupting data.
type opHeader struct {
	kind  opKind
	dtype DType
	op    ReduceOp
	seq   uint64
	count int64 // elements: the op's total, or this pair's share (all-to-all, p2p)
	root  int64
}

func (h opHeader) marshal(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], hdrMagic)
	b[4] = byte(h.kind)
	b[5] = byte(h.dtype)
	b[6] = byte(h.op)
	b[7] = 0
	binary.LittleEndian.PutUint64(b[8:], h.seq)
	binary.LittleEndian.PutUint64(b[16:], uint64(h.count))
	binary.LittleEndian.PutUint64(b[24:], uint64(h.root))
	clear(b[32:hdrSize])
}

func unmarshalHeader(b []byte) (opHeader, error) {
	if len(b) < hdrSize || binary.LittleEndian.Uint32(b) != hdrMagic {
		return opHeader{}, errors.New("stream out of sync (bad operation header)")
	}
	return opHeader{
		kind:  opKind(b[4]),
		dtype: DType(b[5]),
		op:    ReduceOp(b[6]),
		seq:   binary.LittleEndian.Uint64(b[8:]),
		count: int64(binary.LittleEndian.Uint64(b[16:])),
		root:  int64(binary.LittleEndian.Uint64(b[24:])),
	}, nil
}

func (h opHeader) String() string {
	s := fmt.Sprintf("%s #%d (%s, %d elements", h.kind, h.seq, h.dtype, h.count)
	switch h.kind {
	case opAllReduce, opReduceScatter:
		s += ", " + h.op.String()
	case opBroadcast:
		s += fmt.Sprintf(", root %d", h.root)
	}
	return s + ")"
}
