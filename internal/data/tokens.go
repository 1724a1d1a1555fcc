package data

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
)

// The pre-tokenized file format ("TITANTOK", version 1) is a 64-byte header
// followed by the tokens, all little-endian:
//
//	offset size field
//	0      8    magic "TITANTOK"
//	8      4    version (1)
//	12     4    bytes per token: 2 (uint16) or 4 (uint32)
//	16     8    token count
//	24     4    vocabulary size; every token is < it
//	28     4    EOS id as int32 (-1: none)
//	32     32   reserved, zero
//	64     ...  count tokens
//
// The file size is exactly 64 + count × bytes per token.
const (
	tokenMagic      = "TITANTOK"
	tokenVersion    = 1
	tokenHeaderSize = 64
)

// DefaultBlockTokens is the number of tokens in a shard of a token source.
const DefaultBlockTokens = 1 << 16

// DefaultTokenExtensions are the file name endings a token folder is
// filtered by when none are given.
var DefaultTokenExtensions = []string{".tok", ".bin"}

// TokenHeader describes a pre-tokenized file.
type TokenHeader struct {
	Version   int   // format version
	Width     int   // bytes per token: 2 or 4
	Count     int64 // number of tokens
	VocabSize int   // every token id is below VocabSize
	EOS       int   // end-of-document id, -1 if none
}

// tokenWidth returns the narrowest token width able to hold vocabSize ids.
func tokenWidth(vocabSize int) int {
	if vocabSize <= 1<<16 {
		return 2
	}
	return 4
}

func (h TokenHeader) marshal() []byte {
	b := make([]byte, tokenHeaderSize)
	copy(b, tokenMagic)
	binary.LittleEndian.PutUint32(b[8:], uint32(h.Version))
	binary.LittleEndian.PutUint32(b[12:], uint32(h.Width))
	binary.LittleEndian.PutUint64(b[16:], uint64(h.Count))
	binary.LittleEndian.PutUint32(b[24:], uint32(h.VocabSize))
	binary.LittleEndian.PutUint32(b[28:], uint32(int32(h.EOS)))
	return b
}

// parseTokenHeader decodes and validates a header; size is the file size.
func parseTokenHeader(b []byte, size int64) (TokenHeader, error) {
	if len(b) < tokenHeaderSize {
		return TokenHeader{}, fmt.Errorf("truncated header: %d of %d bytes", len(b), tokenHeaderSize)
	}
	if string(b[:8]) != tokenMagic {
		return TokenHeader{}, fmt.Errorf("not a token file: magic %q, want %q", b[:8], tokenMagic)
	}
	h := TokenHeader{
		Version:   int(binary.LittleEndian.Uint32(b[8:])),
		Width:     int(binary.LittleEndian.Uint32(b[12:])),
		Count:     int64(binary.LittleEndian.Uint64(b[16:])),
		VocabSize: int(binary.LittleEndian.Uint32(b[24:])),
		EOS:       int(int32(binary.LittleEndian.Uint32(b[28:]))),
	}
	switch {
	case h.Version != tokenVersion:
		return h, fmt.Errorf("unsupported version %d (this build reads version %d)", h.Version, tokenVersion)
	case h.Width != 2 && h.Width != 4:
		return h, fmt.Errorf("bad token width %d (want 2 or 4)", h.Width)
	case h.Count < 0 || h.Count > (1<<62)/int64(h.Width):
		return h, fmt.Errorf("bad token count %d", h.Count)
	case h.VocabSize <= 0 || h.VocabSize > math.MaxInt32 || h.Width == 2 && h.VocabSize > 1<<16:
		return h, fmt.Errorf("bad vocabulary size %d for %d-byte tokens", h.VocabSize, h.Width)
	case h.EOS < -1 || h.EOS >= h.VocabSize:
		return h, fmt.Errorf("EOS id %d outside the vocabulary [0, %d)", h.EOS, h.VocabSize)
	}
	want := tokenHeaderSize + h.Count*int64(h.Width)
	if size < want {
		return h, fmt.Errorf("truncated: the header promises %d tokens (%d bytes) but the file has %d bytes", h.Count, want, size)
	}
	if size > want {
		return h, fmt.Errorf("%d trailing bytes after %d tokens", size-want, h.Count)
	}
	return h, nil
}

