package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/testenv"
)

// corpus is a small text folder: nested, with files that must be filtered.
var corpus = map[string]string{
	"b.txt":            "second file\nwith two lines\n",
	"a.txt":            "first",
	"sub/c.md":         "# third\n\nmarkdown body",
	"sub/deeper/d.txt": "fourth, a little longer than the others to vary lengths........\n",
	"sub/e.txt":        "",             // empty: skipped
	"skip.bin":         "not selected", // wrong extension
	".hidden.txt":      "hidden",       // hidden: skipped
	".git/x.txt":       "hidden folder",
	"z.text":           "last one",
}

// corpusDocs are the corpus documents in natural (lexical path) order.
var corpusDocs = []string{
	corpus["a.txt"], corpus["b.txt"], corpus["sub/c.md"], corpus["sub/deeper/d.txt"], corpus["z.text"],
}

func TestPackingExact(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, corpus)
	epoch := wrapped(corpusDocs...)
	for _, tc := range []struct{ T, B, steps int }{
		{1, 1, 50}, {7, 3, 20}, {16, 2, 30}, {64, 4, 10}, {len(epoch) - 1, 1, 5}, {3 * len(epoch), 2, 3},
	} {
		t.Run(fmt.Sprintf("T%d_B%d", tc.T, tc.B), func(t *testing.T) {
			l := open(t, Config{Path: dir, SeqLen: tc.T, BatchSize: tc.B, NoShuffle: true}, byteEnc{})
			got := windows(t, take(t, l, tc.steps))
			if len(got) != tc.steps*tc.B*(tc.T+1) {
				t.Fatalf("consumed %d tokens, want %d windows of %d", len(got), tc.steps*tc.B, tc.T+1)
			}
			var want []int32
			for len(want) < len(got) {
				want = append(want, epoch...)
			}
			if !slices.Equal(got, want[:len(got)]) {
				t.Fatalf("packed stream differs from the reference [BOS] doc [EOS] stream")
			}
			if wantEpoch := (len(got) - 1) / len(epoch); l.Epoch() < wantEpoch {
				t.Errorf("Epoch() = %d after %d tokens of a %d-token epoch", l.Epoch(), len(got), len(epoch))
			}
		})
	}
}

func TestEpochWrap(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"one.txt": "abc", "two.txt": "defg"})
	l := open(t, Config{Path: dir, SeqLen: 4, BatchSize: 1, Seed: 9}, byteEnc{})
	docsPerEpoch := 2
	var got []int32
	for step := range 40 {
		b, err := l.Next()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, windows(t, []Batch{b})...)
		_ = step
	}
	// Every epoch holds both documents once, in some order.
	docs := splitDocs(got)
	for e := 0; (e+1)*docsPerEpoch <= len(docs); e++ {
		ep := slices.Clone(docs[e*docsPerEpoch : (e+1)*docsPerEpoch])
		sort.Strings(ep)
		if !slices.Equal(ep, []string{"abc", "defg"}) {
			t.Fatalf("epoch %d holds %q", e, ep)
		}
	}
	// 40 windows of 5 tokens = 200 tokens; an epoch is 11 tokens.
	if e := l.Epoch(); e < 200/11-1 || e > 200/11+1 {
		t.Errorf("Epoch() = %d, want about %d", e, 200/11)
	}
	if l.Documents() < 36 || l.Steps() != 40 {
		t.Errorf("Documents() = %d, Steps() = %d", l.Documents(), l.Steps())
	}
}

