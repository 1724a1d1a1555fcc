package model

import (
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu"
)

// TestActivationScratchSizes: a reserved scratch is allocated for the
// largest reservation and serves every smaller part from its start; an
// unreserved one is sized by its first part; a part asking for more than
// was allocated is refused, by sizes.
func TestActivationScratchSizes(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	type take struct {
		n, nh int
		ok    bool
	}
	for _, c := range []struct {
		name             string
		reserve          [][2]int
		takes            []take
		wantN, wantBytes int
	}{
		{"reserved for the largest stage", [][2]int{{100, 10}, {300, 0}, {50, 40}}, []take{{100, 10, true}, {300, 0, true}, {50, 40, true}, {301, 0, false}, {0, 41, false}}, 300, 300*4 + 40*2},
		{"first part sizes it", nil, []take{{100, 10, true}, {100, 10, true}, {60, 10, true}, {101, 10, false}, {100, 11, false}}, 100, 100*4 + 10*2},
		{"a reservation below the first part", [][2]int{{10, 0}}, []take{{20, 0, true}, {21, 0, false}}, 20, 20 * 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s ActivationScratch
			for _, r := range c.reserve {
				s.Reserve(r[0], r[1])
			}
			for _, tk := range c.takes {
				f, h, err := s.Take(be, tk.n, tk.nh)
				if (err == nil) != tk.ok {
					t.Fatalf("Take(%d, %d): error %v, want ok=%v", tk.n, tk.nh, err, tk.ok)
				}
				if err != nil {
					continue
				}
				if f.Len != tk.n || h.Len != tk.nh || f.Off != 0 || h.Off != 0 {
					t.Errorf("Take(%d, %d): views of %d at %d and %d at %d, want the scratch's first elements", tk.n, tk.nh, f.Len, f.Off, h.Len, h.Off)
				}
			}
			if s.buf.Len != c.wantN || s.Bytes() != int64(c.wantBytes) {
				t.Errorf("allocated %d float32s, %d bytes; want %d, %d", s.buf.Len, s.Bytes(), c.wantN, c.wantBytes)
			}
		})
	}
}
