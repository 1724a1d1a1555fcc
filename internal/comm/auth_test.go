package comm

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAuthHandshake runs both sides of the data-plane handshake over a pipe
// for matching and mismatching keys and worlds.
func TestAuthHandshake(t *testing.T) {
	world := [16]byte{1, 2, 3}
	other := [16]byte{9}
	good := worldKey("s3cret-s3cret-s3cret", world)
	tests := []struct {
		name       string
		dialKey    []byte
		dialWorld  [16]byte
		from       int
		dialerErr  string // "" must succeed
		acceptErr  string
		acceptFrom int
	}{
		{"same secret", good, world, 1, "", "", 1},
		{"wrong secret", worldKey("guess", world), world, 1, "did not prove", "gave no proof", 1},
		{"no secret", worldKey("", world), world, 1, "did not prove", "gave no proof", 1},
		{"stale key of an earlier world", worldKey("s3cret-s3cret-s3cret", other), world, 1, "did not prove", "gave no proof", 1},
		{"stale world id", worldKey("s3cret-s3cret-s3cret", other), other, 1, "closed the connection", "another world", 1},
		{"claims the acceptor's rank", good, world, 0, "closed the connection", "another world", 0},
		{"rank outside the world", good, world, 7, "closed the connection", "another world", 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, d := net.Pipe()
			defer d.Close()
			a.SetDeadline(time.Now().Add(5 * time.Second))
			d.SetDeadline(time.Now().Add(5 * time.Second))
			acc := make(chan error, 1)
			go func() {
				_, err := authAccept(a, good, world, 0, 4)
				if err != nil {
					a.Close()
				}
				acc <- err
			}()
			derr := authDial(d, tc.dialKey, hello{nonce: tc.dialWorld, group: "g/world", from: tc.from, kind: connData}, 0)
			if derr != nil {
				d.Close() // as hub.dial does
			}
			aerr := <-acc
			a.Close()
			for _, c := range []struct {
				side string
				err  error
				want string
			}{{"dialer", derr, tc.dialerErr}, {"acceptor", aerr, tc.acceptErr}} {
				switch {
				case c.want == "" && c.err != nil:
					t.Errorf("%s: %v", c.side, c.err)
				case c.want != "" && (!errors.Is(c.err, ErrAuth) || !strings.Contains(c.err.Error(), c.want)):
					t.Errorf("%s: %v, want an ErrAuth containing %q", c.side, c.err, c.want)
				}
			}
		})
	}
}

// TestAuthStrangerLearnsNothing checks what a stranger that ignores the
// acceptor's proof and answers with garbage receives: the acceptor's nonce
// and proof, then the end of the connection, no admission.
func TestAuthStrangerLearnsNothing(t *testing.T) {
	world := [16]byte{7}
	key := worldKey("a-long-job-secret", world)
	a, d := net.Pipe()
	defer d.Close()
	d.SetDeadline(time.Now().Add(5 * time.Second))
	go func() {
		if _, err := authAccept(a, key, world, 0, 2); err != nil {
			a.Close()
		}
	}()
	if err := writeHello(d, hello{nonce: world, group: "g", from: 1, kind: connCtrl}, make([]byte, authNonceSize)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, authNonceSize+authMACSize)
	if _, err := io.ReadFull(d, got); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Write(make([]byte, authMACSize)); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(d)
	if len(rest) != 0 || (err != nil && !errors.Is(err, io.ErrClosedPipe)) {
		t.Fatalf("after a wrong proof the stranger read %x, %v; want the connection closed", rest, err)
	}
}

// TestWorldSecretMismatch: two ranks with different secrets cannot form a
// world; the dialer names the data-plane authentication, the acceptor's
// timeout counts the refused connection.
func TestWorldSecretMismatch(t *testing.T) {
	st := NewMemStore()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := Options{Transport: "tcp", InitTimeout: 2 * time.Second, Secret: fmt.Sprintf("secret-of-rank-%d-xxxxxxxx", r)}
			g, err := NewWorld(context.Background(), st, r, 2, opts)
			if err == nil {
				g.Close()
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	if err := errs[1]; !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "connecting with rank 0") {
		t.Errorf("rank 1 (dialer): %v, want an ErrAuth naming rank 0", err)
	}
	if err := errs[0]; err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "data-plane authentication") {
		t.Errorf("rank 0 (acceptor): %v, want an error counting the refused connections", err)
	}
}