func TestShuffle(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{}
	var docs []string
	for i := range 40 {
		body := fmt.Sprintf("document number %d %s", i, strings.Repeat("x", i%7))
		files[fmt.Sprintf("f%02d.txt", i)] = body
		docs = append(docs, body)
	}
	writeTree(t, dir, files)
	perEpoch := len(wrapped(docs...))
	stream := func(seed uint64) []int32 {
		l := open(t, Config{Path: dir, SeqLen: 31, BatchSize: 4, Seed: seed}, byteEnc{})
		n := (3*perEpoch)/(4*32) + 1
		return windows(t, take(t, l, n))
	}
	s1, s1again, s2 := stream(1), stream(1), stream(2)
	if !slices.Equal(s1, s1again) {
		t.Fatal("same seed gave different streams")
	}
	if slices.Equal(s1, s2) {
		t.Fatal("different seeds gave the same stream")
	}
	// The first three epochs are each a permutation of the documents, and
	// the epochs are not all in the same order.
	for _, s := range [][]int32{s1, s2} {
		got := splitDocs(s)
		if len(got) < 3*len(docs) {
			t.Fatalf("only %d documents in the stream", len(got))
		}
		var orders [][]string
		for e := range 3 {
			ep := slices.Clone(got[e*len(docs) : (e+1)*len(docs)])
			orders = append(orders, slices.Clone(ep))
			sort.Strings(ep)
			want := slices.Clone(docs)
			sort.Strings(want)
			if !slices.Equal(ep, want) {
				t.Fatalf("epoch %d is not a permutation of the documents", e)
			}
		}
		if slices.Equal(orders[0], orders[1]) && slices.Equal(orders[1], orders[2]) {
			t.Error("all epochs have the same order")
		}
		if slices.Equal(orders[0], docs) {
			t.Error("epoch 0 is in natural order despite shuffling")
		}
	}
}

func TestShardOrder(t *testing.T) {
	for _, n := range []int{0, 1, 2, 10, 1000} {
		p := ShardOrder(7, 3, n)
		seen := make([]bool, n)
		for _, v := range p {
			if v < 0 || v >= n || seen[v] {
				t.Fatalf("ShardOrder(n=%d) is not a permutation: %v", n, p)
			}
			seen[v] = true
		}
		if !slices.Equal(p, ShardOrder(7, 3, n)) {
			t.Fatal("ShardOrder is not deterministic")
		}
	}
	// Position 0 of 10 shards should be roughly uniform over seeds.
	counts := make([]int, 10)
	for seed := range uint64(5000) {
		counts[ShardOrder(seed, 0, 10)[0]]++
	}
	for i, c := range counts {
		if c < 400 || c > 600 {
			t.Errorf("shard %d first %d times in 5000, want about 500", i, c)
		}
	}
}

func TestBatchShard(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, corpus)
	for _, B := range []int{4, 8} {
		l := open(t, Config{Path: dir, SeqLen: 5, BatchSize: B, Seed: 3}, byteEnc{})
		b := take(t, l, 3)[2]
		for _, n := range []int{1, 2, 4} {
			var in, lab []int32
			for r := range n {
				s, err := b.Shard(r, n)
				if err != nil {
					t.Fatal(err)
				}
				if s.B != B/n || s.T != b.T {
					t.Fatalf("Shard(%d,%d) is %d×%d", r, n, s.B, s.T)
				}
				in = append(in, s.Inputs...)
				lab = append(lab, s.Labels...)
			}
			if !slices.Equal(in, b.Inputs) || !slices.Equal(lab, b.Labels) {
				t.Errorf("B=%d n=%d: the shards do not concatenate to the global batch", B, n)
			}
		}
		for _, bad := range [][2]int{{0, 3}, {-1, 2}, {2, 2}, {0, 0}} {
			if _, err := b.Shard(bad[0], bad[1]); err == nil {
				t.Errorf("Shard(%d, %d) of B=%d: no error", bad[0], bad[1], B)
			}
		}
	}
	// A run on 4 workers sees the tokens of the run on 1 worker: the
	// composition of the global batch does not depend on the split.
	l1 := open(t, Config{Path: dir, SeqLen: 5, BatchSize: 4, Seed: 3}, byteEnc{})
	l2 := open(t, Config{Path: dir, SeqLen: 5, BatchSize: 4, Seed: 3}, byteEnc{})
	a, b := take(t, l1, 5), take(t, l2, 5)
	for i := range a {
		s, _ := b[i].Shard(3, 4)
		if !slices.Equal(s.Inputs, a[i].Inputs[3*5:]) {
			t.Fatal("rank 3 of 4 does not see rows 3.. of the global batch")
		}
	}
}

// resumeCase is a dataset on which resuming is tested.
type resumeCase struct {
	name string
	cfg  Config
	enc  Encoder
}

