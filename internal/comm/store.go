package comm

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Store is the key-value store ranks use to find each other. Get blocks
// until the key exists or ctx ends. *control.Client satisfies it; tests use
// MemStore (one process) or FileStore (several processes on one host).
type Store interface {
	Set(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
}

// FileStore is a Store kept as one file per key in a directory shared by
// all ranks, for tests and single-host tools. Set writes a temporary file
// and renames it into place, so a reader sees a value whole or not at all.
type FileStore struct {
	dir string
}

// NewFileStore returns a FileStore over dir, creating dir if needed.
func NewFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("comm: file store %s: %w", dir, err)
	}
	return &FileStore{dir: dir}, nil
}

// Dir returns the directory of s.
func (s *FileStore) Dir() string { return s.dir }

func (s *FileStore) path(key string) string {
	return filepath.Join(s.dir, "k-"+hex.EncodeToString([]byte(key)))
}

// Set stores value under key, replacing any earlier value.
func (s *FileStore) Set(ctx context.Context, key string, value []byte) error {
	f, err := os.CreateTemp(s.dir, "tmp-*")
	if err != nil {
		return fmt.Errorf("comm: file store set %q: %w", key, err)
	}
	_, err = f.Write(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), s.path(key))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("comm: file store set %q: %w", key, err)
	}
	return nil
}

// Get returns the value of key, polling until it exists or ctx ends.
func (s *FileStore) Get(ctx context.Context, key string) ([]byte, error) {
	p := s.path(key)
	wait := time.Millisecond
	for {
		b, err := os.ReadFile(p)
		if err == nil {
			return b, nil
		}
		if !os.IsNotExist(err) {
			return nil, fmt.Errorf("comm: file store get %q: %w", key, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("comm: file store get %q: %w", key, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// MemStore is an in-process Store, for ranks that run as goroutines of one
// process (tests).
type MemStore struct {
	mu   sync.Mutex
	m    map[string][]byte
	wake chan struct{}
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	return &MemStore{m: make(map[string][]byte), wake: make(chan struct{})}
}

// Set stores a copy of value under key.
func (s *MemStore) Set(ctx context.Context, key string, value []byte) error {
	s.mu.Lock()
	s.m[key] = append([]byte(nil), value...)
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// Get returns the value of key, waiting until it exists or ctx ends.
func (s *MemStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		s.mu.Lock()
		v, ok := s.m[key]
		wake := s.wake
		s.mu.Unlock()
		if ok {
			return append([]byte(nil), v...), nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("comm: mem store get %q: %w", key, ctx.Err())
		case <-wake:
		}
	}
}
