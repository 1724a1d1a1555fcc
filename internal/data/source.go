package data

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/titan-go/titan/internal/randstream"
)

// ErrEmpty is wrapped by the errors reporting a dataset without documents or
// without tokens.
var ErrEmpty = errors.New("dataset is empty")

// Document is one unit of text (or of tokens) read from a Source.
type Document struct {
	// Text is the document's text; empty for pre-tokenized documents.
	Text string
	// Tokens holds the ids of a pre-tokenized document. They already contain
	// whatever separators were written at pre-tokenization time and are used
	// as they are, without BOS/EOS wrapping. Nil for text documents.
	Tokens []int32
	// Origin names where the document comes from ("file", "file:line",
	// "file@offset"), for messages.
	Origin string
}

// A DocReader reads the documents of one shard in order.
type DocReader interface {
	// Next returns the next document of the shard, or io.EOF after the last.
	Next() (Document, error)
	// Close releases the reader's resources.
	Close() error
}

// A Source is a finite, deterministic collection of documents grouped into
// shards, the unit of shuffling. Shard i always holds the same documents in
// the same order, so a reader position is (shard, documents already read).
type Source interface {
	// Name describes the source for messages, e.g. `text "corpus" (12 files)`.
	Name() string
	// NumShards reports the number of shards.
	NumShards() int
	// OpenShard opens shard i, 0 <= i < NumShards(), positioned after its
	// first skip documents.
	OpenShard(i, skip int) (DocReader, error)
	// Fingerprint identifies the content layout of the source: two sources
	// with the same fingerprint yield the same documents.
	Fingerprint() string
	// Close releases resources held by the source (mapped files).
	Close() error
}

// Position is a resumable place in a Stream: the next document to read is
// document Doc of the shard in slot Shard of epoch Epoch's shard order.
type Position struct {
	Epoch int `json:"epoch"`
	Shard int `json:"shard"`
	Doc   int `json:"doc"`
}

// Stream reads the documents of a Source epoch after epoch, forever. Every
// epoch visits all shards once; unless shuffling is off, the shard order of
// epoch e is a permutation drawn from (seed, e) alone.
type Stream struct {
	src     Source
	seed    uint64
	shuffle bool

	pos       Position
	perm      []int // shard order of pos.Epoch; nil until needed
	permEpoch int
	cur       DocReader

	lastDocEpoch int // epoch of the last document returned (empty-dataset guard)
}

// NewStream returns a Stream over src positioned at the start of epoch 0.
// With shuffle false the shards are visited in their natural order in every
// epoch.
func NewStream(src Source, seed uint64, shuffle bool) *Stream {
	return &Stream{src: src, seed: seed, shuffle: shuffle}
}

// Position returns the position of the next document.
func (s *Stream) Position() Position { return s.pos }

// Seek moves the stream to p, as returned by Position.
func (s *Stream) Seek(p Position) error {
	n := s.src.NumShards()
	if p.Epoch < 0 || p.Shard < 0 || p.Shard > n || p.Doc < 0 {
		return fmt.Errorf("data: position %+v is out of range for %s (%d shards)", p, s.src.Name(), n)
	}
	if err := s.closeCur(); err != nil {
		return err
	}
	s.pos = p
	s.lastDocEpoch = p.Epoch
	return nil
}

// Next returns the next document, moving on to the next shard and the next
// epoch as needed. It returns an error wrapping ErrEmpty when a whole epoch
// passes without a single document.
func (s *Stream) Next() (Document, error) {
	n := s.src.NumShards()
	if n == 0 {
		return Document{}, fmt.Errorf("data: %s has no documents: %w", s.src.Name(), ErrEmpty)
	}
	for {
		if s.cur == nil {
			if s.pos.Shard >= n {
				s.pos = Position{Epoch: s.pos.Epoch + 1}
			}
			if s.pos.Epoch >= s.lastDocEpoch+2 {
				// Epoch lastDocEpoch+1 was read in full without a document.
				return Document{}, fmt.Errorf("data: %s has no documents: %w", s.src.Name(), ErrEmpty)
			}
			shard := s.shardAt(s.pos.Epoch, s.pos.Shard)
			r, err := s.src.OpenShard(shard, s.pos.Doc)
			if err != nil {
				return Document{}, err
			}
			s.cur = r
		}
		doc, err := s.cur.Next()
		if err == io.EOF {
			if err := s.closeCur(); err != nil {
				return Document{}, err
			}
			s.pos.Shard++
			s.pos.Doc = 0
			continue
		}
		if err != nil {
			return Document{}, err
		}
		s.pos.Doc++
		s.lastDocEpoch = s.pos.Epoch
		return doc, nil
	}
}