func resumeCases(t *testing.T) []resumeCase {
	dir := t.TempDir()
	textDir := filepath.Join(dir, "text")
	files := map[string]string{}
	for i := range 25 {
		files[fmt.Sprintf("d%02d.txt", i)] = strings.Repeat(fmt.Sprintf("line %d of file %d\n", i, i), 1+i%9)
	}
	files["big.txt"] = strings.Repeat("a big file cut into pieces at newlines\n", 60)
	writeTree(t, textDir, files)

	var jl strings.Builder
	for i := range 300 {
		if i%17 == 0 {
			jl.WriteString("\n")
		}
		fmt.Fprintf(&jl, "{\"text\": %q, \"id\": %d}\n", strings.Repeat("w", i%13)+fmt.Sprint(i), i)
	}
	jsonl := filepath.Join(dir, "c4.jsonl")
	writeTree(t, dir, map[string]string{"c4.jsonl": jl.String()})

	toks := make([]int32, 5000)
	for i := range toks {
		toks[i] = int32((i*7919 + i/13) % 300)
	}
	tokPath := filepath.Join(dir, "train.tok")
	if err := WriteTokens(tokPath, toks, 300, 257); err != nil {
		t.Fatal(err)
	}
	return []resumeCase{
		{"text", Config{Path: textDir, SeqLen: 13, BatchSize: 4, Seed: 5, DocBytes: 256}, byteEnc{}},
		{"jsonl", Config{Path: jsonl, SeqLen: 9, BatchSize: 2, Seed: 6, BlockLines: 16}, byteEnc{}},
		{"tokens", Config{Path: tokPath, SeqLen: 17, BatchSize: 3, Seed: 7, BlockTokens: 333}, nil},
		{"text-noshuffle", Config{Path: textDir, SeqLen: 50, BatchSize: 1, NoShuffle: true}, byteEnc{}},
		{"holdout", Config{Path: jsonl, SeqLen: 9, BatchSize: 2, Seed: 6, BlockLines: 8, HoldOut: 3}, byteEnc{}},
	}
}

func TestResume(t *testing.T) {
	for _, tc := range resumeCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			const total = 60
			ref := take(t, open(t, tc.cfg, tc.enc), total)
			for _, k := range []int{0, 1, 7, 23, 59} {
				l := open(t, tc.cfg, tc.enc)
				first := take(t, l, k)
				if !batchesEqual(first, ref[:k]) {
					t.Fatalf("k=%d: first batches differ from the reference", k)
				}
				st, err := l.State()
				if err != nil {
					t.Fatal(err)
				}
				take(t, l, 3) // the saved loader moves on; the state must not
				r := open(t, tc.cfg, tc.enc)
				if err := r.Restore(st); err != nil {
					t.Fatalf("Restore: %v", err)
				}
				if r.Steps() != int64(k) {
					t.Errorf("Steps() after restore = %d, want %d", r.Steps(), k)
				}
				if rest := take(t, r, total-k); !batchesEqual(rest, ref[k:]) {
					t.Fatalf("k=%d: batches after Restore differ from the uninterrupted run", k)
				}
				// Restoring the same loader rewinds it too.
				if err := l.Restore(st); err != nil {
					t.Fatal(err)
				}
				if rest := take(t, l, 1); !batchesEqual(rest, ref[k:k+1]) {
					t.Fatalf("k=%d: Restore on the used loader does not rewind it", k)
				}
			}
			// Reset goes back to the start.
			l := open(t, tc.cfg, tc.enc)
			take(t, l, 11)
			if err := l.Reset(); err != nil {
				t.Fatal(err)
			}
			if !batchesEqual(take(t, l, 4), ref[:4]) {
				t.Fatal("Reset does not restart the stream")
			}
		})
	}
}

// TestResumeOtherBatchSize checks that a state may be restored into a
// loader with another global batch size: rows are taken from the stream in
// order.
func TestResumeOtherBatchSize(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, corpus)
	cfg := Config{Path: dir, SeqLen: 6, BatchSize: 2, Seed: 11}
	ref := windows(t, take(t, open(t, cfg, byteEnc{}), 30))
	l := open(t, cfg, byteEnc{})
	head := windows(t, take(t, l, 5))
	st, err := l.State()
	if err != nil {
		t.Fatal(err)
	}
	cfg.BatchSize = 5
	r := open(t, cfg, byteEnc{})
	if err := r.Restore(st); err != nil {
		t.Fatal(err)
	}
	tail := windows(t, take(t, r, 10))
	if got := append(head, tail...); !slices.Equal(got, ref[:len(got)]) {
		t.Fatal("the stream changed when the batch size changed at resume")
	}
}

