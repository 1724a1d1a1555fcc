package data

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// byteEnc is a test Encoder: byte b is id b, BOS is 256 and EOS 257.
type byteEnc struct{}

func (byteEnc) Encode(text string) []int {
	ids := make([]int, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int(text[i])
	}
	return ids
}
func (byteEnc) BOS() int { return 256 }
func (byteEnc) EOS() int { return 257 }

const (
	tBOS = 256
	tEOS = 257
)

// wrapped returns the reference token stream of docs: [BOS] bytes [EOS] each.
func wrapped(docs ...string) []int32 {
	var out []int32
	for _, d := range docs {
		if d == "" {
			continue
		}
		out = append(out, tBOS)
		for i := 0; i < len(d); i++ {
			out = append(out, int32(d[i]))
		}
		out = append(out, tEOS)
	}
	return out
}

// writeTree creates files (slash-separated relative names) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// open opens a loader or fails the test; it is closed at cleanup.
func open(t *testing.T, cfg Config, enc Encoder) *Loader {
	t.Helper()
	l, err := Open(cfg, enc)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// take returns the next k batches of l.
func take(t *testing.T, l *Loader, k int) []Batch {
	t.Helper()
	out := make([]Batch, k)
	for i := range out {
		b, err := l.Next()
		if err != nil {
			t.Fatalf("Next (batch %d): %v", i, err)
		}
		out[i] = b
	}
	return out
}

// windows rebuilds the consumed token stream from batches: each row's
// inputs plus its last label form one window of T+1 tokens. It also checks
// that every label is the next input of its row.
func windows(t *testing.T, bs []Batch) []int32 {
	t.Helper()
	var out []int32
	for _, b := range bs {
		if len(b.Inputs) != b.B*b.T || len(b.Labels) != b.B*b.T {
			t.Fatalf("batch sizes %d/%d, want %d×%d", len(b.Inputs), len(b.Labels), b.B, b.T)
		}
		for r := range b.B {
			in := b.Inputs[r*b.T : (r+1)*b.T]
			lab := b.Labels[r*b.T : (r+1)*b.T]
			if !slices.Equal(in[1:], lab[:b.T-1]) {
				t.Fatalf("row %d: labels are not the inputs shifted by one", r)
			}
			out = append(out, in...)
			out = append(out, lab[b.T-1])
		}
	}
	return out
}

func batchesEqual(a, b []Batch) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].B != b[i].B || a[i].T != b[i].T ||
			!slices.Equal(a[i].Inputs, b[i].Inputs) || !slices.Equal(a[i].Labels, b[i].Labels) {
			return false
		}
	}
	return true
}

// splitDocs cuts a wrapped stream back into documents (text between BOS and
// EOS); a partial document at either end is dropped.
func splitDocs(s []int32) []string {
	var docs []string
	start := -1
	for i, v := range s {
		switch v {
		case tBOS:
			start = i + 1
		case tEOS:
			if start >= 0 {
				b := make([]byte, 0, i-start)
				for _, c := range s[start:i] {
					b = append(b, byte(c))
				}
				docs = append(docs, string(b))
			}
			start = -1
		}
	}
	return docs
}
