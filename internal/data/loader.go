package data

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Encoder turns text into token ids; *tokenizer.BPE and the byte tokenizer
// satisfy it. BOS and EOS return the ids wrapped around every document, or
// a negative number for none.
type Encoder interface {
	Encode(text string) []int
	BOS() int
	EOS() int
}

// Dataset kinds accepted in Config.Kind.
const (
	KindText   = "text"   // plain text files
	KindJSONL  = "jsonl"  // JSON lines with a text field
	KindTokens = "tokens" // pre-tokenized TITANTOK files
	KindGoSrc  = "gosrc"  // the Go source tree, see GoSourceCorpus
)

// Config describes a dataset and how to batch it.
type Config struct {
	// Kind is one of KindText, KindJSONL, KindTokens, KindGoSrc, or empty to
	// detect it from Path with DetectKind.
	Kind string
	// Path is a file or a folder; unused for KindGoSrc.
	Path string
	// TextField is the JSON field holding the text (jsonl; default "text").
	TextField string
	// Extensions filters the files of a folder by name ending ("*": all);
	// the default depends on the kind. A Path naming a file is always read.
	Extensions []string

	// SeqLen is the number of tokens in a row (T); each row consumes
	// SeqLen+1 tokens of the stream.
	SeqLen int
	// BatchSize is the GLOBAL number of rows per step (B), i.e. the local
	// batch size times the data-parallel degree.
	BatchSize int
	// Seed draws the shard order of every epoch.
	Seed uint64
	// NoShuffle visits the shards in their natural order in every epoch.
	NoShuffle bool

	// DocBytes is the size above which text files are split into several
	// documents (default DefaultDocBytes).
	DocBytes int
	// BlockLines is the number of lines per jsonl shard (default
	// DefaultBlockLines).
	BlockLines int
	// BlockTokens is the number of tokens per token-file shard (default
	// DefaultBlockTokens).
	BlockTokens int

	// HoldOut, when >= 2, splits off every HoldOut-th shard for validation
	// (see HoldOut); Validation selects the held-out part instead of the
	// rest.
	HoldOut    int
	Validation bool

	// VocabSize, when > 0, is the model's vocabulary size: Open rejects a
	// token file with a larger vocabulary and Next rejects any token id
	// outside [0, VocabSize).
	VocabSize int
}

// DetectKind guesses the kind of the dataset at path: KindJSONL for a
// .jsonl/.json/.ndjson file (optionally .gz) or a folder holding one,
// KindTokens for a file starting with the token-file magic or a folder
// holding one with a token extension, KindText otherwise. It returns "" if
// path does not exist.
func DetectKind(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	fileKind := func(p string) string {
		if matchExt(p, DefaultJSONLExtensions) {
			return KindJSONL
		}
		if hasTokenMagic(p) {
			return KindTokens
		}
		return KindText
	}
	if !fi.IsDir() {
		return fileKind(path)
	}
	kind := KindText
	filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if p != path && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if matchExt(p, DefaultJSONLExtensions) {
			kind = KindJSONL
			return filepath.SkipAll
		}
		if matchExt(p, DefaultTokenExtensions) && hasTokenMagic(p) {
			kind = KindTokens
			return filepath.SkipAll
		}
		return nil
	})
	return kind
}

// OpenSource opens the Source described by the dataset fields of cfg (Kind,
// Path, TextField, Extensions, DocBytes, BlockLines, BlockTokens, HoldOut,
// Validation).
func OpenSource(cfg Config) (Source, error) {
	kind := cfg.Kind
	if kind != KindGoSrc {
		if cfg.Path == "" {
			return nil, errors.New("data: no dataset path given")
		}
		if _, err := os.Stat(cfg.Path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("data: dataset path %q does not exist: %w", cfg.Path, fs.ErrNotExist)
		}
	}
	if kind == "" {
		kind = DetectKind(cfg.Path)
	}
	var (
		src Source
		err error
	)
	switch kind {
	case KindText:
		src, err = NewTextSource(cfg.Path, cfg.Extensions, cfg.DocBytes)
	case KindJSONL:
		src, err = NewJSONLSource(cfg.Path, cfg.TextField, cfg.Extensions, cfg.BlockLines)
	case KindTokens:
		src, err = NewTokenSource(cfg.Path, cfg.Extensions, cfg.BlockTokens)
	case KindGoSrc:
		src, err = GoSourceCorpus()
	default:
		return nil, fmt.Errorf("data: unknown dataset kind %q (want %s, %s, %s or %s)", kind, KindText, KindJSONL, KindTokens, KindGoSrc)
	}
	if err != nil {
		return nil, err
	}
	if cfg.VocabSize > 0 {
		if err := CheckVocab(src, cfg.VocabSize); err != nil {
			src.Close()
			return nil, err
		}
	}
	if cfg.HoldOut != 0 {
		split, err := HoldOut(src, cfg.HoldOut, cfg.Validation)
		if err != nil {
			src.Close()
			return nil, err
		}
		src = split
	} else if cfg.Validation {
		src.Close()
		return nil, errors.New("data: Validation needs HoldOut >= 2 (or open the validation data as its own dataset)")
	}
	return src, nil
}