// ReadTokenHeader reads and validates the header of the token file at path,
// including that the file size matches the token count.
func ReadTokenHeader(path string) (TokenHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return TokenHeader{}, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return TokenHeader{}, fmt.Errorf("data: %w", err)
	}
	b := make([]byte, tokenHeaderSize)
	n, err := io.ReadFull(f, b)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return TokenHeader{}, fmt.Errorf("data: reading %q: %w", path, err)
	}
	h, err := parseTokenHeader(b[:n], fi.Size())
	if err != nil {
		return h, fmt.Errorf("data: token file %q: %w", path, err)
	}
	return h, nil
}

// CheckVocab returns an error when tokens of a file with header h cannot be
// fed to a model with modelVocab embedding rows.
func (h TokenHeader) CheckVocab(modelVocab int) error {
	if h.VocabSize > modelVocab {
		return fmt.Errorf("data: token vocabulary size %d exceeds the model's vocabulary size %d", h.VocabSize, modelVocab)
	}
	return nil
}

// TokenWriter writes a pre-tokenized file. Tokens go to a temporary file in
// the destination folder, which Close syncs and renames into place, so a
// reader never sees a partial file.
type TokenWriter struct {
	path string
	f    *os.File
	w    *bufio.Writer
	hdr  TokenHeader
	buf  []byte
	done bool
}

// CreateTokens starts a token file at path for ids in [0, vocabSize) with
// the given EOS id (-1 for none). Tokens are stored as uint16 when
// vocabSize <= 65536 and as uint32 otherwise.
func CreateTokens(path string, vocabSize, eos int) (*TokenWriter, error) {
	if vocabSize <= 0 || vocabSize > math.MaxInt32 {
		return nil, fmt.Errorf("data: bad vocabulary size %d for %q", vocabSize, path)
	}
	if eos < -1 || eos >= vocabSize {
		return nil, fmt.Errorf("data: EOS id %d outside the vocabulary [0, %d) for %q", eos, vocabSize, path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	w := &TokenWriter{
		path: path,
		f:    f,
		w:    bufio.NewWriterSize(f, 1<<20),
		hdr:  TokenHeader{Version: tokenVersion, Width: tokenWidth(vocabSize), VocabSize: vocabSize, EOS: eos},
	}
	if _, err := w.w.Write(w.hdr.marshal()); err != nil {
		w.Abort()
		return nil, fmt.Errorf("data: writing %q: %w", path, err)
	}
	return w, nil
}

// Write appends tokens. It fails, writing none of them, if one is outside
// the vocabulary.
func (w *TokenWriter) Write(tokens []int32) error {
	if w.done {
		return fmt.Errorf("data: write to closed token writer for %q", w.path)
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= w.hdr.VocabSize {
			return fmt.Errorf("data: token %d (index %d of the write) outside the vocabulary [0, %d) for %q", t, i, w.hdr.VocabSize, w.path)
		}
	}
	w.buf = encodeTokens(w.buf[:0], tokens, w.hdr.Width)
	if _, err := w.w.Write(w.buf); err != nil {
		return fmt.Errorf("data: writing %q: %w", w.path, err)
	}
	w.hdr.Count += int64(len(tokens))
	return nil
}

// Count returns the number of tokens written so far.
func (w *TokenWriter) Count() int64 { return w.hdr.Count }

// Close completes the header, syncs the file and renames it to its path.
func (w *TokenWriter) Close() error {
	if w.done {
		return nil
	}
	err := w.w.Flush()
	if err == nil {
		_, err = w.f.WriteAt(w.hdr.marshal(), 0)
	}
	if err == nil {
		err = w.f.Sync()
	}
	if err != nil {
		w.Abort()
		return fmt.Errorf("data: writing %q: %w", w.path, err)
	}
	w.done = true
	tmp := w.f.Name()
	if err := w.f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("data: writing %q: %w", w.path, err)
	}
	if err := os.Rename(tmp, w.path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("data: %w", err)
	}
	if d, err := os.Open(filepath.Dir(w.path)); err == nil {
		d.Sync() // best effort: make the rename durable
		d.Close()
	}
	return nil
}

// Abort discards the file being written.
func (w *TokenWriter) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	w.f.Close()
	return os.Remove(w.f.Name())
}

