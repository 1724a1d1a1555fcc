// Package safetensors reads and writes the safetensors tensor format used
// by Hugging Face checkpoints, as float32 on titan's side.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes
// of JSON mapping each tensor name to its dtype, shape and byte range
// ("data_offsets", relative to the end of the header) plus an optional
// "__metadata__" object of string pairs, then the raw little-endian data.
//
// Reading goes through [os.File.ReadAt] in bounded chunks, so a tensor is
// converted straight into the caller's float32 slice and a multi-gigabyte
// file is never held in memory. F32, BF16, F16 and F64 tensors convert to
// float32; other dtypes are listed but cannot be read as floats.
//
// A checkpoint folder holds either one model.safetensors or several
// shards named by model.safetensors.index.json ({"weight_map": {tensor:
// file}}); [OpenDir] reads both and [WriteDir] writes both.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"

	"github.com/titan-go/titan/internal/numeric"
)

// DType is a safetensors element type, spelled as in the header ("F32").
type DType string

// The floating-point dtypes titan converts to and from float32.
const (
	F32  DType = "F32"
	BF16 DType = "BF16"
	F16  DType = "F16"
	F64  DType = "F64"
)

// elemSize is the byte width of every dtype the format defines.
var elemSize = map[DType]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
	"I16": 2, "U16": 2, F16: 2, BF16: 2,
	"I32": 4, "U32": 4, F32: 4,
	"I64": 8, "U64": 8, F64: 8,
}

// Size is the byte width of one element of d, or 0 for an unknown dtype.
func (d DType) Size() int { return int(elemSize[d]) }

// maxHeaderLen bounds the JSON header, as the reference implementation
// does, so that a corrupt length cannot make the reader allocate gigabytes.
const maxHeaderLen = 100 << 20

// chunkBytes is the size of the staging buffer used when converting.
const chunkBytes = 1 << 20

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
	// Begin and End are the tensor's byte range within the data section.
	Begin, End int64
}

// NumElements is the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() int {
	n := 1
	for _, s := range t.Shape {
		n *= s
	}
	return n
}

// File is an open safetensors file.
type File struct {
	path     string
	f        *os.File
	dataOff  int64 // file offset of the data section
	tensors  map[string]TensorInfo
	metadata map[string]string
}

// Open reads and validates the header of the safetensors file at path.
// The file stays open until Close; tensor data is read on demand.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	sf, err := parseHeader(path, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return sf, nil
}

