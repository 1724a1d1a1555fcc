package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// refBF16 is an independent float32→bfloat16 rounding: of the two
// bfloat16 values that bracket x (by truncation), pick the one nearer in
// float64 arithmetic, ties to the even pattern. 0x7f80 (infinity) counts
// as 2^128 so that overflow follows round-to-nearest.
func refBF16(x float32) uint16 {
	if x != x {
		return uint16(math.Float32bits(x)>>16) | 0x40
	}
	lo := uint16(math.Float32bits(x) >> 16)
	if math.IsInf(float64(x), 0) {
		return lo
	}
	hi := lo + 1
	val := func(b uint16) float64 {
		if b&0x7fff == 0x7f80 {
			return math.Copysign(math.Ldexp(1, 128), float64(BF16ToFloat32(b)))
		}
		return float64(BF16ToFloat32(b))
	}
	dl, dh := math.Abs(float64(x)-val(lo)), math.Abs(float64(x)-val(hi))
	switch {
	case dl < dh:
		return lo
	case dh < dl:
		return hi
	case lo&1 == 0:
		return lo
	}
	return hi
}

// refF16 decodes a half-precision pattern by its defining formula.
func refF16(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e, m := int(h>>10)&0x1f, float64(h&0x3ff)
	switch {
	case e == 0x1f && m == 0:
		return sign * math.Inf(1)
	case e == 0x1f:
		return math.NaN()
	case e == 0:
		return sign * m / 1024 * math.Ldexp(1, -14)
	}
	return sign * (1 + m/1024) * math.Ldexp(1, e-15)
}

func TestFloat32ToBF16(t *testing.T) {
	specials := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1.00390625, 1.005859375, 1.01171875,
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-40,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.Float32frombits(0x3f808000), // exact tie, even below
		math.Float32frombits(0x3f818000), // exact tie, odd below
		math.Float32frombits(0x7f7f8000), // tie at the top: rounds to infinity
		math.Float32frombits(0x7f7f7fff), // just below: stays finite
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		specials = append(specials, math.Float32frombits(r.Uint32()))
	}
	for _, x := range specials {
		if got, want := Float32ToBF16(x), refBF16(x); got != want {
			t.Fatalf("Float32ToBF16(%g = %#08x) = %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
	}
}

func TestF16ToFloat32AllPatterns(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		got, want := float64(F16ToFloat32(uint16(h))), refF16(uint16(h))
		if math.IsNaN(want) {
			if !math.IsNaN(got) {
				t.Fatalf("F16ToFloat32(%#04x) = %g, want NaN", h, got)
			}
			continue
		}
		if got != want || math.Signbit(got) != math.Signbit(want) {
			t.Fatalf("F16ToFloat32(%#04x) = %g, want %g", h, got, want)
		}
	}
}

func randTensors(r *rand.Rand, specs []Spec) [][]float32 {
	data := make([][]float32, len(specs))
	for i, s := range specs {
		data[i] = make([]float32, s.NumElements())
		for j := range data[i] {
			data[i][j] = float32(r.NormFloat64())
		}
	}
	return data
}

