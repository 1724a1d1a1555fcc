package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// readAll returns every document of src in natural order.
func readAll(t *testing.T, src Source) []Document {
	t.Helper()
	var docs []Document
	for i := range src.NumShards() {
		r, err := src.OpenShard(i, 0)
		if err != nil {
			t.Fatal(err)
		}
		for {
			d, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			docs = append(docs, d)
		}
		r.Close()
	}
	return docs
}

func TestTextPieces(t *testing.T) {
	var lines strings.Builder
	for i := range 500 {
		fmt.Fprintf(&lines, "line %d %s\n", i, strings.Repeat("é", i%23))
	}
	long := strings.Repeat("ü日本x", 700) // no newline at all
	mixed := strings.Repeat("short\n", 30) + strings.Repeat("long line without end ", 40) + "\nend"
	for _, tc := range []struct {
		name     string
		body     string
		docBytes int
	}{
		{"lines", lines.String(), 64},
		{"lines-1k", lines.String(), 1000},
		{"one-piece", lines.String(), 1 << 20},
		{"no newlines", long, 100},
		{"mixed", mixed, 128},
		{"exact newline at boundary", strings.Repeat(strings.Repeat("a", 63)+"\n", 10), 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, map[string]string{"f.txt": tc.body})
			src, err := NewTextSource(filepath.Join(dir, "f.txt"), nil, tc.docBytes)
			if err != nil {
				t.Fatal(err)
			}
			docs := readAll(t, src)
			if want := (len(tc.body) + tc.docBytes - 1) / tc.docBytes; src.NumShards() != want {
				t.Fatalf("%d shards, want %d", src.NumShards(), want)
			}
			var joined strings.Builder
			for i, d := range docs {
				joined.WriteString(d.Text)
				if len(d.Text) > 2*tc.docBytes+3 {
					t.Errorf("piece %d has %d bytes for DocBytes %d", i, len(d.Text), tc.docBytes)
				}
				if !utf8.ValidString(d.Text) {
					t.Errorf("piece %d is cut inside a UTF-8 character", i)
				}
				if tc.name == "lines" && i < len(docs)-1 && !strings.HasSuffix(d.Text, "\n") {
					t.Errorf("piece %d does not end at a line boundary: %q", i, d.Text[max(0, len(d.Text)-10):])
				}
			}
			if joined.String() != tc.body {
				t.Fatal("the pieces do not concatenate to the file")
			}
			// Skipping the single document of a shard gives EOF.
			r, _ := src.OpenShard(0, 1)
			if _, err := r.Next(); err != io.EOF {
				t.Fatalf("after skip: %v, want EOF", err)
			}
		})
	}
}

func TestTextExtensions(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a.go": "package a", "b.txt": "b", "c.MD": "c", "d": "d", "sub/e.go": "package e"})
	for _, tc := range []struct {
		exts []string
		want []string
	}{
		{nil, []string{"b", "c"}},
		{[]string{".go"}, []string{"package a", "package e"}},
		{[]string{".go", ".txt"}, []string{"package a", "b", "package e"}},
		{[]string{"*"}, []string{"package a", "b", "c", "d", "package e"}},
	} {
		src, err := NewTextSource(dir, tc.exts, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range readAll(t, src) {
			got = append(got, d.Text)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("exts %v: %q, want %q", tc.exts, got, tc.want)
		}
	}
}

func TestJSONL(t *testing.T) {
	// Reference: the texts of the lines, computed independently of the
	// reader.
	var buf strings.Builder
	var want []string
	for i := range 103 {
		text := fmt.Sprintf("doc %d: \"quoted\"\nnewline\ttab ü", i)
		switch {
		case i%10 == 3:
			buf.WriteString("\n") // blank line
			want = append(want, "")
		case i%10 == 7:
			buf.WriteString("{\"text\": null, \"id\": 1}\r\n")
			want = append(want, "")
		}
		fmt.Fprintf(&buf, "{\"url\": \"http://x/%d\", \"text\": %q, \"meta\": {\"a\": [1, 2]}}", i, text)
		if i%4 == 0 {
			buf.WriteString("\r\n")
		} else if i != 102 {
			buf.WriteString("\n")
		}
		want = append(want, text)
	}
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"c4.jsonl": buf.String()})
	path := filepath.Join(dir, "c4.jsonl")
	// The same data gzip-compressed.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(buf.String()))
	zw.Close()
	gzDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(gzDir, "c4.json.gz"), gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path  string
		block int
	}{{path, 1}, {path, 7}, {path, 256}, {path, 10000}, {gzDir, 5}} {
		src, err := NewJSONLSource(tc.path, "", nil, tc.block)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range readAll(t, src) {
			got = append(got, d.Text)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s block %d: %d documents, want %d (or texts differ)", tc.path, tc.block, len(got), len(want))
		}
		// Opening a shard after k documents gives the same documents as
		// reading it from the start.
		for i := range src.NumShards() {
			r0, _ := src.OpenShard(i, 0)
			var all []string
			for d, err := r0.Next(); err == nil; d, err = r0.Next() {
				all = append(all, d.Text)
			}
			r0.Close()
			for k := range len(all) + 1 {
				r, err := src.OpenShard(i, k)
				if err != nil {
					t.Fatal(err)
				}
				var rest []string
				for d, err := r.Next(); err == nil; d, err = r.Next() {
					rest = append(rest, d.Text)
				}
				r.Close()
				if !slices.Equal(rest, all[k:]) {
					t.Fatalf("block %d shard %d skip %d: wrong documents", tc.block, i, k)
				}
				if k > 3 {
					break
				}
			}
		}
	}
	// Another field name.
	writeTree(t, dir, map[string]string{"other.jsonl": "{\"content\": \"A\"}\n{\"content\": \"B\"}\n"})
	src, err := NewJSONLSource(filepath.Join(dir, "other.jsonl"), "content", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if d := readAll(t, src); len(d) != 2 || d[0].Text != "A" || d[1].Text != "B" || d[1].Origin != filepath.Join(dir, "other.jsonl")+":2" {
		t.Fatalf("content field: %+v", d)
	}
}