// scenarioAuth: ranks 0 and 1 form a world over TCP with the secret of
// COMMTEST_SECRET, closing an earlier world first; rank 2 is a stranger
// that knows their addresses and world ids but not the key of the current
// world, and tries to connect to rank 0 as rank 1. The members then check
// that the world still works and rank 0 that it refused every attempt.
func scenarioAuth(ctx context.Context, e childEnv) error {
	secret := "job-secret-0123456789abcdef"
	if e.rank == 2 {
		return stranger(ctx, e.store, secret)
	}
	opts := Options{Transport: "tcp", Timeout: 30 * time.Second, InitTimeout: 30 * time.Second, Secret: secret}
	opts.StorePrefix = "old"
	old, err := NewWorld(ctx, e.store, e.rank, 2, opts)
	if err != nil {
		return err
	}
	if err := old.Barrier(ctx); err != nil {
		return err
	}
	old.Close()
	opts.StorePrefix = "new"
	g, err := NewWorld(ctx, e.store, e.rank, 2, opts)
	if err != nil {
		return err
	}
	defer g.Close()
	if _, err := e.store.Get(ctx, "stranger/done"); err != nil {
		return err
	}
	x := []float32{float32(e.rank + 1)}
	if err := g.AllReduce(ctx, F32(x), Sum); err != nil {
		return err
	}
	if x[0] != 3 {
		return fmt.Errorf("allreduce after the stranger: %v, want 3", x[0])
	}
	if e.rank == 0 {
		h := g.(*group).hub
		h.refused.mu.Lock()
		n := h.refused.n
		h.refused.mu.Unlock()
		if n != 4 {
			return fmt.Errorf("rank 0 refused %d connections, want the stranger's 4 (%s)", n, h.refused.note())
		}
		fmt.Printf("OK refused %d\n", n)
	}
	return nil
}

func stranger(ctx context.Context, st Store, secret string) error {
	nonce := func(prefix string) ([16]byte, error) {
		var n [16]byte
		v, err := st.Get(ctx, prefix+"/nonce")
		if err == nil {
			_, err = hex.Decode(n[:], v)
		}
		return n, err
	}
	oldID, err := nonce("old")
	if err != nil {
		return err
	}
	newID, err := nonce("new")
	if err != nil {
		return err
	}
	v, err := st.Get(ctx, "new/rank/0")
	if err != nil {
		return err
	}
	var info rankInfo
	if err := json.Unmarshal(v, &info); err != nil {
		return err
	}
	attempts := []struct {
		name string
		key  []byte
		id   [16]byte
		want string
	}{
		{"wrong secret", worldKey("not-the-secret", newID), newID, "did not prove"},
		{"stale key of the earlier world", worldKey(secret, oldID), newID, "did not prove"},
		{"stale world id", worldKey(secret, oldID), oldID, "closed the connection"},
	}
	for _, a := range attempts {
		c, err := net.DialTimeout("tcp", info.Addr, 5*time.Second)
		if err != nil {
			return err
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		err = authDial(c, a.key, hello{nonce: a.id, group: "new/world", from: 1, kind: connData}, 0)
		c.Close()
		if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), a.want) {
			return fmt.Errorf("stranger with a %s: %v, want an ErrAuth containing %q", a.name, err, a.want)
		}
		fmt.Printf("OK %s: %v\n", a.name, err)
	}
	// A stranger that skips the check of the acceptor's proof and sends a
	// guess gets the end of the connection, no admission.
	c, err := net.DialTimeout("tcp", info.Addr, 5*time.Second)
	if err != nil {
		return err
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := writeHello(c, hello{nonce: newID, group: "new/world", from: 1, kind: connP2P}, make([]byte, authNonceSize)); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, make([]byte, authNonceSize+authMACSize)); err != nil {
		return err
	}
	c.Write(make([]byte, authMACSize))
	if rest, _ := io.ReadAll(c); len(rest) != 0 {
		return fmt.Errorf("a stranger's guessed proof was answered with %x", rest)
	}
	c.Close()
	return st.Set(ctx, "stranger/done", []byte("1"))
}

// TestMultiProcessStranger: a process without the current world's key is
// refused by a world of two processes over TCP, which keeps working.
func TestMultiProcessStranger(t *testing.T) {
	_, res := spawn(t, "auth", 3, "tcp")
	requireOK(t, res)
	for _, r := range res {
		t.Logf("rank %d:\n%s", r.rank, r.out)
	}
	if !strings.Contains(res[0].out, "OK refused 4") {
		t.Errorf("rank 0 output:\n%s", res[0].out)
	}
	for _, want := range []string{"OK wrong secret", "OK stale key", "OK stale world id"} {
		if !strings.Contains(res[2].out, want) {
			t.Errorf("stranger output lacks %q:\n%s", want, res[2].out)
		}
	}
}

func init() { scenarios["auth"] = scenarioAuth }