var testSpecs = []Spec{
	{"embed", []int{7, 5}},
	{"scalar", nil},
	{"empty", []int{0, 3}},
	{"big", []int{300000}}, // spans several conversion chunks
	{"w.3", []int{2, 3, 4}},
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	data := randTensors(r, testSpecs)
	data[4][0], data[4][1], data[4][2] = float32(math.Inf(-1)), float32(math.Copysign(0, -1)), 3e38
	meta := map[string]string{"format": "pt", "note": `"quoted" <x>`}
	for _, dt := range []DType{F32, BF16} {
		t.Run(string(dt), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.safetensors")
			if err := WriteFile(path, dt, testSpecs, SliceSource(data), meta); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if n := binary.LittleEndian.Uint64(raw); n%8 != 0 {
				t.Errorf("header length %d is not a multiple of 8", n)
			}
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if !maps(f.Metadata(), meta) {
				t.Errorf("metadata %v, want %v", f.Metadata(), meta)
			}
			want := []string{"big", "embed", "empty", "scalar", "w.3"}
			if !slices.Equal(f.Names(), want) {
				t.Errorf("names %v, want %v", f.Names(), want)
			}
			for i, s := range testSpecs {
				ti, _ := f.Info(s.Name)
				if ti.DType != dt || !slices.Equal(ti.Shape, append([]int{}, s.Shape...)) {
					t.Errorf("%s: info %+v, want %s %v", s.Name, ti, dt, s.Shape)
				}
				got := make([]float32, s.NumElements())
				if err := f.ReadFloat32(s.Name, got); err != nil {
					t.Fatal(err)
				}
				for j, v := range data[i] {
					w := v
					if dt == BF16 {
						w = BF16ToFloat32(refBF16(v))
					}
					if math.Float32bits(got[j]) != math.Float32bits(w) {
						t.Fatalf("%s[%d] = %g, want %g (from %g)", s.Name, j, got[j], w, v)
					}
				}
			}
		})
	}
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// rawFile writes a safetensors file from a literal header and data.
func rawFile(t *testing.T, dir, name, hdr string, data []byte) string {
	t.Helper()
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	b = append(append(b, hdr...), data...)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadF16AndF64(t *testing.T) {
	dir := t.TempDir()
	var data []byte
	for h := 0; h < 1<<16; h++ {
		data = binary.LittleEndian.AppendUint16(data, uint16(h))
	}
	f64 := []float64{1.5, -2.25e-3, 1e300, math.Pi}
	for _, v := range f64 {
		data = binary.LittleEndian.AppendUint64(data, math.Float64bits(v))
	}
	hdr := `{"h":{"dtype":"F16","shape":[256,256],"data_offsets":[0,131072]},"d":{"dtype":"F64","shape":[4],"data_offsets":[131072,131104]}}`
	f, err := Open(rawFile(t, dir, "m.safetensors", hdr, data))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]float32, 1<<16)
	if err := f.ReadFloat32("h", got); err != nil {
		t.Fatal(err)
	}
	for h, v := range got {
		w := refF16(uint16(h))
		if !(float64(v) == w || math.IsNaN(w) && v != v) {
			t.Fatalf("h[%d] = %g, want %g", h, v, w)
		}
	}
	gd := make([]float32, 4)
	if err := f.ReadFloat32("d", gd); err != nil {
		t.Fatal(err)
	}
	for i, v := range f64 {
		if gd[i] != float32(v) {
			t.Errorf("d[%d] = %g, want %g", i, gd[i], float32(v))
		}
	}
}

