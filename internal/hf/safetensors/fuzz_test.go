package safetensors

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpen feeds arbitrary bytes to Open as a safetensors file and reads
// every float tensor it accepts: nothing may panic, hang or allocate more
// than the file holds. The seeds run in the normal suite.
func FuzzOpen(f *testing.F) {
	dir := f.TempDir()
	specs := []Spec{{Name: "a", Shape: []int{2, 3}}, {Name: "b", Shape: []int{4}}}
	if _, err := WriteDir(dir, F32, specs, SliceSource([][]float32{{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10}}), 0, map[string]string{"format": "pt"}); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(dir, SingleFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:20])
	hdr := func(js string) []byte {
		b := make([]byte, 8, 8+len(js)+16)
		binary.LittleEndian.PutUint64(b, uint64(len(js)))
		return append(append(b, js...), make([]byte, 16)...)
	}
	f.Add(hdr(`{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}}`))
	f.Add(hdr(`{"x":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]},"y":{"dtype":"F16","shape":[2],"data_offsets":[8,12]}}`))
	f.Add(hdr(`{"__metadata__":{"a":1}}`))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{'})
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "f.safetensors")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sf, err := Open(p)
		if err != nil {
			return
		}
		defer sf.Close()
		for _, n := range sf.Names() {
			info, _ := sf.Info(n)
			if info.DType.Size() == 0 || info.End-info.Begin > int64(len(data)) {
				t.Fatalf("tensor %q: accepted %s bytes [%d, %d) of a %d-byte file", n, info.DType, info.Begin, info.End, len(data))
			}
			switch info.DType {
			case F32, BF16, F16, F64:
				_ = sf.ReadFloat32(n, make([]float32, info.NumElements()))
			}
		}
	})
}