func TestRestoreErrors(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, corpus)
	other := t.TempDir()
	writeTree(t, other, map[string]string{"x.txt": "other data"})
	cfg := Config{Path: dir, SeqLen: 8, BatchSize: 2, Seed: 1}
	l := open(t, cfg, byteEnc{})
	take(t, l, 2)
	st, err := l.State()
	if err != nil {
		t.Fatal(err)
	}
	mutate := func(f func(*Config)) Config { c := cfg; f(&c); return c }
	for _, tc := range []struct {
		name  string
		cfg   Config
		enc   Encoder
		state []byte
		want  string
	}{
		{"other dataset", mutate(func(c *Config) { c.Path = other }), byteEnc{}, st, "another dataset"},
		{"other seq_len", mutate(func(c *Config) { c.SeqLen = 9 }), byteEnc{}, st, "seq_len"},
		{"other seed", mutate(func(c *Config) { c.Seed = 2 }), byteEnc{}, st, "seed"},
		{"no shuffle", mutate(func(c *Config) { c.NoShuffle = true }), byteEnc{}, st, "another dataset"},
		{"other tokenizer", cfg, shiftEnc{}, st, "another dataset"},
		{"malformed", cfg, byteEnc{}, []byte("{not json"), "malformed"},
		{"bad leftover", cfg, byteEnc{}, withField(t, st, "leftover", "//8="), "bad leftover"},
		{"version", cfg, byteEnc{}, []byte(strings.Replace(string(st), `"version":1`, `"version":99`, 1)), "version 99"},
		{"bad position", cfg, byteEnc{}, []byte(strings.Replace(string(st), `"position":{"epoch":0,"shard":`, `"position":{"epoch":0,"shard":9`, 1)), "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := open(t, tc.cfg, tc.enc)
			before := take(t, open(t, tc.cfg, tc.enc), 1)
			err := r.Restore(tc.state)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Restore: error %v, want one mentioning %q", err, tc.want)
			}
			// The failed Restore left the loader at its start.
			if !batchesEqual(take(t, r, 1), before) {
				t.Fatal("a failed Restore changed the loader")
			}
		})
	}
}