func TestMalformed(t *testing.T) {
	ok := `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	eight := make([]byte, 8)
	tests := []struct {
		name  string
		raw   []byte // used when hdr is empty
		hdr   string
		data  []byte
		trunc int // bytes to cut from the end of a valid file
		want  []string
	}{
		{name: "short", raw: []byte{1, 2, 3}, want: []string{"too short"}},
		{name: "huge header length", raw: binary.LittleEndian.AppendUint64(nil, 1<<40), want: []string{"header length"}},
		{name: "header past end", raw: append(binary.LittleEndian.AppendUint64(nil, 100), "{}"...), want: []string{"header length 100", "truncated"}},
		{name: "not json", hdr: `{"a": nope}`, want: []string{"malformed header JSON"}},
		{name: "array", hdr: `[1, 2]   `, want: []string{"JSON object"}},
		{name: "bad dtype", hdr: `{"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}`, data: eight, want: []string{`tensor "a"`, "unknown dtype"}},
		{name: "offsets out of range", hdr: `{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, data: eight, want: []string{`tensor "a"`, "run past"}},
		{name: "truncated", hdr: ok, data: eight, trunc: 3, want: []string{`tensor "a"`, "truncated"}},
		{name: "shape mismatch", hdr: `{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, data: eight, want: []string{`tensor "a"`, "needs 12 bytes"}},
		{name: "reversed offsets", hdr: `{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, data: eight, want: []string{`tensor "a"`, "invalid data_offsets"}},
		{name: "one offset", hdr: `{"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}}`, data: eight, want: []string{`tensor "a"`, "2"}},
		{name: "negative dim", hdr: `{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, data: eight, want: []string{`tensor "a"`, "negative"}},
		{name: "overlap", hdr: `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, data: eight, want: []string{`"b"`, `"a"`, "overlap"}},
		{name: "bad metadata", hdr: `{"__metadata__":{"k":1}}`, want: []string{"__metadata__"}},
		{name: "entry not object", hdr: `{"a":3}`, want: []string{`tensor "a"`, "malformed entry"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "bad.safetensors")
			switch {
			case tc.raw != nil:
				if err := os.WriteFile(path, tc.raw, 0o644); err != nil {
					t.Fatal(err)
				}
			default:
				path = rawFile(t, dir, "bad.safetensors", tc.hdr, tc.data)
				if tc.trunc > 0 {
					st, _ := os.Stat(path)
					if err := os.Truncate(path, st.Size()-int64(tc.trunc)); err != nil {
						t.Fatal(err)
					}
				}
			}
			f, err := Open(path)
			if err == nil {
				f.Close()
				t.Fatal("Open succeeded on a malformed file")
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestReadFloat32Errors(t *testing.T) {
	dir := t.TempDir()
	path := rawFile(t, dir, "m.safetensors", `{"i":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},"f":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, make([]byte, 16))
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct {
		name string
		n    int
		want string
	}{
		{"i", 2, "not a floating-point type"},
		{"f", 3, "destination holds 3"},
		{"nope", 2, `no tensor "nope"`},
	} {
		err := f.ReadFloat32(tc.name, make([]float32, tc.n))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("ReadFloat32(%q, %d) error %v, want one naming %s and %q", tc.name, tc.n, err, path, tc.want)
		}
	}
}

func TestWriteDirSharded(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	data := randTensors(r, testSpecs)
	dir := t.TempDir()
	// 1.2 MB shards: "big" (1.2 MB in F32) lands alone.
	files, err := WriteDir(dir, F32, testSpecs, SliceSource(data), 1200000, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors", IndexFile}
	if !slices.Equal(files, want) {
		t.Fatalf("files %v, want %v", files, want)
	}
	var idx struct {
		Metadata struct {
			TotalSize int64 `json:"total_size"`
		} `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	raw, _ := os.ReadFile(filepath.Join(dir, IndexFile))
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, s := range testSpecs {
		total += 4 * int64(s.NumElements())
	}
	if idx.Metadata.TotalSize != total {
		t.Errorf("total_size %d, want %d", idx.Metadata.TotalSize, total)
	}
	wantMap := map[string]string{"embed": want[0], "scalar": want[0], "empty": want[0], "big": want[1], "w.3": want[2]}
	if !maps(idx.WeightMap, wantMap) {
		t.Errorf("weight_map %v, want %v", idx.WeightMap, wantMap)
	}
	check := func() {
		t.Helper()
		c, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if len(c.Names()) != len(testSpecs) {
			t.Fatalf("names %v", c.Names())
		}
		for i, s := range testSpecs {
			got := make([]float32, s.NumElements())
			if err := c.ReadFloat32(s.Name, got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, data[i]) {
				t.Fatalf("%s differs after round trip", s.Name)
			}
		}
	}
	check()

	// A single-file export replaces the shards and the index...
	if _, err := WriteDir(dir, F32, testSpecs, SliceSource(data), 0, nil); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{SingleFile}) {
		t.Errorf("after single-file export: %v", names)
	}
	check()
	// ...and a two-shard one replaces the single file.
	if _, err := WriteDir(dir, F32, testSpecs, SliceSource(data), 1200100, nil); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", IndexFile}) {
		t.Errorf("after two-shard export: %v", names)
	}
	check()
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestOpenDirErrors(t *testing.T) {
	shard := `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`
	tests := []struct {
		name  string
		index string
		want  []string
	}{
		{"missing shard", `{"weight_map":{"a":"s2.safetensors"}}`, []string{"s2.safetensors", "no such file"}},
		{"tensor not in shard", `{"weight_map":{"a":"s.safetensors","b":"s.safetensors","c":"s.safetensors"}}`, []string{`"c"`, "lacks it"}},
		{"unlisted tensor", `{"weight_map":{"a":"s.safetensors"}}`, []string{`"b"`, "not mapped"}},
		{"escape", `{"weight_map":{"a":"../s.safetensors"}}`, []string{`"a"`, "not a file inside"}},
		{"empty", `{"weight_map":{}}`, []string{"empty"}},
		{"bad json", `{"weight_map":`, []string{IndexFile}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rawFile(t, dir, "s.safetensors", shard, make([]byte, 8))
			if err := os.WriteFile(filepath.Join(dir, IndexFile), []byte(tc.index), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := OpenDir(dir)
			if err == nil {
				c.Close()
				t.Fatal("OpenDir succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if _, err := OpenDir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "neither") {
		t.Errorf("empty folder: error %v", err)
	}
}

func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	if err := WriteFile(path, F16, testSpecs[:1], SliceSource([][]float32{make([]float32, 35)}), nil); err == nil {
		t.Error("F16 output accepted")
	}
	err := WriteFile(path, F32, testSpecs[:1], SliceSource([][]float32{make([]float32, 34)}), nil)
	if err == nil || !strings.Contains(err.Error(), `"embed"`) {
		t.Errorf("short source: error %v, want one naming the tensor", err)
	}
	if err := WriteFile(path, F32, []Spec{{"a", []int{1}}, {"a", []int{1}}}, SliceSource([][]float32{{1}, {2}}), nil); err == nil {
		t.Error("duplicate names accepted")
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("failed writes left files behind: %v", names)
	}
}
