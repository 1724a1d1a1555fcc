package hostmem

import "testing"

// TestFloat32s: the buffer is zeroed, holds what is written, and
// releasing it twice is harmless.
func TestFloat32s(t *testing.T) {
	for _, n := range []int{0, 1, 1000, 3 << 20} {
		b, free := Float32s(n)
		if len(b) != n {
			t.Fatalf("n %d: len %d", n, len(b))
		}
		for i, v := range b {
			if v != 0 {
				t.Fatalf("n %d: b[%d] = %v, want zeroed", n, i, v)
			}
		}
		for i := range b {
			b[i] = float32(i)
		}
		for i, v := range b {
			if v != float32(i) {
				t.Fatalf("n %d: b[%d] = %v after writing %d", n, i, v, i)
			}
		}
		free()
		free()
	}
}

// BenchmarkFreshCopy copies 74 MB (the debug model's parameters and Adam
// moments) into a fresh buffer, as an async checkpoint's snapshot does:
// from the Go heap, and from Float32s.
func BenchmarkFreshCopy(b *testing.B) {
	const n = 18_500_000
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i)
	}
	b.Run("heap", func(b *testing.B) {
		b.SetBytes(4 * n)
		for range b.N {
			dst := make([]float32, n)
			copy(dst, src)
		}
	})
	b.Run("hostmem", func(b *testing.B) {
		b.SetBytes(4 * n)
		for range b.N {
			dst, free := Float32s(n)
			copy(dst, src)
			free()
		}
	})
}