// CheckVocab returns an error when src is a pre-tokenized source whose
// vocabulary exceeds modelVocab. Text sources always pass: their ids come
// from the encoder.
func CheckVocab(src Source, modelVocab int) error {
	if h, ok := src.(*holdOut); ok {
		src = h.src
	}
	if ts, ok := src.(*tokenSource); ok {
		return ts.CheckVocab(modelVocab)
	}
	return nil
}

// Batch is a global batch: B rows of T tokens, row-major.
type Batch struct {
	Inputs []int32 // B×T input ids
	Labels []int32 // B×T target ids: Labels[r*T+t] follows Inputs[r*T+t]
	B, T   int
}

// Shard returns the rows [rank*B/n, (rank+1)*B/n) of the batch, the part of
// data-parallel rank of n. The result shares memory with b.
func (b Batch) Shard(rank, n int) (Batch, error) {
	if n <= 0 || rank < 0 || rank >= n {
		return Batch{}, fmt.Errorf("data: bad batch shard %d of %d", rank, n)
	}
	if b.B%n != 0 {
		return Batch{}, fmt.Errorf("data: global batch size %d is not divisible by %d ranks", b.B, n)
	}
	rows := b.B / n
	lo, hi := rank*rows*b.T, (rank+1)*rows*b.T
	return Batch{Inputs: b.Inputs[lo:hi:hi], Labels: b.Labels[lo:hi:hi], B: rows, T: b.T}, nil
}

// Loader packs the documents of a Source into batches. See the package
// documentation. A Loader is not safe for concurrent use.
type Loader struct {
	cfg    Config
	src    Source
	enc    Encoder
	stream *Stream
	fp     string

	buf []int32 // stream tokens not yet in a batch: buf[off:]
	off int

	steps          int64
	docs           int64
	lastTokenEpoch int
	err            error // sticky error from Next
	closeSrc       bool
}

// Open opens the dataset described by cfg and returns a Loader over it. enc
// may be nil only for KindTokens.
func Open(cfg Config, enc Encoder) (*Loader, error) {
	if err := checkBatchConfig(cfg); err != nil {
		return nil, err
	}
	src, err := OpenSource(cfg)
	if err != nil {
		return nil, err
	}
	if enc == nil && !isTokenSource(src) {
		src.Close()
		return nil, fmt.Errorf("data: %s needs a tokenizer (nil Encoder)", src.Name())
	}
	l, err := NewLoader(src, enc, cfg)
	if err != nil {
		src.Close()
		return nil, err
	}
	l.closeSrc = true
	return l, nil
}

// isTokenSource reports whether s (or the source it splits) is pre-tokenized.
func isTokenSource(s Source) bool {
	if h, ok := s.(*holdOut); ok {
		s = h.src
	}
	_, ok := s.(*tokenSource)
	return ok
}

func checkBatchConfig(cfg Config) error {
	if cfg.SeqLen <= 0 {
		return fmt.Errorf("data: SeqLen must be positive, got %d", cfg.SeqLen)
	}
	if cfg.BatchSize <= 0 {
		return fmt.Errorf("data: BatchSize must be positive, got %d", cfg.BatchSize)
	}
	return nil
}

// NewLoader returns a Loader over an already opened src, using the batching
// fields of cfg (SeqLen, BatchSize, Seed, NoShuffle, VocabSize). The Loader
// does not close src. enc may be nil if src yields only pre-tokenized
// documents.
func NewLoader(src Source, enc Encoder, cfg Config) (*Loader, error) {
	if err := checkBatchConfig(cfg); err != nil {
		return nil, err
	}
	if src.NumShards() == 0 {
		return nil, fmt.Errorf("data: %s has no documents: %w", src.Name(), ErrEmpty)
	}
	l := &Loader{
		cfg:    cfg,
		src:    src,
		enc:    enc,
		stream: NewStream(src, cfg.Seed, !cfg.NoShuffle),
	}
	l.fp = hashStrings("titan-data-loader-v1", src.Fingerprint(), fmt.Sprint(cfg.SeqLen),
		fmt.Sprint(!cfg.NoShuffle), encoderFingerprint(enc))
	return l, nil
}

// encoderProbe is encoded to tell tokenizers apart in state fingerprints.
const encoderProbe = "The quick brown fox, 1234567890! func main() { fmt.Println(\"héllo, 世界\") }\n\tend."

