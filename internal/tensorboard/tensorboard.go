// Package tensorboard writes TensorBoard event files: scalar summaries,
// one Event per step, readable by TensorBoard and by any reader of the
// documented format.
//
// # Format
//
// An event file is a sequence of TFRecord records, each
//
//	uint64 length (little endian)
//	uint32 masked CRC-32C of the 8 length bytes
//	length bytes of data: one serialized tensorflow.Event protobuf
//	uint32 masked CRC-32C of the data
//
// where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. The Event
// messages use these fields of tensorflow/core/util/event.proto and
// summary.proto:
//
//	Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//	Summary { repeated Value value = 1; }
//	Value   { string tag = 1; float simple_value = 2; }
//
// The first record of a file is an Event with file_version
// "brain.Event:2"; each later record holds one step's scalars. The file
// is named events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, the name
// TensorBoard looks for in a log directory.
package tensorboard

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// FileVersion is the file_version of an event file's first record.
const FileVersion = "brain.Event:2"

// Scalar is one tagged value of a step.
type Scalar struct {
	Tag   string
	Value float32
}

// Writer appends events to one event file.
type Writer struct {
	f    *os.File
	path string
	buf  *bufio.Writer
	pb   []byte // scratch: the serialized Event
	rec  []byte // scratch: the framed record
}

var fileSeq atomic.Int64

// Create makes dir (and its parents) and starts a new event file in it.
func Create(dir string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tensorboard: %w", err)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	now := time.Now()
	name := fmt.Sprintf("events.out.tfevents.%d.%s.%d.%d", now.Unix(), host, os.Getpid(), fileSeq.Add(1)-1)
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("tensorboard: %w", err)
	}
	w := &Writer{f: f, path: f.Name(), buf: bufio.NewWriter(f)}
	w.pb = appendEventHeader(w.pb[:0], now, 0)
	w.pb = protowire.AppendTag(w.pb, 3, protowire.BytesType)
	w.pb = protowire.AppendString(w.pb, FileVersion)
	if err := w.write(); err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// Path is the event file's path.
func (w *Writer) Path() string { return w.path }

// Add writes one Event of step holding the scalars, stamped wall, and
// flushes it to the file (TensorBoard shows it while the run goes on).
func (w *Writer) Add(step int64, wall time.Time, scalars []Scalar) error {
	w.pb = appendEventHeader(w.pb[:0], wall, step)
	var sum []byte
	for _, s := range scalars {
		var v []byte
		v = protowire.AppendTag(v, 1, protowire.BytesType)
		v = protowire.AppendString(v, s.Tag)
		v = protowire.AppendTag(v, 2, protowire.Fixed32Type)
		v = protowire.AppendFixed32(v, math.Float32bits(s.Value))
		sum = protowire.AppendTag(sum, 1, protowire.BytesType)
		sum = protowire.AppendBytes(sum, v)
	}
	w.pb = protowire.AppendTag(w.pb, 5, protowire.BytesType)
	w.pb = protowire.AppendBytes(w.pb, sum)
	return w.write()
}

// Close flushes, syncs and closes the file.
func (w *Writer) Close() error {
	if w.f == nil {
		return nil
	}
	f := w.f
	w.f = nil
	err := w.buf.Flush()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("tensorboard: closing %s: %w", f.Name(), err)
	}
	return nil
}

func appendEventHeader(b []byte, wall time.Time, step int64) []byte {
	b = protowire.AppendTag(b, 1, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(WallTime(wall)))
	if step != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(step))
	}
	return b
}

// WallTime is t as an Event's wall_time: seconds since the Unix epoch.
func WallTime(t time.Time) float64 {
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}

// write frames w.pb as a TFRecord and flushes it.
func (w *Writer) write() error {
	w.rec = AppendRecord(w.rec[:0], w.pb)
	if _, err := w.buf.Write(w.rec); err != nil {
		return fmt.Errorf("tensorboard: writing %s: %w", w.f.Name(), err)
	}
	if err := w.buf.Flush(); err != nil {
		return fmt.Errorf("tensorboard: writing %s: %w", w.f.Name(), err)
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaskedCRC is TFRecord's masked CRC-32C of b.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + 0xa282ead8
}

// AppendRecord appends data framed as one TFRecord to b.
func AppendRecord(b, data []byte) []byte {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(data)))
	b = append(b, n[:]...)
	b = binary.LittleEndian.AppendUint32(b, MaskedCRC(n[:]))
	b = append(b, data...)
	return binary.LittleEndian.AppendUint32(b, MaskedCRC(data))
}