// withField returns the JSON object state with one field replaced.
func withField(t *testing.T, state []byte, key string, v any) []byte {
	var m map[string]any
	if err := json.Unmarshal(state, &m); err != nil {
		t.Fatal(err)
	}
	m[key] = v
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// shiftEnc is byteEnc with ids shifted by one: another tokenizer.
type shiftEnc struct{ byteEnc }

func (shiftEnc) Encode(text string) []int {
	ids := byteEnc{}.Encode(text)
	for i := range ids {
		ids[i]++
	}
	return ids
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	os.Mkdir(empty, 0o755)
	wrongExt := filepath.Join(dir, "wrongext")
	writeTree(t, wrongExt, map[string]string{"a.csv": "x,y", "b.bin": "zz"})
	zeros := filepath.Join(dir, "zeros")
	writeTree(t, zeros, map[string]string{"a.txt": "", "b/c.txt": ""})
	blank := filepath.Join(dir, "blank.jsonl")
	writeTree(t, dir, map[string]string{"blank.jsonl": "\n\n{\"text\": \"\"}\n{\"text\": null}\n"})
	ok := filepath.Join(dir, "ok")
	writeTree(t, ok, map[string]string{"a.txt": "hello"})

	for _, tc := range []struct {
		name string
		cfg  Config
		enc  Encoder
		want string
		is   error
	}{
		{"missing path", Config{Path: filepath.Join(dir, "nope"), SeqLen: 4, BatchSize: 1}, byteEnc{}, "does not exist", fs.ErrNotExist},
		{"missing jsonl", Config{Kind: KindJSONL, Path: filepath.Join(dir, "nope.jsonl"), SeqLen: 4, BatchSize: 1}, byteEnc{}, "does not exist", fs.ErrNotExist},
		{"no path", Config{SeqLen: 4, BatchSize: 1}, byteEnc{}, "no dataset path", nil},
		{"empty folder", Config{Path: empty, SeqLen: 4, BatchSize: 1}, byteEnc{}, "no documents", ErrEmpty},
		{"no matching files", Config{Path: wrongExt, SeqLen: 4, BatchSize: 1}, byteEnc{}, "no documents", ErrEmpty},
		{"empty files", Config{Path: zeros, SeqLen: 4, BatchSize: 1}, byteEnc{}, "no documents", ErrEmpty},
		{"empty tokens folder", Config{Kind: KindTokens, Path: empty, SeqLen: 4, BatchSize: 1}, nil, "no tokens", ErrEmpty},
		{"empty jsonl folder", Config{Kind: KindJSONL, Path: empty, SeqLen: 4, BatchSize: 1}, byteEnc{}, "no documents", ErrEmpty},
		{"unknown kind", Config{Kind: "parquet", Path: ok, SeqLen: 4, BatchSize: 1}, byteEnc{}, "unknown dataset kind", nil},
		{"zero seq_len", Config{Path: ok, BatchSize: 1}, byteEnc{}, "SeqLen", nil},
		{"zero batch", Config{Path: ok, SeqLen: 4}, byteEnc{}, "BatchSize", nil},
		{"nil encoder", Config{Path: ok, SeqLen: 4, BatchSize: 1}, nil, "tokenizer", nil},
		{"tiny doc bytes", Config{Path: ok, SeqLen: 4, BatchSize: 1, DocBytes: 10}, byteEnc{}, "DocBytes", nil},
		{"validation without holdout", Config{Path: ok, SeqLen: 4, BatchSize: 1, Validation: true}, byteEnc{}, "HoldOut", nil},
		{"holdout too big", Config{Path: ok, SeqLen: 4, BatchSize: 1, HoldOut: 5, Validation: true}, byteEnc{}, "no shards", ErrEmpty},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Open(tc.cfg, tc.enc)
			if err == nil {
				l.Close()
				t.Fatal("Open: no error")
			}
			if !strings.Contains(err.Error(), tc.want) || tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("Open: %v; want an error mentioning %q (is %v)", err, tc.want, tc.is)
			}
		})
	}

	// A dataset whose documents are all empty errors out of Next instead of
	// looping forever.
	l := open(t, Config{Path: blank, SeqLen: 4, BatchSize: 1}, byteEnc{})
	if _, err := l.Next(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Next on an all-empty jsonl: %v, want ErrEmpty", err)
	}
	if _, err := l.Next(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("the error is not sticky: %v", err)
	}
	if _, err := l.State(); err == nil {
		t.Fatal("State of a failed loader: no error")
	}
	// Documents that encode to nothing (no BOS/EOS) are as empty.
	l = open(t, Config{Path: ok, SeqLen: 4, BatchSize: 1}, nullEnc{})
	if _, err := l.Next(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Next with an encoder yielding no ids: %v, want ErrEmpty", err)
	}
}

// nullEnc encodes everything to nothing and has no BOS/EOS.
type nullEnc struct{}

func (nullEnc) Encode(string) []int { return nil }
func (nullEnc) BOS() int            { return -1 }
func (nullEnc) EOS() int            { return -1 }

func TestUnreadableFile(t *testing.T) {
	// A dangling symbolic link cannot be read, even by root.
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a.txt": "fine"})
	if err := os.Symlink(filepath.Join(dir, "gone"), filepath.Join(dir, "b.txt")); err != nil {
		t.Skip("no symbolic links:", err)
	}
	if _, err := Open(Config{Path: dir, SeqLen: 4, BatchSize: 1}, byteEnc{}); err == nil || !strings.Contains(err.Error(), "b.txt") {
		t.Fatalf("Open with a dangling link: %v, want an error naming b.txt", err)
	}
	if os.Geteuid() == 0 {
		t.Skip("running as root: permissions are not enforced")
	}
	dir = t.TempDir()
	writeTree(t, dir, map[string]string{"a.txt": "fine", "b.txt": "secret"})
	if err := os.Chmod(filepath.Join(dir, "b.txt"), 0); err != nil {
		t.Fatal(err)
	}
	_, err := Open(Config{Path: dir, SeqLen: 4, BatchSize: 1}, byteEnc{})
	if err == nil || !strings.Contains(err.Error(), "b.txt") {
		t.Fatalf("Open: %v, want an error naming b.txt", err)
	}
}