// WriteTokens writes tokens to a token file at path in one go (see
// CreateTokens).
func WriteTokens(path string, tokens []int32, vocabSize, eos int) error {
	w, err := CreateTokens(path, vocabSize, eos)
	if err != nil {
		return err
	}
	if err := w.Write(tokens); err != nil {
		w.Abort()
		return err
	}
	return w.Close()
}

func encodeTokens(dst []byte, tokens []int32, width int) []byte {
	if width == 2 {
		for _, t := range tokens {
			dst = binary.LittleEndian.AppendUint16(dst, uint16(t))
		}
		return dst
	}
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(t))
	}
	return dst
}

func decodeTokens(dst []int32, b []byte, width int) {
	if width == 2 {
		for i := range dst {
			dst[i] = int32(binary.LittleEndian.Uint16(b[2*i:]))
		}
		return
	}
	for i := range dst {
		dst[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// tokenFile is an open token file, memory-mapped when the platform allows.
type tokenFile struct {
	fileEntry
	hdr  TokenHeader
	f    *os.File
	data []byte // the whole mapped file, or nil to use ReadAt
}

func openTokenFile(e fileEntry) (*tokenFile, error) {
	f, err := os.Open(e.path)
	if err != nil {
		return nil, fmt.Errorf("data: dataset file is unreadable: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data: %w", err)
	}
	b := make([]byte, tokenHeaderSize)
	n, err := io.ReadFull(f, b)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		f.Close()
		return nil, fmt.Errorf("data: reading %q: %w", e.path, err)
	}
	h, err := parseTokenHeader(b[:n], fi.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data: token file %q: %w", e.path, err)
	}
	tf := &tokenFile{fileEntry: e, hdr: h, f: f}
	tf.data, _ = mmapFile(f, fi.Size()) // on failure fall back to ReadAt
	return tf, nil
}

// read decodes n tokens starting at token index off into dst.
func (t *tokenFile) read(dst []int32, off int64) error {
	start := tokenHeaderSize + off*int64(t.hdr.Width)
	nb := int64(len(dst)) * int64(t.hdr.Width)
	var b []byte
	if t.data != nil {
		b = t.data[start : start+nb]
	} else {
		b = make([]byte, nb)
		if _, err := t.f.ReadAt(b, start); err != nil {
			return fmt.Errorf("data: reading %q: %w", t.path, err)
		}
	}
	decodeTokens(dst, b, t.hdr.Width)
	for i, v := range dst {
		if v < 0 || int(v) >= t.hdr.VocabSize {
			return fmt.Errorf("data: token file %q: token %d at index %d is outside the vocabulary [0, %d) (corrupt file?)", t.path, v, off+int64(i), t.hdr.VocabSize)
		}
	}
	return nil
}

func (t *tokenFile) close() error {
	var err error
	if t.data != nil {
		err = munmapFile(t.data)
		t.data = nil
	}
	if cerr := t.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// tokenSource is a Source of pre-tokenized files, one shard per block.
type tokenSource struct {
	name  string
	files []*tokenFile
	block int64
	first []int // first[f] is the first shard of file f
	vocab int
	fp    string
}

// NewTokenSource returns a Source over the token file at path (see
// WriteTokens), or over the token files under the folder at path whose
// names end with one of exts (default DefaultTokenExtensions), in lexical
// order. Each file's tokens are cut into shards of blockTokens tokens
// (default DefaultBlockTokens when 0); each shard is one document whose
// tokens are used as they are. Files are memory-mapped where possible and
// stay open until Close.
func NewTokenSource(path string, exts []string, blockTokens int) (Source, error) {
	if len(exts) == 0 {
		exts = DefaultTokenExtensions
	}
	if blockTokens == 0 {
		blockTokens = DefaultBlockTokens
	}
	if blockTokens < 0 {
		return nil, fmt.Errorf("data: BlockTokens must be positive, got %d", blockTokens)
	}
	entries, err := listFiles(path, exts, nil)
	if err != nil {
		return nil, err
	}
	s := &tokenSource{block: int64(blockTokens), first: []int{0}}
	parts := []string{"tokens", fmt.Sprint(blockTokens)}
	for _, e := range entries {
		tf, err := openTokenFile(e)
		if err != nil {
			s.Close()
			return nil, err
		}
		if tf.hdr.Count == 0 {
			tf.close()
			continue
		}
		s.files = append(s.files, tf)
		s.first = append(s.first, s.first[len(s.first)-1]+int((tf.hdr.Count+s.block-1)/s.block))
		s.vocab = max(s.vocab, tf.hdr.VocabSize)
		parts = append(parts, e.rel, fmt.Sprint(tf.hdr.Count), fmt.Sprint(tf.hdr.VocabSize), fmt.Sprint(tf.hdr.EOS))
	}
	s.name = fmt.Sprintf("tokens %q (%d files)", path, len(s.files))
	if len(s.files) == 0 {
		return nil, fmt.Errorf("data: %s has no tokens: %w", s.name, ErrEmpty)
	}
	s.fp = hashStrings(parts...)
	return s, nil
}

// VocabSize returns the largest vocabulary size declared by the files.
func (s *tokenSource) VocabSize() int { return s.vocab }

// CheckVocab returns an error if a file's vocabulary exceeds modelVocab.
func (s *tokenSource) CheckVocab(modelVocab int) error {
	for _, f := range s.files {
		if err := f.hdr.CheckVocab(modelVocab); err != nil {
			return fmt.Errorf("%w (token file %q)", err, f.path)
		}
	}
	return nil
}

func (s *tokenSource) Name() string        { return s.name }
func (s *tokenSource) NumShards() int      { return s.first[len(s.files)] }
func (s *tokenSource) Fingerprint() string { return s.fp }

func (s *tokenSource) Close() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.close())
	}
	s.files = nil
	return errors.Join(errs...)
}

