package testenv

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"testing"
)

// Ref is a TITANREF golden file (written by the PyTorch reference scripts
// in internal/model/*/testdata): an 8-byte magic "TITANREF", uint32
// version 1, uint32 header length H, H bytes of JSON {"config": {...},
// "tensors": [{"name", "dtype", "shape", "offset"}]}, then the raw
// little-endian tensors (offsets in bytes from the data's start).
type Ref struct {
	// Config is the header's config object, as written.
	Config json.RawMessage
	F32    map[string][]float32
	I32    map[string][]int32
	Shapes map[string][]int
}

// ReadRef reads the TITANREF file at path, failing tb on any defect.
func ReadRef(tb testing.TB, path string) *Ref {
	tb.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("reading golden file: %v (regenerate with make golden)", err)
	}
	if len(raw) < 16 || string(raw[:8]) != "TITANREF" {
		tb.Fatalf("%s: not a TITANREF file", path)
	}
	if v := binary.LittleEndian.Uint32(raw[8:]); v != 1 {
		tb.Fatalf("%s: version %d, want 1", path, v)
	}
	hl := int(binary.LittleEndian.Uint32(raw[12:]))
	if 16+hl > len(raw) {
		tb.Fatalf("%s: header of %d bytes in a file of %d", path, hl, len(raw))
	}
	var hdr struct {
		Config  json.RawMessage `json:"config"`
		Tensors []struct {
			Name, Dtype string
			Shape       []int
			Offset      int
		} `json:"tensors"`
	}
	if err := json.Unmarshal(raw[16:16+hl], &hdr); err != nil {
		tb.Fatalf("%s: header: %v", path, err)
	}
	r := &Ref{Config: hdr.Config, F32: map[string][]float32{}, I32: map[string][]int32{}, Shapes: map[string][]int{}}
	data := raw[16+hl:]
	for _, tn := range hdr.Tensors {
		n := 1
		for _, s := range tn.Shape {
			n *= s
		}
		if tn.Offset < 0 || tn.Offset+4*n > len(data) {
			tb.Fatalf("%s: tensor %s [%d, %d) outside the %d data bytes", path, tn.Name, tn.Offset, tn.Offset+4*n, len(data))
		}
		b := data[tn.Offset : tn.Offset+4*n]
		r.Shapes[tn.Name] = tn.Shape
		switch tn.Dtype {
		case "float32":
			v := make([]float32, n)
			for i := range v {
				v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
			r.F32[tn.Name] = v
		case "int32":
			v := make([]int32, n)
			for i := range v {
				v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
			}
			r.I32[tn.Name] = v
		default:
			tb.Fatalf("%s: tensor %s has dtype %s", path, tn.Name, tn.Dtype)
		}
	}
	return r
}
