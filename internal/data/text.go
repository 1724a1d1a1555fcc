package data

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sort"
)

// DefaultDocBytes is the size above which a text file is split into several
// documents.
const DefaultDocBytes = 1 << 20

// DefaultTextExtensions are the file name endings a text folder is filtered
// by when none are given.
var DefaultTextExtensions = []string{".txt", ".md", ".text"}

// minDocBytes keeps the piece arithmetic sane (a forced cut moves at most 3
// bytes forward to reach a UTF-8 boundary).
const minDocBytes = 64

// textSource is a Source of plain-text files, one shard per document.
type textSource struct {
	label    string   // the name without the file count
	exts     []string // the extensions the files were filtered by
	name     string
	files    []fileEntry
	docBytes int64
	first    []int // first[f] is the first shard of file f; first[len(files)] = total
	fp       string
}

// NewTextSource returns a Source over the text file at path, or over the
// files under the folder at path whose names end with one of exts (default
// DefaultTextExtensions; "*" accepts every file), walked recursively in
// lexical order. Each file is one document, except that a file larger than
// docBytes (default DefaultDocBytes when 0) is split into pieces of about
// docBytes bytes at line boundaries (a line longer than docBytes is cut at a
// UTF-8 character boundary). Empty files are skipped. Each document is one
// shard.
func NewTextSource(path string, exts []string, docBytes int) (Source, error) {
	if len(exts) == 0 {
		exts = DefaultTextExtensions
	}
	files, err := listFiles(path, exts, nil)
	if err != nil {
		return nil, err
	}
	return newTextSource(fmt.Sprintf("text %q", path), files, docBytes, exts)
}

func newTextSource(name string, files []fileEntry, docBytes int, exts []string) (*textSource, error) {
	if docBytes == 0 {
		docBytes = DefaultDocBytes
	}
	if docBytes < minDocBytes {
		return nil, fmt.Errorf("data: DocBytes %d is below the minimum %d", docBytes, minDocBytes)
	}
	kept := files[:0:0]
	for _, f := range files {
		if f.size > 0 {
			kept = append(kept, f)
		}
	}
	if len(kept) == 0 {
		return nil, fmt.Errorf("data: %s has no documents (no non-empty files ending in %v): %w", name, exts, ErrEmpty)
	}
	if err := checkReadable(kept); err != nil {
		return nil, err
	}
	s := &textSource{
		label:    name,
		exts:     exts,
		name:     fmt.Sprintf("%s (%d files)", name, len(kept)),
		files:    kept,
		docBytes: int64(docBytes),
		first:    make([]int, len(kept)+1),
	}
	parts := []string{"text", fmt.Sprint(docBytes)}
	for i, f := range kept {
		s.first[i+1] = s.first[i] + int((f.size+s.docBytes-1)/s.docBytes)
		parts = append(parts, f.rel, fmt.Sprint(f.size))
	}
	s.fp = hashStrings(parts...)
	return s, nil
}

// reshard returns the same files cut into at least n documents (pieces of
// about total/n bytes, at line boundaries), for a hold-out split of a
// corpus with too few documents; ok is false when the pieces would be
// smaller than the minimum piece size or no smaller than today's.
func (s *textSource) reshard(n int) (src Source, ok bool, err error) {
	var total int64
	for _, f := range s.files {
		total += f.size
	}
	docBytes := total / int64(n)
	if n < 1 || docBytes < minDocBytes || docBytes >= s.docBytes {
		return nil, false, nil
	}
	r, err := newTextSource(s.label, s.files, int(docBytes), s.exts)
	if err != nil {
		return nil, false, err
	}
	return r, true, nil
}

func (s *textSource) Name() string        { return s.name }
func (s *textSource) NumShards() int      { return s.first[len(s.files)] }
func (s *textSource) Fingerprint() string { return s.fp }
func (s *textSource) Close() error        { return nil }

func (s *textSource) OpenShard(i, skip int) (DocReader, error) {
	if i < 0 || i >= s.NumShards() {
		return nil, fmt.Errorf("data: shard %d out of range [0, %d) of %s", i, s.NumShards(), s.name)
	}
	// The file is the last one whose first shard is <= i.
	fi := sort.SearchInts(s.first, i+1) - 1
	return &textReader{s: s, file: fi, piece: i - s.first[fi], done: skip > 0}, nil
}

// textReader yields the single document of a text shard.
type textReader struct {
	s     *textSource
	file  int
	piece int
	done  bool
}

func (r *textReader) Next() (Document, error) {
	if r.done {
		return Document{}, io.EOF
	}
	r.done = true
	f := r.s.files[r.file]
	fh, err := os.Open(f.path)
	if err != nil {
		return Document{}, fmt.Errorf("data: reading %s: %w", r.s.name, err)
	}
	defer fh.Close()
	n := r.s.first[r.file+1] - r.s.first[r.file]
	start, err := pieceStart(fh, f.size, int64(r.piece), r.s.docBytes)
	if err != nil {
		return Document{}, fmt.Errorf("data: reading %q: %w", f.path, err)
	}
	end := f.size
	if r.piece+1 < n {
		if end, err = pieceStart(fh, f.size, int64(r.piece+1), r.s.docBytes); err != nil {
			return Document{}, fmt.Errorf("data: reading %q: %w", f.path, err)
		}
	}
	buf := make([]byte, end-start)
	if _, err := fh.ReadAt(buf, start); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Document{}, fmt.Errorf("data: reading %q (changed since the dataset was opened?): %w", f.path, err)
	}
	origin := f.path
	if n > 1 {
		origin = fmt.Sprintf("%s@%d", f.path, start)
	}
	return Document{Text: string(buf), Origin: origin}, nil
}

func (r *textReader) Close() error { return nil }

// pieceStart returns the byte offset where piece k of a file of the given
// size begins when the file is cut into pieces of about docBytes bytes.
// Piece 0 starts at 0; piece k > 0 starts just after the first newline at or
// after offset k*docBytes-1 (so that a newline ending exactly at the nominal
// boundary is kept), looking at most docBytes bytes ahead; failing that, it
// starts at the first UTF-8 character boundary at or after k*docBytes.
// Consecutive starts are strictly increasing, so the pieces tile the file.
func pieceStart(f io.ReaderAt, size, k, docBytes int64) (int64, error) {
	if k == 0 {
		return 0, nil
	}
	from := k*docBytes - 1
	limit := min(from+docBytes, size)
	var buf [4096]byte
	for off := from; off < limit; {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), limit-off)], off)
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return off + int64(i) + 1, nil
		}
		if err != nil && err != io.EOF {
			return 0, err
		}
		if n == 0 {
			return 0, io.ErrUnexpectedEOF
		}
		off += int64(n)
	}
	// No newline close enough: cut inside the line, at a character boundary.
	cut := k * docBytes
	n, err := f.ReadAt(buf[:4], cut)
	if err != nil && err != io.EOF {
		return 0, err
	}
	for i := 0; i < n && i < 3 && buf[i]&0xC0 == 0x80; i++ {
		cut++
	}
	return min(cut, size), nil
}
