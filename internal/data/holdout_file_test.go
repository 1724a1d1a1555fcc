package data

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/testenv"
)

// singleFile writes a text file of n numbered lines (every line unique)
// and returns its path and contents.
func singleFile(t *testing.T, n int) (string, string) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "line %06d of the only file\n", i)
	}
	p := filepath.Join(t.TempDir(), "input.txt")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b.String()
}

// piece is one document of a split, with its byte offset in the file.
type piece struct {
	off  int64
	text string
}

// readSplit returns every document of a split of cfg's dataset.
func readSplit(t *testing.T, cfg Config, validation bool) []piece {
	t.Helper()
	cfg.Validation = validation
	src, err := OpenSource(cfg)
	if err != nil {
		t.Fatalf("OpenSource (validation %v): %v", validation, err)
	}
	defer src.Close()
	var out []piece
	for i := range src.NumShards() {
		r, err := src.OpenShard(i, 0)
		if err != nil {
			t.Fatal(err)
		}
		d, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
		var off int64
		if _, at, ok := strings.Cut(d.Origin, "@"); ok {
			if off, err = strconv.ParseInt(at, 10, 64); err != nil {
				t.Fatalf("origin %q: %v", d.Origin, err)
			}
		}
		out = append(out, piece{off, d.Text})
	}
	return out
}

// TestHoldOutSingleFile: a one-file text corpus smaller than
// HoldOut documents is cut into pieces; the validation split is every
// HoldOut-th piece, disjoint from the training split, and the two cover
// the file exactly.
func TestHoldOutSingleFile(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lines      int
		every      int
		docBytes   int
		wantPieces int // at least
	}{
		{"one document, every 50", 4000, 50, 0, 50},
		{"two documents, every 50", 4000, 50, 64 << 10, 50},
		{"one document, every 4", 300, 4, 0, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, body := singleFile(t, tc.lines)
			cfg := Config{Kind: KindText, Path: path, HoldOut: tc.every, DocBytes: tc.docBytes}
			train, val := readSplit(t, cfg, false), readSplit(t, cfg, true)
			if len(val) == 0 || len(train) == 0 {
				t.Fatalf("%d training and %d validation pieces", len(train), len(val))
			}
			if n := len(train) + len(val); n < tc.wantPieces {
				t.Errorf("%d pieces, want at least %d", n, tc.wantPieces)
			}
			all := append(append([]piece{}, train...), val...)
			sort.Slice(all, func(i, j int) bool { return all[i].off < all[j].off })
			var joined strings.Builder
			for i, p := range all {
				if i > 0 && p.off == all[i-1].off {
					t.Fatalf("two pieces start at byte %d: the splits overlap", p.off)
				}
				if int64(joined.Len()) != p.off {
					t.Fatalf("piece at byte %d follows %d bytes: the splits leave a gap or overlap", p.off, joined.Len())
				}
				joined.WriteString(p.text)
			}
			if joined.String() != body {
				t.Fatalf("the splits together hold %d bytes, the file %d", joined.Len(), len(body))
			}
			// The held-out share is about 1/every of the file.
			var held int
			for _, p := range val {
				held += len(p.text)
			}
			if share := float64(held) / float64(len(body)); share < 0.5/float64(tc.every) || share > 2/float64(tc.every) {
				t.Errorf("validation holds %.2f%% of the file, want about %.2f%%", 100*share, 100/float64(tc.every))
			}
		})
	}
}

// TestHoldOutSingleFileBatches: the training loader of a one-file corpus
// never yields a line of the validation split, over more than one epoch,
// and the validation loader yields only validation lines.
func TestHoldOutSingleFileBatches(t *testing.T) {
	path, _ := singleFile(t, 3000)
	cfg := Config{Kind: KindText, Path: path, HoldOut: 50, SeqLen: 64, BatchSize: 4, Seed: 3}
	held := map[string]bool{}
	for _, p := range readSplit(t, cfg, true) {
		for _, l := range strings.SplitAfter(p.text, "\n") {
			if l != "" {
				held[l] = true
			}
		}
	}
	lines := func(l *Loader, batches int) []string {
		var b strings.Builder
		for _, id := range windows(t, take(t, l, batches)) {
			if id < 256 {
				b.WriteByte(byte(id))
			}
		}
		ls := strings.SplitAfter(b.String(), "\n")
		return ls[1 : len(ls)-1] // whole lines only
	}
	// 3000 lines of 28 bytes is about 330 batches of 4×65 tokens.
	tr := open(t, cfg, byteEnc{})
	seen := 0
	for _, l := range lines(tr, 400) {
		if held[l] {
			t.Fatalf("a training batch holds validation line %q", l)
		}
		seen++
	}
	if seen < 3000 {
		t.Errorf("only %d training lines read", seen)
	}
	vcfg := cfg
	vcfg.Validation = true
	va := open(t, vcfg, byteEnc{})
	for _, l := range lines(va, 10) {
		if !held[l] {
			t.Fatalf("a validation batch holds training line %q", l)
		}
	}
}

// TestHoldOutShakespeare: tinyshakespeare, one file, opened as the trainer
// opens a held-out validation split (every 50th shard), has a non-empty
// validation split and a training split that together cover the file.
func TestHoldOutShakespeare(t *testing.T) {
	path := testenv.SharedData(t, "tinyshakespeare", "input.txt")
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Kind: KindText, Path: path, HoldOut: 50}
	train, val := readSplit(t, cfg, false), readSplit(t, cfg, true)
	var nt, nv int
	for _, p := range train {
		nt += len(p.text)
	}
	for _, p := range val {
		nv += len(p.text)
	}
	if nv == 0 || nt+nv != len(body) {
		t.Fatalf("training %d + validation %d bytes, the file %d", nt, nv, len(body))
	}
	vcfg := cfg
	vcfg.SeqLen, vcfg.BatchSize, vcfg.Validation = 256, 8, true
	take(t, open(t, vcfg, byteEnc{}), 10) // validation.steps batches, as Trainer.Validate reads
}
