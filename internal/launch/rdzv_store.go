package launch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
)

// rdzvStore is what the elastic rendezvous needs from its backend: keys
// that may be bound to leases (and vanish when the lease expires), atomic
// create and compare-and-swap, listing by prefix with a revision, and
// waiting for a change after a revision. memStore (in-process, and served
// by the c10d backend) and etcdStore implement it; the rendezvous
// algorithm (rendezvous.go) is one for both.
type rdzvStore interface {
	// Grant returns a new lease that expires ttl after its last keep-alive.
	Grant(ctx context.Context, ttl time.Duration) (int64, error)
	// KeepAlive renews a lease; it fails with errLeaseGone once it expired.
	KeepAlive(ctx context.Context, lease int64) error
	// Revoke ends a lease now, deleting its keys.
	Revoke(ctx context.Context, lease int64) error
	// Create sets key to value, bound to lease (0: none), unless key
	// exists; it reports whether it did.
	Create(ctx context.Context, key, value string, lease int64) (bool, error)
	// Swap sets key to value (no lease) if its value is old ("" meaning
	// absent); it reports whether it did.
	Swap(ctx context.Context, key, old, value string) (bool, error)
	// List returns the keys under prefix with their values, and the
	// store's revision.
	List(ctx context.Context, prefix string) (map[string]string, int64, error)
	// Wait returns when something under prefix changed after revision rev,
	// or with ctx's error.
	Wait(ctx context.Context, prefix string, rev int64) error
	// Close releases the client (not the leases).
	Close() error
}

// errLeaseGone: the lease expired or was revoked.
var errLeaseGone = errors.New("rendezvous lease expired")

// memStore is an rdzvStore in memory: the backend of a one-node elastic
// job, and the state the c10d backend's server holds.
type memStore struct {
	mu      sync.Mutex
	rev     int64
	kvs     map[string]memValue
	leases  map[int64]*memLease
	next    int64
	changed chan struct{} // closed and replaced on every change
	stop    chan struct{}
	once    sync.Once
}

type memValue struct {
	value string
	lease int64
}

type memLease struct {
	ttl     time.Duration
	expires time.Time
}

func newMemStore() *memStore {
	s := &memStore{kvs: map[string]memValue{}, leases: map[int64]*memLease{}, changed: make(chan struct{}), stop: make(chan struct{})}
	go s.expire()
	return s
}

// expire deletes the keys of expired leases.
func (s *memStore) expire() {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.mu.Lock()
			for id, l := range s.leases {
				if now.After(l.expires) {
					s.revokeLocked(id)
				}
			}
			s.mu.Unlock()
		}
	}
}

// bumpLocked records a change.
func (s *memStore) bumpLocked() {
	s.rev++
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *memStore) revokeLocked(id int64) {
	if _, ok := s.leases[id]; !ok {
		return
	}
	delete(s.leases, id)
	for k, v := range s.kvs {
		if v.lease == id {
			delete(s.kvs, k)
		}
	}
	s.bumpLocked()
}

func (s *memStore) Grant(_ context.Context, ttl time.Duration) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.leases[s.next] = &memLease{ttl: ttl, expires: time.Now().Add(ttl)}
	return s.next, nil
}

func (s *memStore) KeepAlive(_ context.Context, id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.leases[id]
	if !ok {
		return errLeaseGone
	}
	l.expires = time.Now().Add(l.ttl)
	return nil
}

func (s *memStore) Revoke(_ context.Context, id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revokeLocked(id)
	return nil
}

func (s *memStore) Create(_ context.Context, key, value string, lease int64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.kvs[key]; ok {
		return false, nil
	}
	if _, ok := s.leases[lease]; lease != 0 && !ok {
		return false, errLeaseGone
	}
	s.kvs[key] = memValue{value, lease}
	s.bumpLocked()
	return true, nil
}

func (s *memStore) Swap(_ context.Context, key, old, value string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kvs[key].value != old {
		return false, nil
	}
	s.kvs[key] = memValue{value: value}
	s.bumpLocked()
	return true, nil
}

func (s *memStore) List(_ context.Context, prefix string) (map[string]string, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.kvs {
		if strings.HasPrefix(k, prefix) {
			out[k] = v.value
		}
	}
	return out, s.rev, nil
}

func (s *memStore) Wait(ctx context.Context, _ string, rev int64) error {
	for {
		s.mu.Lock()
		now, ch := s.rev, s.changed
		s.mu.Unlock()
		if now > rev {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return errors.New("rendezvous store closed")
		}
	}
}

// Close stops the lease expiry; the store must not be used afterwards.
func (s *memStore) Close() error {
	s.once.Do(func() { close(s.stop) })
	return nil
}