func TestVocabCheck(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "t.tok")
	if err := WriteTokens(p, []int32{1, 2, 3, 999, 4}, 1000, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Path: p, SeqLen: 2, BatchSize: 1, VocabSize: 500}, nil); err == nil ||
		!strings.Contains(err.Error(), "exceeds the model's vocabulary size 500") {
		t.Fatalf("Open with a small model vocab: %v", err)
	}
	l := open(t, Config{Path: p, SeqLen: 2, BatchSize: 1, VocabSize: 1000}, nil)
	if err := CheckVocab(l.Source(), 999); err == nil {
		t.Fatal("CheckVocab(999) of a 1000-token vocabulary: no error")
	}
	if err := CheckVocab(l.Source(), 1000); err != nil {
		t.Fatal(err)
	}
	// Next rejects ids outside VocabSize for text too.
	tdir := t.TempDir()
	writeTree(t, tdir, map[string]string{"a.txt": "hello world"})
	l = open(t, Config{Path: tdir, SeqLen: 4, BatchSize: 1, VocabSize: 200}, byteEnc{})
	if _, err := l.Next(); err == nil || !strings.Contains(err.Error(), "outside the model vocabulary") {
		t.Fatalf("Next with BOS 256 >= VocabSize 200: %v", err)
	}
}

func TestHoldOut(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{}
	for i := range 23 {
		files[fmt.Sprintf("f%02d.txt", i)] = fmt.Sprintf("doc %d", i)
	}
	writeTree(t, dir, files)
	all, err := NewTextSource(dir, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	read := func(s Source) []string {
		var out []string
		for i := range s.NumShards() {
			r, err := s.OpenShard(i, 0)
			if err != nil {
				t.Fatal(err)
			}
			d, err := r.Next()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d.Text)
		}
		return out
	}
	for _, every := range []int{2, 3, 5, 23} {
		tr, err := HoldOut(all, every, false)
		if err != nil {
			t.Fatal(err)
		}
		va, err := HoldOut(all, every, true)
		if err != nil {
			t.Fatal(err)
		}
		var wantTr, wantVa []string
		for i, d := range read(all) {
			if i%every == every-1 {
				wantVa = append(wantVa, d)
			} else {
				wantTr = append(wantTr, d)
			}
		}
		if got := read(tr); !slices.Equal(got, wantTr) {
			t.Errorf("every %d: training split %q, want %q", every, got, wantTr)
		}
		if got := read(va); !slices.Equal(got, wantVa) {
			t.Errorf("every %d: validation split %q, want %q", every, got, wantVa)
		}
		if tr.Fingerprint() == va.Fingerprint() || tr.Fingerprint() == all.Fingerprint() {
			t.Error("splits share a fingerprint")
		}
	}
	if _, err := HoldOut(all, 1, true); err == nil {
		t.Error("HoldOut(every=1): no error")
	}
	// Through Config.
	l := open(t, Config{Path: dir, SeqLen: 3, BatchSize: 1, HoldOut: 4, Validation: true, NoShuffle: true}, byteEnc{})
	got := splitDocs(windows(t, take(t, l, 12)))
	if len(got) < 5 || got[0] != "doc 3" || got[1] != "doc 7" || got[4] != "doc 19" {
		t.Errorf("validation loader documents %q, want doc 3, 7, 11, 15, 19", got)
	}
}

