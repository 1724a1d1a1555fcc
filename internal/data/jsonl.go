package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// DefaultBlockLines is the number of lines in a shard of a jsonl source.
const DefaultBlockLines = 256

// DefaultJSONLExtensions are the file name endings a jsonl folder is
// filtered by when none are given.
var DefaultJSONLExtensions = []string{".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz"}

// DefaultTextField is the JSON field holding a document's text (C4 style).
const DefaultTextField = "text"

// jsonlSource is a Source of JSON-lines files, one shard per block of lines.
type jsonlSource struct {
	name   string
	field  string
	block  int
	files  []jsonlFile
	shards []jsonlShard
	fp     string
}

type jsonlFile struct {
	fileEntry
	gz bool
}

// jsonlShard is a block of lines of one file: lines [line, line+count) (0-based)
// starting at byte offset off. A gzip file is one shard of unknown length
// (count < 0).
type jsonlShard struct {
	file  int
	off   int64
	line  int
	count int
}

// NewJSONLSource returns a Source over the JSON-lines file at path, or over
// the files under the folder at path whose names end with one of exts
// (default DefaultJSONLExtensions), in lexical order. Each line is a JSON
// object whose string field named field (default DefaultTextField) is one
// document; blank lines, empty texts and null fields give empty documents,
// which the Loader skips. Lines are parsed when read; a malformed line is an
// error naming the file and line number.
//
// Opening scans every uncompressed file once to index the byte offset of
// every blockLines-th line (default DefaultBlockLines); memory stays
// proportional to the number of blocks, never to the data. Files ending in
// .gz are decompressed as they are read and are each one shard.
func NewJSONLSource(path, field string, exts []string, blockLines int) (Source, error) {
	if field == "" {
		field = DefaultTextField
	}
	if len(exts) == 0 {
		exts = DefaultJSONLExtensions
	}
	if blockLines == 0 {
		blockLines = DefaultBlockLines
	}
	if blockLines < 0 {
		return nil, fmt.Errorf("data: BlockLines must be positive, got %d", blockLines)
	}
	entries, err := listFiles(path, exts, nil)
	if err != nil {
		return nil, err
	}
	s := &jsonlSource{field: field, block: blockLines}
	parts := []string{"jsonl", field, fmt.Sprint(blockLines)}
	for _, e := range entries {
		if e.size == 0 {
			continue
		}
		fi := len(s.files)
		f := jsonlFile{fileEntry: e, gz: strings.HasSuffix(strings.ToLower(e.path), ".gz")}
		s.files = append(s.files, f)
		parts = append(parts, e.rel, fmt.Sprint(e.size))
		if f.gz {
			fh, err := os.Open(e.path)
			if err != nil {
				return nil, fmt.Errorf("data: dataset file is unreadable: %w", err)
			}
			fh.Close()
			s.shards = append(s.shards, jsonlShard{file: fi, count: -1})
			continue
		}
		if err := s.index(fi); err != nil {
			return nil, err
		}
	}
	s.name = fmt.Sprintf("jsonl %q (%d files)", path, len(s.files))
	if len(s.shards) == 0 {
		return nil, fmt.Errorf("data: %s has no documents (no non-empty files ending in %v): %w", s.name, exts, ErrEmpty)
	}
	s.fp = hashStrings(parts...)
	return s, nil
}

// index scans file fi and appends its blocks to s.shards.
func (s *jsonlSource) index(fi int) error {
	f := s.files[fi]
	fh, err := os.Open(f.path)
	if err != nil {
		return fmt.Errorf("data: dataset file is unreadable: %w", err)
	}
	defer fh.Close()
	buf := make([]byte, 1<<20)
	var (
		off       int64 // file offset of buf[0]
		lines     int   // complete lines seen
		lineStart int64 // offset of the current (incomplete) line
		blockOff  int64
	)
	for {
		n, err := fh.Read(buf)
		for i := 0; i < n; {
			j := bytes.IndexByte(buf[i:n], '\n')
			if j < 0 {
				break
			}
			i += j + 1
			lines++
			lineStart = off + int64(i)
			if lines%s.block == 0 {
				s.shards = append(s.shards, jsonlShard{file: fi, off: blockOff, line: lines - s.block, count: s.block})
				blockOff = lineStart
			}
		}
		off += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("data: reading %q: %w", f.path, err)
		}
	}
	if lineStart < off { // a last line without a newline
		lines++
		if lines%s.block == 0 {
			s.shards = append(s.shards, jsonlShard{file: fi, off: blockOff, line: lines - s.block, count: s.block})
		}
	}
	if rest := lines % s.block; rest > 0 {
		s.shards = append(s.shards, jsonlShard{file: fi, off: blockOff, line: lines - rest, count: rest})
	}
	return nil
}

