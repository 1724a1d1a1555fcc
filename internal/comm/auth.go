package comm

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Data-plane authentication. Every TCP connection between two ranks of a
// world (control, collective data and point-to-point) starts with a mutual
// challenge-response before anything else crosses it:
//
//	dialer   → acceptor: hello (world id, group, ranks, purpose), nonce nD
//	acceptor → dialer:   nonce nA, MAC("acceptor", transcript)
//	dialer   → acceptor: MAC("dialer", transcript)
//	acceptor → dialer:   admitted (one byte)
//
// MAC is HMAC-SHA256 under the world key, transcript binds the world id,
// both ranks, the group, the connection's purpose and both nonces, and the
// world key is HMAC-SHA256(Options.Secret, label || world id). The world id
// is a fresh random value of every NewWorld (every rendezvous), so a process
// holding the job secret but the key of an earlier world (a stale member of
// an earlier rendezvous) fails as a stranger does. The dialer checks the
// acceptor's proof before it proves anything itself, and each side checks
// with hmac.Equal. A stranger learns nothing but a MAC over a nonce it did
// not choose alone; the legitimate side gets an error naming the peer.
//
// The handshake authenticates the ends; it neither encrypts nor
// authenticates the bytes that follow, so a party that can intercept and
// rewrite traffic on the path between two hosts is not kept out.

const (
	authNonceSize = 32
	authMACSize   = sha256.Size
	authAdmitted  = 0xA5
	// authTimeout bounds the whole handshake on the accepting side.
	authTimeout = 30 * time.Second
)

// ErrAuth is matched (errors.Is) by the errors of connections that failed
// the data-plane authentication: a peer that does not hold the job secret
// of this world (a wrong secret, or a stale one from an earlier
// rendezvous).
var ErrAuth = errors.New("comm: data-plane authentication failed")

// worldKey derives the key that authenticates the connections of the world
// with id nonce from the job secret.
func worldKey(secret string, nonce [16]byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("titan comm world key v1\x00"))
	m.Write(nonce[:])
	return m.Sum(nil)
}

// authMAC is the proof of one side ("dialer" or "acceptor") of connection
// hl, dialed by hl.from to rank to, with nonces nD (dialer) and nA
// (acceptor).
func authMAC(key []byte, role string, hl hello, to int, nD, nA []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("titan comm auth v1\x00"))
	m.Write([]byte(role))
	m.Write([]byte{0})
	var b [20]byte
	binary.LittleEndian.PutUint32(b[0:], uint32(hl.from))
	binary.LittleEndian.PutUint32(b[4:], uint32(to))
	binary.LittleEndian.PutUint32(b[8:], uint32(hl.kind))
	binary.LittleEndian.PutUint32(b[12:], uint32(hl.idx))
	binary.LittleEndian.PutUint32(b[16:], uint32(len(hl.group)))
	m.Write(hl.nonce[:])
	m.Write(b[:])
	m.Write([]byte(hl.group))
	m.Write(nD)
	m.Write(nA)
	return m.Sum(nil)
}

// authDial runs the dialer's side of the handshake on c, which was dialed
// to world rank to: it sends the hello and a challenge, checks the
// acceptor's proof, proves itself and waits to be admitted. c's deadline
// must already be set.
func authDial(c io.ReadWriter, key []byte, hl hello, to int) error {
	nD := make([]byte, authNonceSize)
	rand.Read(nD)
	if err := writeHello(c, hl, nD); err != nil {
		return err
	}
	var resp [authNonceSize + authMACSize]byte
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			// The acceptor closes on a hello of another world.
			return fmt.Errorf("%w: the peer closed the connection instead of answering the challenge (it belongs to another world or job)", ErrAuth)
		}
		return err
	}
	nA, proof := resp[:authNonceSize], resp[authNonceSize:]
	if !hmac.Equal(proof, authMAC(key, "acceptor", hl, to, nD, nA)) {
		return fmt.Errorf("%w: the peer did not prove that it holds this world's job secret (a wrong secret, or a stale one from an earlier rendezvous)", ErrAuth)
	}
	if _, err := c.Write(authMAC(key, "dialer", hl, to, nD, nA)); err != nil {
		return err
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil || ack[0] != authAdmitted {
		return fmt.Errorf("%w: the peer refused this rank's proof of the job secret", ErrAuth)
	}
	return nil
}

// authAccept runs the acceptor's side of the handshake on c for this
// world (id nonce, this process being world rank me of size): it reads the
// hello and challenge, proves itself, checks the dialer's proof and admits
// it. A hello of another world, or a wrong proof, is an error wrapping
// ErrAuth (the caller closes c without a word).
func authAccept(c io.ReadWriter, key []byte, nonce [16]byte, me, size int) (hello, error) {
	hl, nD, err := readHello(c)
	if err != nil {
		return hl, err
	}
	if hl.nonce != nonce || hl.from < 0 || hl.from >= size || hl.from == me {
		return hl, fmt.Errorf("%w: a hello for another world or rank", ErrAuth)
	}
	nA := make([]byte, authNonceSize)
	rand.Read(nA)
	if _, err := c.Write(append(nA, authMAC(key, "acceptor", hl, me, nD, nA)...)); err != nil {
		return hl, err
	}
	var proof [authMACSize]byte
	if _, err := io.ReadFull(c, proof[:]); err != nil {
		return hl, fmt.Errorf("%w: claiming to be rank %d, the peer gave no proof of the job secret: %v", ErrAuth, hl.from, err)
	}
	if !hmac.Equal(proof[:], authMAC(key, "dialer", hl, me, nD, nA)) {
		return hl, fmt.Errorf("%w: claiming to be rank %d, the peer does not hold this world's job secret (a wrong secret, or a stale one from an earlier rendezvous)", ErrAuth, hl.from)
	}
	if _, err := c.Write([]byte{authAdmitted}); err != nil {
		return hl, err
	}
	return hl, nil
}

// refusals counts the connections a hub refused, for the error of a
// connection that then never arrives.
type refusals struct {
	mu   sync.Mutex
	n    int
	last string // remote address and reason of the latest
}

func (r *refusals) add(remote net.Addr, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	r.last = fmt.Sprintf("from %v: %v", remote, err)
}

// note returns "" or a sentence on the refused connections, to append to
// an error.
func (r *refusals) note() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		return ""
	}
	return fmt.Sprintf("; this rank refused %d connection(s) that failed the data-plane authentication (latest %s)", r.n, r.last)
}