func TestDetectKind(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"t/a.txt":            "x",
		"j/a.txt":            "x",
		"j/sub/b.jsonl":      "{}",
		"g/c4-train.json.gz": "",
		"f.md":               "x",
		"f.ndjson":           "{}",
	})
	if err := WriteTokens(filepath.Join(dir, "k", "x.tok"), []int32{1}, 2, -1); err == nil {
		t.Fatal("WriteTokens into a missing folder: no error")
	}
	os.Mkdir(filepath.Join(dir, "k"), 0o755)
	if err := WriteTokens(filepath.Join(dir, "k", "x.tok"), []int32{1}, 2, -1); err != nil {
		t.Fatal(err)
	}
	if err := WriteTokens(filepath.Join(dir, "odd.dat"), []int32{1}, 2, -1); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"t": KindText, "j": KindJSONL, "g": KindJSONL, "k": KindTokens,
		"f.md": KindText, "f.ndjson": KindJSONL, "k/x.tok": KindTokens, "odd.dat": KindTokens, "missing": "",
	} {
		if got := DetectKind(filepath.Join(dir, path)); got != want {
			t.Errorf("DetectKind(%s) = %q, want %q", path, got, want)
		}
	}
}

func TestGoSourceCorpus(t *testing.T) {
	src, err := GoSourceCorpus()
	testenv.Require(t, fmt.Sprintf("the Go source tree (%v)", err), err == nil)
	defer src.Close()
	if n := src.NumShards(); n < 500 {
		t.Fatalf("only %d documents in %s", n, src.Name())
	}
	ts := src.(*textSource)
	for _, f := range ts.files {
		if !strings.HasSuffix(f.rel, ".go") || slices.Contains(strings.Split(f.rel, "/"), "testdata") {
			t.Fatalf("unexpected file %s", f.rel)
		}
	}
	withPackage := 0
	for i := 0; i < src.NumShards(); i += src.NumShards() / 20 {
		r, err := src.OpenShard(i, 0)
		if err != nil {
			t.Fatal(err)
		}
		d, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(d.Text, "package ") {
			withPackage++
		}
	}
	if withPackage < 10 {
		t.Errorf("only %d of 20 sampled documents mention a package", withPackage)
	}
	l := open(t, Config{Kind: KindGoSrc, SeqLen: 64, BatchSize: 4, Seed: 1}, byteEnc{})
	take(t, l, 3)
}

func TestPretokenize(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, corpus)
	src, err := NewTextSource(dir, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "corpus.tok")
	n, err := Pretokenize(src, byteEnc{}, out, 258)
	if err != nil {
		t.Fatal(err)
	}
	want := wrapped(corpusDocs...)
	if n != int64(len(want)) {
		t.Fatalf("Pretokenize wrote %d tokens, want %d", n, len(want))
	}
	h, err := ReadTokenHeader(out)
	if err != nil {
		t.Fatal(err)
	}
	if h.EOS != tEOS || h.VocabSize != 258 || h.Count != n {
		t.Fatalf("header %+v", h)
	}
	a := open(t, Config{Path: out, SeqLen: 10, BatchSize: 3, NoShuffle: true, BlockTokens: 7}, nil)
	b := open(t, Config{Path: dir, SeqLen: 10, BatchSize: 3, NoShuffle: true}, byteEnc{})
	if !batchesEqual(take(t, a, 8), take(t, b, 8)) {
		t.Fatal("the pre-tokenized loader differs from the text loader")
	}
}

// BenchmarkPackShakespeare measures packing throughput (reading, byte-level
// encoding, windowing) on tinyshakespeare.
func BenchmarkPackShakespeare(b *testing.B) {
	p := testenv.SharedData(b, "tinyshakespeare", "input.txt")
	l, err := Open(Config{Path: p, SeqLen: 1024, BatchSize: 8, Seed: 1}, byteEnc{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	for b.Loop() {
		if _, err := l.Next(); err != nil {
			b.Fatal(err)
		}
	}
	toks := float64(b.N) * 8 * 1025
	b.ReportMetric(toks/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkPackTokens measures packing throughput from a pre-tokenized file
// (uint16 tokens, memory-mapped).
func BenchmarkPackTokens(b *testing.B) {
	toks := make([]int32, 1<<22)
	for i := range toks {
		toks[i] = int32(i * 31 % 50257)
	}
	path := filepath.Join(b.TempDir(), "bench.tok")
	if err := WriteTokens(path, toks, 50257, 50256); err != nil {
		b.Fatal(err)
	}
	l, err := Open(Config{Path: path, SeqLen: 1024, BatchSize: 8, Seed: 1}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	for b.Loop() {
		if _, err := l.Next(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*8*1025/b.Elapsed().Seconds(), "tokens/s")
}
