package comm

import (
	"bytes"
	"io"
	"testing"
)

// fuzzConn is a connection whose peer sent data and reads nothing back.
type fuzzConn struct{ r io.Reader }

func (c fuzzConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c fuzzConn) Write(p []byte) (int, error) { return len(p), nil }

// FuzzWire feeds arbitrary bytes to every parser of the data plane's wire
// format (hello, control message, operation header) and to the accepting
// side of the authentication: no panic, lengths capped before anything is
// allocated, what parses re-encodes to the bytes it came from, and a
// stranger's bytes are never admitted.
func FuzzWire(f *testing.F) {
	var hl bytes.Buffer
	writeHello(&hl, hello{nonce: [16]byte{1}, group: "comm/world", from: 1, kind: connData, idx: 0}, make([]byte, authNonceSize))
	f.Add(hl.Bytes())
	f.Add(hl.Bytes()[:36])
	huge := bytes.Clone(hl.Bytes())
	huge[32], huge[33], huge[34], huge[35] = 0xff, 0xff, 0xff, 0xff // group key length 4 GiB
	f.Add(huge)
	var msg bytes.Buffer
	writeMsg(&msg, msgReady, []byte(`{"key":"comm/world","world":[0,1],"transport":"tcp"}`))
	f.Add(msg.Bytes())
	f.Add([]byte{msgAbort, 0xff, 0xff, 0xff, 0x7f}) // payload length 2 GiB
	var hb [hdrSize]byte
	opHeader{kind: opAllReduce, dtype: Float32, op: Sum, seq: 3, count: 1 << 62, root: -1}.marshal(hb[:])
	f.Add(hb[:])
	f.Add([]byte{})
	key := worldKey("fuzz-secret-0123456789", [16]byte{1})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		if h, challenge, err := readHello(r); err == nil {
			if len(h.group) > maxGroupKey || len(challenge) != authNonceSize {
				t.Fatalf("hello with a group key of %d bytes and a challenge of %d", len(h.group), len(challenge))
			}
			var again bytes.Buffer
			if err := writeHello(&again, h, challenge); err != nil {
				t.Fatal(err)
			}
			used := len(data) - r.Len()
			// kind, from and idx are re-encoded from ints: compare the
			// bytes they came from.
			if !bytes.Equal(again.Bytes(), data[:used]) {
				t.Fatalf("hello %+v re-encodes to %x, read from %x", h, again.Bytes(), data[:used])
			}
		}
		r = bytes.NewReader(data)
		if typ, payload, err := readMsg(r); err == nil {
			if len(payload) > maxMsg {
				t.Fatalf("control message of %d bytes", len(payload))
			}
			var again bytes.Buffer
			if err := writeMsg(&again, typ, payload); err != nil {
				t.Fatal(err)
			}
			if used := len(data) - r.Len(); !bytes.Equal(again.Bytes(), data[:used]) {
				t.Fatalf("message re-encodes to %x, read from %x", again.Bytes(), data[:used])
			}
		}
		if h, err := unmarshalHeader(data); err == nil {
			var b [hdrSize]byte
			h.marshal(b[:])
			if back, err := unmarshalHeader(b[:]); err != nil || back != h {
				t.Fatalf("header %v reads back as %v, %v", h, back, err)
			}
		}
		if _, err := authAccept(fuzzConn{bytes.NewReader(data)}, key, [16]byte{1}, 0, 4); err == nil {
			t.Fatalf("a stranger's bytes %x were admitted", data)
		}
	})
}
