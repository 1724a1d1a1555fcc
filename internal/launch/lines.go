package launch

import (
	"bytes"
	"io"
	"sync"
)

// maxLine is the longest line a prefixWriter holds back; a longer run of
// bytes without a newline goes out as a line of its own.
const maxLine = 64 << 10

// syncWriter serializes writes to one output shared by several workers'
// streams, so that lines never interleave.
type syncWriter struct {
	mu  sync.Mutex
	out io.Writer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(p)
}

// prefixWriter writes each complete line given to it to out, prefixed. It
// is one worker stream's os/exec Stdout or Stderr. Write errors of out are
// dropped: a broken log sink must not kill a training worker.
type prefixWriter struct {
	mu     sync.Mutex
	out    io.Writer // a *syncWriter
	prefix []byte
	buf    []byte // an incomplete line
	line   []byte // scratch for prefix + line
}

func newPrefixWriter(out io.Writer, prefix string) *prefixWriter {
	return &prefixWriter{out: out, prefix: []byte(prefix)}
}

// Write implements io.Writer; it always consumes all of p.
func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf = append(w.buf, p...)
			if len(w.buf) >= maxLine {
				w.emit(w.buf)
				w.buf = w.buf[:0]
			}
			break
		}
		if len(w.buf) > 0 {
			w.buf = append(w.buf, p[:i]...)
			w.emit(w.buf)
			w.buf = w.buf[:0]
		} else {
			w.emit(p[:i])
		}
		p = p[i+1:]
	}
	return n, nil
}

// Flush writes an incomplete last line, with a newline added.
func (w *prefixWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.emit(w.buf)
		w.buf = w.buf[:0]
	}
}

// emit writes prefix + line + "\n" in one Write.
func (w *prefixWriter) emit(line []byte) {
	w.line = append(append(append(w.line[:0], w.prefix...), line...), '\n')
	w.out.Write(w.line) //nolint:errcheck // see the type comment
}