func (s *jsonlSource) Name() string        { return s.name }
func (s *jsonlSource) NumShards() int      { return len(s.shards) }
func (s *jsonlSource) Fingerprint() string { return s.fp }
func (s *jsonlSource) Close() error        { return nil }

func (s *jsonlSource) OpenShard(i, skip int) (DocReader, error) {
	if i < 0 || i >= len(s.shards) {
		return nil, fmt.Errorf("data: shard %d out of range [0, %d) of %s", i, len(s.shards), s.name)
	}
	sh := s.shards[i]
	f := s.files[sh.file]
	fh, err := os.Open(f.path)
	if err != nil {
		return nil, fmt.Errorf("data: reading %s: %w", s.name, err)
	}
	r := &jsonlReader{s: s, fh: fh, path: f.path, line: sh.line, left: sh.count}
	if f.gz {
		zr, err := gzip.NewReader(bufio.NewReaderSize(fh, 1<<16))
		if err != nil {
			fh.Close()
			return nil, fmt.Errorf("data: reading %q: %w", f.path, err)
		}
		r.zr = zr
		r.br = bufio.NewReaderSize(zr, 1<<16)
	} else {
		if _, err := fh.Seek(sh.off, io.SeekStart); err != nil {
			fh.Close()
			return nil, fmt.Errorf("data: reading %q: %w", f.path, err)
		}
		r.br = bufio.NewReaderSize(fh, 1<<16)
	}
	for k := range skip {
		if _, err := r.readLine(); err != nil {
			r.Close()
			if err == io.EOF {
				return nil, fmt.Errorf("data: cannot skip %d documents from %q line %d: the file ended after %d (changed since the state was saved?)", skip, f.path, sh.line+1, k)
			}
			return nil, err
		}
	}
	return r, nil
}

// jsonlReader yields the lines of a block as documents.
type jsonlReader struct {
	s    *jsonlSource
	fh   *os.File
	zr   *gzip.Reader
	br   *bufio.Reader
	path string
	line int // 0-based number of the next line
	left int // lines left in the block; < 0 for a whole (gzip) file
	tmp  []byte
}

// readLine returns the next line of the block without its line ending.
func (r *jsonlReader) readLine() ([]byte, error) {
	if r.left == 0 {
		return nil, io.EOF
	}
	r.tmp = r.tmp[:0]
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.tmp = append(r.tmp, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF && len(r.tmp) > 0 {
			break
		}
		if err != nil {
			if err == io.EOF && r.left > 0 {
				return nil, fmt.Errorf("data: %q ended before line %d (changed since the dataset was opened?): %w", r.path, r.line+1, io.ErrUnexpectedEOF)
			}
			if err != io.EOF {
				err = fmt.Errorf("data: reading %q line %d: %w", r.path, r.line+1, err)
			}
			return nil, err
		}
		break
	}
	r.line++
	if r.left > 0 {
		r.left--
	}
	return bytes.TrimRight(r.tmp, "\r\n"), nil
}

func (r *jsonlReader) Next() (Document, error) {
	line, err := r.readLine()
	if err != nil {
		return Document{}, err
	}
	origin := fmt.Sprintf("%s:%d", r.path, r.line)
	text, err := textField(line, r.s.field)
	if err != nil {
		return Document{}, fmt.Errorf("data: %s: %w", origin, err)
	}
	return Document{Text: text, Origin: origin}, nil
}

func (r *jsonlReader) Close() error {
	if r.zr != nil {
		r.zr.Close()
	}
	return r.fh.Close()
}

// textField extracts the string field of a JSON object line. A blank line
// or a null field gives "".
func textField(line []byte, field string) (string, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return "", nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		return "", fmt.Errorf("malformed JSON line: %w", err)
	}
	if obj == nil {
		return "", fmt.Errorf("line is not a JSON object")
	}
	raw, ok := obj[field]
	if !ok {
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return "", fmt.Errorf("no %q field (fields: %s)", field, strings.Join(keys, ", "))
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return "", fmt.Errorf("field %q is not a string", field)
	}
	return text, nil
}
