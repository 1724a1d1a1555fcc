package cpu

import (
	"math"
	"slices"
	"testing"
	"unsafe"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/numeric"
)

func TestAlloc(t *testing.T) {
	b := newTestBackend(t, 1)
	for _, tc := range []struct {
		dtype backend.DType
		n     int
	}{
		{backend.Float32, 0}, {backend.Float32, 1}, {backend.Float32, 1000},
		{backend.BFloat16, 3}, {backend.BFloat16, 1001},
		{backend.Int32, 17},
	} {
		for range 4 { // several allocations, so some start unaligned
			x := b.Alloc(tc.dtype, tc.n)
			if x.Len != tc.n || x.Off != 0 || x.Mem.Len != tc.n || x.DType() != tc.dtype {
				t.Fatalf("Alloc(%s, %d) = %+v", tc.dtype, tc.n, x)
			}
			var p unsafe.Pointer
			switch h := x.Mem.Host.(type) {
			case []float32:
				if len(h) != tc.n || slices.ContainsFunc(h, func(v float32) bool { return v != 0 }) {
					t.Fatalf("float32 memory not %d zeros", tc.n)
				}
				if tc.n > 0 {
					p = unsafe.Pointer(&h[0])
				}
			case []uint16:
				if len(h) != tc.n || tc.dtype != backend.BFloat16 {
					t.Fatalf("uint16 memory for %s", tc.dtype)
				}
				p = unsafe.Pointer(&h[0])
			case []int32:
				if len(h) != tc.n || tc.dtype != backend.Int32 {
					t.Fatalf("int32 memory for %s", tc.dtype)
				}
				p = unsafe.Pointer(&h[0])
			default:
				t.Fatalf("Alloc(%s) Host is %T", tc.dtype, h)
			}
			if uintptr(p)%align != 0 {
				t.Errorf("Alloc(%s, %d) at %p, not %d-byte aligned", tc.dtype, tc.n, p, align)
			}
		}
	}
}

func TestUploadDownload(t *testing.T) {
	b := newTestBackend(t, 2)
	f := []float32{1, -2, 3.5}
	ft := b.Alloc(backend.Float32, 5).Slice(1, 3)
	b.Upload(ft, f)
	gotF := make([]float32, 3)
	b.Download(gotF, ft)
	if !slices.Equal(gotF, f) {
		t.Errorf("float32 round trip: %v", gotF)
	}
	if whole := download(b, backend.Tensor{Mem: ft.Mem, Len: 5}); !slices.Equal(whole, []float32{0, 1, -2, 3.5, 0}) {
		t.Errorf("view wrote outside itself: %v", whole)
	}

	i := []int32{7, -1}
	it := b.Alloc(backend.Int32, 2)
	b.Upload(it, i)
	gotI := make([]int32, 2)
	b.Download(gotI, it)
	if !slices.Equal(gotI, i) {
		t.Errorf("int32 round trip: %v", gotI)
	}

	h := []uint16{0x3f80, 0xc000}
	ht := b.Alloc(backend.BFloat16, 2)
	b.Upload(ht, h)
	gotH := make([]uint16, 2)
	b.Download(gotH, ht)
	if !slices.Equal(gotH, h) {
		t.Errorf("bfloat16 round trip: %v", gotH)
	}
	b.Zero(ht)
	b.Download(gotH, ht)
	if !slices.Equal(gotH, []uint16{0, 0}) {
		t.Errorf("bfloat16 Zero: %v", gotH)
	}
	ht2 := b.Alloc(backend.BFloat16, 2)
	b.Upload(ht2, h)
	b.Copy(ht, ht2)
	b.Download(gotH, ht)
	if !slices.Equal(gotH, h) {
		t.Errorf("bfloat16 Copy: %v", gotH)
	}

	// float32 host data into a bfloat16 tensor rounds to nearest even;
	// a bfloat16 tensor into float32 host data widens exactly.
	vals := []float32{0, float32(math.Copysign(0, -1)), 1.00390625, 1.01171875, 3.4e38, 1e-40, -1.1754942e-38,
		float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000)}
	hv := b.Alloc(backend.BFloat16, len(vals))
	b.Upload(hv, vals)
	gotV := make([]uint16, len(vals))
	b.Download(gotV, hv)
	wide := make([]float32, len(vals))
	b.Download(wide, hv)
	for i, v := range vals {
		if want := numeric.Float32ToBF16(v); gotV[i] != want {
			t.Errorf("Upload(%#08x) into bfloat16 = %#04x, want %#04x", math.Float32bits(v), gotV[i], want)
		}
		if want := numeric.BF16ToFloat32(gotV[i]); math.Float32bits(wide[i]) != math.Float32bits(want) {
			t.Errorf("Download(%#04x) into float32 = %#08x, want %#08x", gotV[i], math.Float32bits(wide[i]), math.Float32bits(want))
		}
	}
}

func TestDTypeAndBoundsPanics(t *testing.T) {
	b := newTestBackend(t, 1)
	f := b.Alloc(backend.Float32, 8)
	bf := b.Alloc(backend.BFloat16, 8)
	tok := b.Alloc(backend.Int32, 8)
	for _, tc := range []struct {
		name  string
		f     func()
		parts []string
	}{
		{"SwiGLU on bfloat16", func() { b.SwiGLUForward(f, bf, f, 8) }, []string{"SwiGLUForward", "gate", "bfloat16"}},
		{"Scale on int32", func() { b.Scale(tok, 2) }, []string{"Scale", "int32"}},
		{"float tokens", func() { b.EmbeddingForward(f, f, f, 2, 4) }, []string{"EmbeddingForward", "tokens", "float32"}},
		{"short output", func() { b.SwiGLUForward(f, f, f, 9) }, []string{"SwiGLUForward", "out", "need 9"}},
		{"Upload type", func() { b.Upload(f, []int32{1}) }, []string{"Upload", "int32"}},
		{"Upload length", func() { b.Upload(f, []float32{1}) }, []string{"Upload", "1", "8"}},
		{"Download length", func() { b.Download(make([]float32, 3), f) }, []string{"Download"}},
		{"Copy dtypes", func() { b.Copy(f, tok) }, []string{"Copy", "float32", "int32"}},
		{"bad view", func() { b.Scale(backend.Tensor{Mem: f.Mem, Off: 4, Len: 5}, 1) }, []string{"Scale", "outside"}},
		{"Gemm leading dimension", func() {
			b.Gemm(false, false, 2, 2, 2, 1, f, 1, f, 2, 0, f, 2)
		}, []string{"Gemm", "leading dimension"}},
	} {
		mustPanic(t, tc.name, tc.f, tc.parts...)
	}
}