// Close closes the open shard reader, if any. It does not close the Source.
func (s *Stream) Close() error { return s.closeCur() }

func (s *Stream) closeCur() error {
	if s.cur == nil {
		return nil
	}
	err := s.cur.Close()
	s.cur = nil
	return err
}

// shardAt returns the shard visited in slot of epoch.
func (s *Stream) shardAt(epoch, slot int) int {
	if !s.shuffle {
		return slot
	}
	if s.perm == nil || s.permEpoch != epoch {
		s.perm = ShardOrder(s.seed, epoch, s.src.NumShards())
		s.permEpoch = epoch
	}
	return s.perm[slot]
}

// ShardOrder returns the shard order of an epoch: a permutation of [0, n)
// drawn by a Fisher–Yates shuffle from a PCG generator seeded with seed and
// epoch. It depends on nothing else, so it is the same on every machine and
// Go release.
func ShardOrder(seed uint64, epoch, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	r := rand.NewPCG(randstream.SplitMix64(seed), randstream.SplitMix64(uint64(epoch)^0x5851f42d4c957f2d))
	for i := n - 1; i > 0; i-- {
		j := int(uniform(r, uint64(i+1)))
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// uniform returns a uniform integer in [0, n) (Lemire's multiply-and-reject),
// written here rather than taken from math/rand/v2 so that the permutation
// is pinned to the PCG output alone.
func uniform(r *rand.PCG, n uint64) uint64 {
	hi, lo := bits.Mul64(r.Uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(r.Uint64(), n)
		}
	}
	return hi
}

// HoldOut splits src by shard for validation: shard i (in natural order) is
// held out when i%every == every-1, i.e. every every-th shard. With held
// false the returned Source has the remaining shards (the training split),
// with held true only the held-out ones (the validation split). The split
// does not depend on the seed. Shards are documents for text sources and
// blocks of lines or tokens for jsonl and token sources.
//
// A text source with fewer than every documents (typically one file of a
// few MiB, such as tinyshakespeare's input.txt) would have an empty
// validation split, so it is first cut again into at least every pieces
// of about total/every bytes at line boundaries, and every every-th piece
// is held out: for one file of exactly every pieces, that is its last
// 1/every. The two splits stay disjoint and together cover the corpus;
// both are cut the same way since the choice depends on the source alone.
// A corpus too small to cut into every pieces of at least 64 bytes keeps
// the error.
func HoldOut(src Source, every int, held bool) (Source, error) {
	if every < 2 {
		return nil, fmt.Errorf("data: HoldOut needs every >= 2, got %d", every)
	}
	h := &holdOut{src: src, every: every, held: held}
	if r, ok := src.(resharder); ok && src.NumShards() < every {
		finer, ok, err := r.reshard(every)
		if err != nil {
			return nil, err
		}
		if ok {
			h.src, h.orig = finer, src
		}
	}
	n := h.src.NumShards()
	if held {
		h.n = n / every
	} else {
		h.n = n - n/every
	}
	if h.n == 0 {
		return nil, fmt.Errorf("data: the %s split of %s (held out: every %d-th of %d shards) has no shards: %w",
			h.splitName(), h.src.Name(), every, n, ErrEmpty)
	}
	return h, nil
}

// resharder is a Source that can cut its content into more, smaller
// shards (see HoldOut).
type resharder interface {
	reshard(n int) (src Source, ok bool, err error)
}

type holdOut struct {
	src   Source
	orig  Source // the source src was cut again from (nil: none)
	every int
	held  bool
	n     int
}

func (h *holdOut) splitName() string {
	if h.held {
		return "validation"
	}
	return "training"
}

func (h *holdOut) Name() string {
	return fmt.Sprintf("%s [%s split, 1/%d held out]", h.src.Name(), h.splitName(), h.every)
}

func (h *holdOut) NumShards() int { return h.n }

func (h *holdOut) OpenShard(i, skip int) (DocReader, error) {
	if i < 0 || i >= h.n {
		return nil, fmt.Errorf("data: shard %d out of range [0, %d) of %s", i, h.n, h.Name())
	}
	var j int
	if h.held {
		j = i*h.every + h.every - 1
	} else {
		// Every group of every shards keeps its first every-1.
		j = i/(h.every-1)*h.every + i%(h.every-1)
	}
	return h.src.OpenShard(j, skip)
}

func (h *holdOut) Fingerprint() string {
	return hashStrings("holdout", h.src.Fingerprint(), fmt.Sprint(h.every), fmt.Sprint(h.held))
}

func (h *holdOut) Close() error {
	err := h.src.Close()
	if h.orig != nil {
		if e := h.orig.Close(); err == nil {
			err = e
		}
	}
	return err
}

// hashStrings returns the hex SHA-256 of the NUL-separated parts.
func hashStrings(parts ...string) string {
	hs := sha256.New()
	for _, p := range parts {
		io.WriteString(hs, p)
		hs.Write([]byte{0})
	}
	return hex.EncodeToString(hs.Sum(nil))
}

// fileEntry is a file of a dataset.
type fileEntry struct {
	path string // as opened
	rel  string // relative to the dataset root, slash-separated
	size int64
}

// matchExt reports whether name ends with one of exts (case-insensitive);
// "*" matches every name.
func matchExt(name string, exts []string) bool {
	lower := strings.ToLower(name)
	for _, e := range exts {
		if e == "*" || strings.HasSuffix(lower, strings.ToLower(e)) {
			return true
		}
	}
	return false
}

// listFiles returns the regular files of a dataset path: the path itself
// when it is a file (whatever its extension), or the files under it whose
// names match exts, walked recursively in lexical order. Hidden files and
// folders (names starting with ".") and folders named in skipDirs are
// skipped. Symbolic links to files are followed.
func listFiles(root string, exts []string, skipDirs []string) ([]fileEntry, error) {
	fi, err := os.Stat(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("data: dataset path %q does not exist: %w", root, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("data: dataset path %q: %w", root, err)
	}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("data: dataset path %q is not a regular file or a folder", root)
		}
		return []fileEntry{{path: root, rel: filepath.Base(root), size: fi.Size()}}, nil
	}
	var files []fileEntry
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("data: reading dataset folder: %w", err)
		}
		name := d.Name()
		if path != root && strings.HasPrefix(name, ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			for _, s := range skipDirs {
				if name == s && path != root {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !matchExt(name, exts) {
			return nil
		}
		info, err := os.Stat(path) // follows symbolic links
		if err != nil {
			return fmt.Errorf("data: dataset file %q: %w", path, err)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		files = append(files, fileEntry{path: path, rel: filepath.ToSlash(rel), size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	// WalkDir is lexical per folder; sort the full relative paths so the
	// order does not depend on the walk's folder-before-sibling rule.
	sort.Slice(files, func(i, j int) bool { return files[i].rel < files[j].rel })
	return files, nil
}

// checkReadable opens and closes every file, so that unreadable files are
// reported when the dataset is opened rather than in the middle of training.
func checkReadable(files []fileEntry) error {
	for _, f := range files {
		fh, err := os.Open(f.path)
		if err != nil {
			return fmt.Errorf("data: dataset file is unreadable: %w", err)
		}
		fh.Close()
	}
	return nil
}