func TestJSONLErrors(t *testing.T) {
	good := `{"text": "fine"}`
	for _, tc := range []struct {
		name, line, want string
	}{
		{"malformed", `{"text": "unterminated}`, "malformed JSON"},
		{"not object", `["text"]`, "malformed JSON"},
		{"null line", `null`, "not a JSON object"},
		{"missing field", `{"body": "x", "id": 3}`, `no "text" field (fields: body, id)`},
		{"not string", `{"text": 42}`, `field "text" is not a string`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			body := strings.Repeat(good+"\n", 12) + tc.line + "\n" + good + "\n"
			writeTree(t, dir, map[string]string{"data.jsonl": body})
			path := filepath.Join(dir, "data.jsonl")
			l := open(t, Config{Path: path, SeqLen: 8, BatchSize: 4, NoShuffle: true, BlockLines: 5}, byteEnc{})
			var err error
			for range 100 {
				if _, err = l.Next(); err != nil {
					break
				}
			}
			wantLoc := path + ":13"
			if err == nil || !strings.Contains(err.Error(), wantLoc) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s and %q", err, wantLoc, tc.want)
			}
		})
	}
}

func TestTokenFileRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		vocab, eos, width int
	}{{258, 257, 2}, {65536, -1, 2}, {65537, 0, 4}, {200000, 199999, 4}} {
		t.Run(fmt.Sprint(tc.vocab), func(t *testing.T) {
			toks := make([]int32, 10007)
			for i := range toks {
				toks[i] = int32((uint64(i) * 2654435761) % uint64(tc.vocab))
			}
			toks[3] = int32(tc.vocab - 1)
			path := filepath.Join(t.TempDir(), "x.tok")
			if err := WriteTokens(path, toks, tc.vocab, tc.eos); err != nil {
				t.Fatal(err)
			}
			h, err := ReadTokenHeader(path)
			if err != nil {
				t.Fatal(err)
			}
			if want := (TokenHeader{Version: 1, Width: tc.width, Count: int64(len(toks)), VocabSize: tc.vocab, EOS: tc.eos}); h != want {
				t.Fatalf("header %+v, want %+v", h, want)
			}
			// The bytes on disk, decoded independently.
			raw, _ := os.ReadFile(path)
			if len(raw) != 64+len(toks)*tc.width || string(raw[:8]) != "TITANTOK" {
				t.Fatalf("file of %d bytes", len(raw))
			}
			for i, v := range toks {
				var got uint32
				if tc.width == 2 {
					got = uint32(binary.LittleEndian.Uint16(raw[64+2*i:]))
				} else {
					got = binary.LittleEndian.Uint32(raw[64+4*i:])
				}
				if got != uint32(v) {
					t.Fatalf("token %d on disk is %d, want %d", i, got, v)
				}
			}
			for _, block := range []int{1000, 10007, 1 << 20} {
				src, err := NewTokenSource(path, nil, block)
				if err != nil {
					t.Fatal(err)
				}
				var got []int32
				for _, d := range readAll(t, src) {
					got = append(got, d.Tokens...)
				}
				src.Close()
				if !slices.Equal(got, toks) {
					t.Fatalf("block %d: tokens read back differ", block)
				}
			}
		})
	}
	// Streaming writer, multiple writes.
	path := filepath.Join(t.TempDir(), "s.tok")
	w, err := CreateTokens(path, 100, 99)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := w.Write([]int32{int32(i), int32(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Write([]int32{5, 100}); err == nil {
		t.Fatal("writing token 100 of a 100-token vocabulary: no error")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if h, err := ReadTokenHeader(path); err != nil || h.Count != 20 {
		t.Fatalf("header %+v, %v", h, err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Fatalf("temporary files left behind: %v", ents)
	}
}

func TestTokenFileErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tok")
	if err := WriteTokens(good, []int32{1, 2, 3, 4, 5}, 300, 0); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(good)
	patch := func(off int, v uint32) []byte {
		b := slices.Clone(raw)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"truncated header", raw[:40], "truncated header"},
		{"empty", nil, "truncated header"},
		{"truncated body", raw[:len(raw)-1], "truncated"},
		{"trailing bytes", append(slices.Clone(raw), 0, 0, 0), "trailing bytes"},
		{"bad magic", append([]byte("NOTTOKEN"), raw[8:]...), "not a token file"},
		{"bad version", patch(8, 2), "unsupported version 2"},
		{"bad width", patch(12, 3), "bad token width 3"},
		{"bad vocab", patch(24, 0), "bad vocabulary size"},
		{"eos outside vocab", patch(28, 300), "EOS id 300"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".tok")
			if err := os.WriteFile(p, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadTokenHeader(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("ReadTokenHeader: %v, want an error naming the file and %q", err, tc.want)
			}
			_, err = Open(Config{Kind: KindTokens, Path: p, SeqLen: 2, BatchSize: 1}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open: %v, want %q", err, tc.want)
			}
		})
	}
	// A token id beyond the declared vocabulary is caught when read.
	bad := patch(64, 0) // tokens are uint16: overwrite tokens 0 and 1
	binary.LittleEndian.PutUint16(bad[64:], 299)
	binary.LittleEndian.PutUint16(bad[66:], 300)
	p := filepath.Join(dir, "corrupt.tok")
	os.WriteFile(p, bad, 0o644)
	src, err := NewTokenSource(p, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	r, _ := src.OpenShard(0, 0)
	if _, err := r.Next(); err == nil || !strings.Contains(err.Error(), "token 300 at index 1") {
		t.Fatalf("reading a corrupt token: %v", err)
	}
	// Writer argument checks.
	for _, args := range [][2]int{{0, -1}, {10, 10}, {10, -2}} {
		if err := WriteTokens(filepath.Join(dir, "w.tok"), nil, args[0], args[1]); err == nil {
			t.Errorf("WriteTokens(vocab %d, eos %d): no error", args[0], args[1])
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "w.tok")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed WriteTokens left a file")
	}
}

func TestTokenFolder(t *testing.T) {
	dir := t.TempDir()
	var want []int32
	for i := range 3 {
		toks := make([]int32, 100+i)
		for j := range toks {
			toks[j] = int32(i*1000 + j)
		}
		want = append(want, toks...)
		if err := WriteTokens(filepath.Join(dir, fmt.Sprintf("part-%d.tok", i)), toks, 5000, -1); err != nil {
			t.Fatal(err)
		}
	}
	writeTree(t, dir, map[string]string{"README.md": "ignored"})
	l := open(t, Config{Path: dir, SeqLen: 9, BatchSize: 2, NoShuffle: true, BlockTokens: 32}, nil)
	got := windows(t, take(t, l, 15))
	for len(want) < len(got) {
		want = append(want, want...)
	}
	if !slices.Equal(got, want[:len(got)]) {
		t.Fatal("the token folder stream differs from the files' tokens in order")
	}
}

func TestTokenReadAtFallback(t *testing.T) {
	toks := make([]int32, 3000)
	for i := range toks {
		toks[i] = int32(i % 1000)
	}
	path := filepath.Join(t.TempDir(), "f.tok")
	if err := WriteTokens(path, toks, 1000, -1); err != nil {
		t.Fatal(err)
	}
	src, err := NewTokenSource(path, nil, 512)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, f := range src.(*tokenSource).files {
		if f.data != nil {
			munmapFile(f.data)
			f.data = nil // read with ReadAt from now on
		}
	}
	var got []int32
	for _, d := range readAll(t, src) {
		got = append(got, d.Tokens...)
	}
	if !slices.Equal(got, toks) {
		t.Fatal("ReadAt path reads different tokens")
	}
}