type rawEntry struct {
	DType       DType   `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

func parseHeader(path string, f *os.File) (*File, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("safetensors: %s: %d bytes is too short for the header length", path, size)
	}
	var lenBuf [8]byte
	if _, err := f.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: %s: reading header length: %w", path, err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	switch {
	case n < 2 || n > maxHeaderLen:
		return nil, fmt.Errorf("safetensors: %s: header length %d out of range [2, %d]", path, n, maxHeaderLen)
	case int64(n) > size-8:
		return nil, fmt.Errorf("safetensors: %s: header length %d exceeds the %d bytes after it (file truncated?)", path, n, size-8)
	}
	hdr := make([]byte, n)
	if _, err := f.ReadAt(hdr, 8); err != nil {
		return nil, fmt.Errorf("safetensors: %s: reading header: %w", path, err)
	}
	if hdr[0] != '{' {
		return nil, fmt.Errorf("safetensors: %s: header does not start with a JSON object", path)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return nil, fmt.Errorf("safetensors: %s: malformed header JSON: %w", path, err)
	}
	sf := &File{path: path, f: f, dataOff: 8 + int64(n), tensors: make(map[string]TensorInfo, len(raw))}
	dataLen := size - sf.dataOff
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &sf.metadata); err != nil {
				return nil, fmt.Errorf("safetensors: %s: __metadata__ must map strings to strings: %w", path, err)
			}
			continue
		}
		var e rawEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: malformed entry: %w", path, name, err)
		}
		ti, err := checkEntry(name, e, dataLen)
		if err != nil {
			return nil, fmt.Errorf("safetensors: %s: %w", path, err)
		}
		sf.tensors[name] = ti
	}
	// Tensors may appear in any order but must not share bytes.
	infos := make([]TensorInfo, 0, len(sf.tensors))
	for _, ti := range sf.tensors {
		if ti.End > ti.Begin {
			infos = append(infos, ti)
		}
	}
	sort.Slice(infos, func(i, j int) bool {
		if infos[i].Begin != infos[j].Begin {
			return infos[i].Begin < infos[j].Begin
		}
		return infos[i].Name < infos[j].Name
	})
	for i := 1; i < len(infos); i++ {
		a, b := infos[i-1], infos[i]
		if b.Begin < a.End {
			return nil, fmt.Errorf("safetensors: %s: tensor %q bytes [%d, %d) overlap tensor %q bytes [%d, %d)", path, b.Name, b.Begin, b.End, a.Name, a.Begin, a.End)
		}
	}
	return sf, nil
}

// checkEntry validates one header entry against the data section length.
func checkEntry(name string, e rawEntry, dataLen int64) (TensorInfo, error) {
	es, ok := elemSize[e.DType]
	if !ok {
		return TensorInfo{}, fmt.Errorf("tensor %q: unknown dtype %q", name, e.DType)
	}
	if len(e.DataOffsets) != 2 {
		return TensorInfo{}, fmt.Errorf("tensor %q: data_offsets has %d values, want 2", name, len(e.DataOffsets))
	}
	begin, end := e.DataOffsets[0], e.DataOffsets[1]
	if begin < 0 || end < begin {
		return TensorInfo{}, fmt.Errorf("tensor %q: invalid data_offsets [%d, %d]", name, begin, end)
	}
	if end > dataLen {
		return TensorInfo{}, fmt.Errorf("tensor %q: data_offsets [%d, %d] run past the %d-byte data section (file truncated?)", name, begin, end, dataLen)
	}
	shape := make([]int, len(e.Shape))
	bytes := es
	for i, s := range e.Shape {
		if s < 0 {
			return TensorInfo{}, fmt.Errorf("tensor %q: negative dimension in shape %v", name, e.Shape)
		}
		if s != 0 && bytes > math.MaxInt64/s {
			return TensorInfo{}, fmt.Errorf("tensor %q: shape %v overflows", name, e.Shape)
		}
		bytes *= s
		shape[i] = int(s)
	}
	if bytes != end-begin {
		return TensorInfo{}, fmt.Errorf("tensor %q: shape %v of %s needs %d bytes but data_offsets [%d, %d] hold %d", name, e.Shape, e.DType, bytes, begin, end, end-begin)
	}
	return TensorInfo{Name: name, DType: e.DType, Shape: shape, Begin: begin, End: end}, nil
}

// Path is the file's path as given to Open.
func (f *File) Path() string { return f.path }

// Names lists the tensor names, sorted.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.tensors))
	for n := range f.tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Info describes the named tensor.
func (f *File) Info(name string) (TensorInfo, bool) {
	ti, ok := f.tensors[name]
	return ti, ok
}

// Metadata is the header's "__metadata__" object (nil when absent).
func (f *File) Metadata() map[string]string { return f.metadata }

// ReadFloat32 converts the named tensor into dst, which must hold exactly
// its number of elements. F32, BF16, F16 and F64 are supported.
func (f *File) ReadFloat32(name string, dst []float32) error {
	ti, ok := f.tensors[name]
	if !ok {
		return fmt.Errorf("safetensors: %s: no tensor %q", f.path, name)
	}
	if n := ti.NumElements(); len(dst) != n {
		return fmt.Errorf("safetensors: %s: tensor %q has %d elements (shape %v), destination holds %d", f.path, name, n, ti.Shape, len(dst))
	}
	var conv func(dst []float32, src []byte)
	switch ti.DType {
	case F32:
		conv = decodeF32
	case BF16:
		conv = decodeBF16
	case F16:
		conv = decodeF16
	case F64:
		conv = decodeF64
	default:
		return fmt.Errorf("safetensors: %s: tensor %q has dtype %s, not a floating-point type", f.path, name, ti.DType)
	}
	es := int64(ti.DType.Size())
	buf := make([]byte, min(chunkBytes/es*es, ti.End-ti.Begin))
	for off := ti.Begin; off < ti.End; {
		b := buf[:min(int64(len(buf)), ti.End-off)]
		if _, err := f.f.ReadAt(b, f.dataOff+off); err != nil {
			return fmt.Errorf("safetensors: %s: reading tensor %q: %w", f.path, name, err)
		}
		i := (off - ti.Begin) / es
		conv(dst[i:i+int64(len(b))/es], b)
		off += int64(len(b))
	}
	return nil
}

// Close closes the underlying file.
func (f *File) Close() error { return f.f.Close() }

func decodeF32(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func decodeF64(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
	}
}

func decodeBF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = BF16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

func decodeF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// BF16ToFloat32 widens a bfloat16 bit pattern exactly
// (numeric.BF16ToFloat32).
func BF16ToFloat32(b uint16) float32 { return numeric.BF16ToFloat32(b) }

// Float32ToBF16 rounds x to the nearest bfloat16, ties to even
// (numeric.Float32ToBF16). Values beyond the largest bfloat16 round to
// infinity; NaNs stay NaN (quiet).
func Float32ToBF16(x float32) uint16 { return numeric.Float32ToBF16(x) }

// F16ToFloat32 widens an IEEE 754 half-precision bit pattern exactly.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal half: normalise into a float32 normal.
	e := uint32(127 - 15 + 1)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
}