func (s *tokenSource) OpenShard(i, skip int) (DocReader, error) {
	if i < 0 || i >= s.NumShards() {
		return nil, fmt.Errorf("data: shard %d out of range [0, %d) of %s", i, s.NumShards(), s.name)
	}
	fi := sort.SearchInts(s.first, i+1) - 1
	return &tokenReader{f: s.files[fi], off: int64(i-s.first[fi]) * s.block, block: s.block, done: skip > 0}, nil
}

type tokenReader struct {
	f     *tokenFile
	off   int64
	block int64
	done  bool
}

func (r *tokenReader) Next() (Document, error) {
	if r.done {
		return Document{}, io.EOF
	}
	r.done = true
	n := min(r.block, r.f.hdr.Count-r.off)
	toks := make([]int32, n)
	if err := r.f.read(toks, r.off); err != nil {
		return Document{}, err
	}
	return Document{Tokens: toks, Origin: fmt.Sprintf("%s@%d", r.f.path, r.off)}, nil
}

func (r *tokenReader) Close() error { return nil }

// hasTokenMagic reports whether the file at path starts with the token
// file magic.
func hasTokenMagic(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(tokenMagic))
	if _, err := io.ReadFull(f, b); err != nil {
		return false
	}
	return bytes.Equal(b, []byte(tokenMagic))
}