func encoderFingerprint(enc Encoder) string {
	if enc == nil {
		return "no-encoder"
	}
	ids := enc.Encode(encoderProbe)
	parts := []string{fmt.Sprint(enc.BOS()), fmt.Sprint(enc.EOS()), fmt.Sprint(ids)}
	return hashStrings(parts...)
}

// Source returns the loader's source.
func (l *Loader) Source() Source { return l.src }

// Config returns the configuration the loader was made with.
func (l *Loader) Config() Config { return l.cfg }

// Epoch returns the epoch of the stream position: how many times the
// dataset has been read in full.
func (l *Loader) Epoch() int { return l.stream.Position().Epoch }

// Steps returns the number of batches returned by Next since the start
// (counted across State/Restore).
func (l *Loader) Steps() int64 { return l.steps }

// Documents returns the number of documents read since the start (counted
// across State/Restore).
func (l *Loader) Documents() int64 { return l.docs }

// Close releases the loader's resources, and its source if it was made by
// Open.
func (l *Loader) Close() error {
	err := l.stream.Close()
	if l.closeSrc {
		if cerr := l.src.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// Next returns the global batch of the next step. After an error the
// loader stays failed until Reset or Restore.
func (l *Loader) Next() (Batch, error) {
	if l.err != nil {
		return Batch{}, l.err
	}
	B, T := l.cfg.BatchSize, l.cfg.SeqLen
	b := Batch{Inputs: make([]int32, B*T), Labels: make([]int32, B*T), B: B, T: T}
	for r := range B {
		for len(l.buf)-l.off < T+1 {
			if err := l.fill(); err != nil {
				l.err = err
				return Batch{}, err
			}
		}
		w := l.buf[l.off : l.off+T+1]
		if v := l.cfg.VocabSize; v > 0 {
			for _, id := range w {
				if id < 0 || int(id) >= v {
					l.err = fmt.Errorf("data: token id %d is outside the model vocabulary [0, %d)", id, v)
					return Batch{}, l.err
				}
			}
		}
		copy(b.Inputs[r*T:], w[:T])
		copy(b.Labels[r*T:], w[1:])
		l.off += T + 1
	}
	l.steps++
	return b, nil
}

// fill appends the tokens of the next non-empty document to the buffer.
func (l *Loader) fill() error {
	if l.off > 0 {
		n := copy(l.buf, l.buf[l.off:])
		l.buf = l.buf[:n]
		l.off = 0
	}
	for {
		doc, err := l.stream.Next()
		if err != nil {
			return err
		}
		l.docs++
		n0 := len(l.buf)
		if l.buf, err = appendDoc(l.buf, doc, l.enc); err != nil {
			return fmt.Errorf("data: %s: %w", l.src.Name(), err)
		}
		epoch := l.stream.Position().Epoch
		if len(l.buf) > n0 {
			l.lastTokenEpoch = epoch
			return nil
		}
		if epoch >= l.lastTokenEpoch+2 {
			return fmt.Errorf("data: %s yields no tokens: %w", l.src.Name(), ErrEmpty)
		}
	}
}

// Reset rewinds the loader to the start of epoch 0, as freshly opened.
func (l *Loader) Reset() error {
	return l.setState(Position{}, nil, 0, 0)
}

func (l *Loader) setState(p Position, buf []int32, steps, docs int64) error {
	if err := l.stream.Seek(p); err != nil {
		return err
	}
	l.buf = append(l.buf[:0], buf...)
	l.off = 0
	l.steps, l.docs = steps, docs
	l.lastTokenEpoch = p.Epoch
	l.err = nil
	return nil
}

// stateVersion is the version of the State encoding.
const stateVersion = 1

// loaderState is the JSON form of a Loader's state.
type loaderState struct {
	Version     int      `json:"version"`
	Dataset     string   `json:"dataset"`
	Fingerprint string   `json:"fingerprint"`
	Seed        uint64   `json:"seed"`
	SeqLen      int      `json:"seq_len"`
	Position    Position `json:"position"`
	Steps       int64    `json:"steps"`
	Documents   int64    `json:"documents"`
	// Leftover holds the tokens read but not yet batched, each a signed
	// varint (encoding/binary), base64 in JSON.
	Leftover []byte `json:"leftover"`
}

// State returns the loader's state as JSON: the stream position, the seed,
// the leftover tokens and counters, with the dataset's fingerprint. A loader
// opened with the same configuration and given the state by Restore yields
// exactly the batches this one would yield next. The batch size may differ
// between the two: the stream is consumed row by row.
func (l *Loader) State() ([]byte, error) {
	if l.err != nil {
		return nil, fmt.Errorf("data: no state for a failed loader: %w", l.err)
	}
	left := l.buf[l.off:]
	lb := make([]byte, 0, 2*len(left))
	for _, t := range left {
		lb = binary.AppendVarint(lb, int64(t))
	}
	return json.Marshal(loaderState{
		Version:     stateVersion,
		Dataset:     l.src.Name(),
		Fingerprint: l.fp,
		Seed:        l.cfg.Seed,
		SeqLen:      l.cfg.SeqLen,
		Position:    l.stream.Position(),
		Steps:       l.steps,
		Documents:   l.docs,
		Leftover:    lb,
	})
}

// OtherDataError is a loader state that is intact but was saved for
// other data than the loader reads: another dataset, split, tokenizer,
// sequence length or seed.
type OtherDataError struct{ Msg string }

func (e *OtherDataError) Error() string { return "data: " + e.Msg }

// Restore sets the loader to a state returned by State. It fails, leaving
// the loader unchanged, if the state is malformed, of another version, or
// was saved for another dataset, sequence length, seed or tokenizer.
func (l *Loader) Restore(state []byte) error {
	var s loaderState
	if err := json.Unmarshal(state, &s); err != nil {
		return fmt.Errorf("data: malformed loader state: %w", err)
	}
	switch {
	case s.Version != stateVersion:
		return fmt.Errorf("data: loader state version %d, this build reads version %d", s.Version, stateVersion)
	case s.SeqLen != l.cfg.SeqLen:
		return &OtherDataError{fmt.Sprintf("loader state was saved with seq_len %d, the loader has seq_len %d", s.SeqLen, l.cfg.SeqLen)}
	case s.Fingerprint != l.fp:
		return &OtherDataError{fmt.Sprintf("loader state belongs to another dataset: saved for %s, this loader reads %s (fingerprints differ: files, sizes, split, shuffling or tokenizer changed)", s.Dataset, l.src.Name())}
	case s.Seed != l.cfg.Seed:
		return &OtherDataError{fmt.Sprintf("loader state was saved with seed %d, the loader has seed %d", s.Seed, l.cfg.Seed)}
	case s.Steps < 0 || s.Documents < 0:
		return errors.New("data: malformed loader state: negative counters")
	}
	var buf []int32
	for b := s.Leftover; len(b) > 0; {
		v, n := binary.Varint(b)
		if n <= 0 || v != int64(int32(v)) {
			return errors.New("data: malformed loader state: bad leftover tokens")
		}
		buf = append(buf, int32(v))
		b = b[n:]
	}
	return l.setState(s.Position, buf, s.Steps, s.Documents)
}

// Pretokenize encodes every document of src once, in natural shard order,
// as [BOS] tokens [EOS], and writes the stream to a token file at path (see
// WriteTokens) declaring vocabSize and enc's EOS. It returns the number of
// tokens written. A Loader over the file (KindTokens) then skips
// tokenization.
func Pretokenize(src Source, enc Encoder, path string, vocabSize int) (int64, error) {
	if enc == nil {
		return 0, fmt.Errorf("data: Pretokenize %s: nil Encoder", src.Name())
	}
	w, err := CreateTokens(path, vocabSize, enc.EOS())
	if err != nil {
		return 0, err
	}
	var toks []int32
	for i := range src.NumShards() {
		r, err := src.OpenShard(i, 0)
		if err != nil {
			w.Abort()
			return 0, err
		}
		for {
			doc, err := r.Next()
			if err != nil {
				r.Close()
				if err == io.EOF {
					break
				}
				w.Abort()
				return 0, err
			}
			if toks, err = appendDoc(toks[:0], doc, enc); err != nil {
				r.Close()
				w.Abort()
				return 0, err
			}
			if err := w.Write(toks); err != nil {
				r.Close()
				w.Abort()
				return 0, fmt.Errorf("%w (document %s)", err, doc.Origin)
			}
		}
	}
	n := w.Count()
	return n, w.Close()
}

// appendDoc appends the tokens of doc to dst: pre-tokenized documents as they
// are, non-empty text documents encoded and wrapped as [BOS] ids [EOS].
func appendDoc(dst []int32, doc Document, enc Encoder) ([]int32, error) {
	if doc.Tokens != nil {
		return append(dst, doc.Tokens...), nil
	}
	if doc.Text == "" {
		return dst, nil
	}
	if enc == nil {
		return dst, fmt.Errorf("document %s is text but there is no tokenizer", doc.Origin)
	}
	if id := enc.BOS(); id >= 0 {
		dst = append(dst, int32(id))
	}
	for _, id := range enc.Encode(doc.Text) {
		dst = append(dst, int32(id))
	}
	if id := enc.EOS(); id >= 0 {
		dst = append(dst, int32(id))
	}
	return dst, nil
}
