package longconv

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestScheduleCoverage is must-show (a): for many capacities and schedule
// origins (prefill lengths), every pair s<t after the origin lies in
// exactly one tile, that tile is computed at a step i with s ≤ i < t, and
// every tile reads only positions ≤ i and writes only positions > i
// (inside the capacity).
func TestScheduleCoverage(t *testing.T) {
	for _, L := range []int{1, 2, 3, 5, 8, 100, 1000} {
		for _, base := range []int{0, 1, 7, 8, 100, 999} {
			if base >= L && base != 0 {
				continue
			}
			t.Run(fmt.Sprintf("L=%d/base=%d", L, base), func(t *testing.T) {
				// cover[s*L+t] counts the tiles holding (s, t).
				cover := make([]uint8, L*L)
				for i := base; i < L; i++ {
					tl, ok := tileAfter(i, base, L)
					if !ok {
						if i+1 < L && tl.hi > i {
							t.Fatalf("step %d: tile skipped though it writes %d..%d", i, i+1, tl.hi)
						}
						continue
					}
					if tl.step != i || tl.lo < base || tl.lo > i || tl.hi <= i || tl.hi >= L {
						t.Fatalf("step %d: tile reads [%d, %d], writes [%d, %d]", i, tl.lo, tl.step, i+1, tl.hi)
					}
					if tl.u != 1<<tl.level || tl.step-tl.lo+1 != tl.u || tl.hi > i+tl.u {
						t.Fatalf("step %d: bad side %d (level %d) for [%d, %d]→[%d, %d]", i, tl.u, tl.level, tl.lo, i, i+1, tl.hi)
					}
					for s := tl.lo; s <= i; s++ {
						for o := i + 1; o <= tl.hi; o++ {
							cover[s*L+o]++
						}
					}
				}
				for s := base; s < L; s++ {
					for o := s + 1; o < L; o++ {
						if c := cover[s*L+o]; c != 1 {
							t.Fatalf("pair (s=%d, t=%d) covered %d times", s, o, c)
						}
					}
				}
			})
		}
	}
}

// ---- a float64 reference for a toy network of long-conv layers ----

// toyNet is a deterministic M-layer network around the long convolutions:
// layer ℓ's conv input at position i is x = tanh(W_ℓ·a) with a the
// previous layer's output (or, for layer 0, the network input at i), and
// its output is a' = y + D_ℓ⊙x. The network input at generated positions
// feeds back the last layer's output at i-1; prompt positions are
// teacher-forced.
type toyNet struct {
	B, L     int
	ch       []int       // channels per layer; layer ℓ reads ch[ℓ-1] (ch[-1] := ch[M-1])
	filt     [][]float32 // [ℓ][C][L]
	W        [][]float64 // [ℓ][C_ℓ × C_in]
	D        [][]float64
	prompt   [][]float64 // teacher-forced network inputs [pos][B×C_in0]
	inWidth0 int
}

func newToyNet(seed uint64, B, L int, ch []int) *toyNet {
	r := newRand(seed)
	n := &toyNet{B: B, L: L, ch: ch}
	M := len(ch)
	n.inWidth0 = ch[M-1]
	for l, C := range ch {
		// Σ|h| ≈ 1.5 and a gain ≈ 1 below keep the feedback loop from
		// amplifying rounding, so float32 runs stay near the reference.
		tau := float64(L)/4 + 2
		f := decayingFilter(r, C, L, tau)
		for i := range f {
			f[i] *= float32(3 / tau)
		}
		n.filt = append(n.filt, f)
		in := n.inWidth0
		if l > 0 {
			in = ch[l-1]
		}
		w := make([]float64, C*in)
		for i := range w {
			w[i] = (2*r.Float64() - 1) * 1.5 / math.Sqrt(float64(in))
		}
		d := make([]float64, C)
		for i := range d {
			d[i] = 2*r.Float64() - 1
		}
		n.W, n.D = append(n.W, w), append(n.D, d)
	}
	for range L {
		p := make([]float64, B*n.inWidth0)
		for i := range p {
			p[i] = 2*r.Float64() - 1
		}
		n.prompt = append(n.prompt, p)
	}
	return n
}

// convIn maps the [B][in] activations a to layer l's conv input [B][C].
func (n *toyNet) convIn(l int, a []float64) []float64 {
	C := n.ch[l]
	in := len(a) / n.B
	x := make([]float64, n.B*C)
	for b := range n.B {
		for c := range C {
			var s float64
			for j := range in {
				s += n.W[l][c*in+j] * a[b*in+j]
			}
			x[b*C+c] = math.Tanh(s)
		}
	}
	return x
}

func (n *toyNet) convOut(l int, x, y []float64) []float64 {
	C := n.ch[l]
	a := make([]float64, len(y))
	for i := range y {
		a[i] = y[i] + n.D[l][i%C]*x[i]
	}
	return a
}

// reference runs the network in float64 with direct sums for positions
// 0..G-1, the first P teacher-forced, and returns every layer's conv
// output per position: out[pos][ℓ] is [B][C_ℓ].
func (n *toyNet) reference(P, G int) [][][]float64 {
	forced := make([]bool, G)
	for i := range min(P, G) {
		forced[i] = true
	}
	return n.referenceForced(forced)
}

// online runs the same network through an Online: prompts by Prefill in
// the given chunks (prefill[k] positions after generating gen[k]), the
// rest by Step. It returns the conv outputs like reference.
func (n *toyNet) online(t *testing.T, cfg OnlineConfig, chunks []chunk, G int) [][][]float64 {
	t.Helper()
	M := len(n.ch)
	cfg.B, cfg.LMax, cfg.Channels, cfg.Filters = n.B, n.L, n.ch, n.filt
	o, err := NewOnline(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][][]float64, G)
	for i := range out {
		out[i] = make([][]float64, M)
	}
	var last []float64
	step := func(i int, a []float64) []float64 {
		for l := range M {
			x := n.convIn(l, a)
			x32 := make([]float32, len(x))
			for j, v := range x {
				x32[j] = float32(v)
			}
			y32 := make([]float32, len(x))
			if err := o.Step(l, y32, x32); err != nil {
				t.Fatal(err)
			}
			y := make([]float64, len(x))
			for j := range x {
				// Round x as the online path saw it.
				x[j] = float64(x32[j])
				y[j] = float64(y32[j])
			}
			out[i][l] = y
			a = n.convOut(l, x, y)
		}
		return a
	}
	pos := 0
	for _, ch := range chunks {
		for range ch.gen {
			a := last
			if pos == 0 {
				a = n.prompt[0]
			}
			last = step(pos, a)
			pos++
		}
		if ch.prefill == 0 {
			continue
		}
		// Teacher-forced positions pos..pos+P-1, layer by layer.
		P := ch.prefill
		acts := make([][]float64, P)
		for j := range P {
			acts[j] = n.prompt[pos+j]
		}
		for l := range M {
			C := n.ch[l]
			xs := make([][]float64, P)
			x32 := make([]float32, n.B*C*P)
			for j := range P {
				xs[j] = n.convIn(l, acts[j])
				for b := range n.B {
					for c := range C {
						x32[(b*C+c)*P+j] = float32(xs[j][b*C+c])
					}
				}
			}
			y32 := make([]float32, len(x32))
			if err := o.Prefill(l, y32, x32); err != nil {
				t.Fatal(err)
			}
			for j := range P {
				y := make([]float64, n.B*C)
				for b := range n.B {
					for c := range C {
						y[b*C+c] = float64(y32[(b*C+c)*P+j])
						xs[j][b*C+c] = float64(x32[(b*C+c)*P+j])
					}
				}
				out[pos+j][l] = y
				acts[j] = n.convOut(l, xs[j], y)
			}
		}
		last = acts[P-1]
		pos += P
	}
	for ; pos < G; pos++ {
		a := last
		if pos == 0 {
			a = n.prompt[0]
		}
		last = step(pos, a)
	}
	if o.Pos() != G {
		t.Fatalf("Pos() = %d after %d positions", o.Pos(), G)
	}
	return out
}

// chunk is gen generated positions followed by a prefill of prefill
// positions.
type chunk struct{ gen, prefill int }

// maxDiff is the largest |a-b| over all positions and layers.
func maxDiff(a, b [][][]float64) float64 {
	var e float64
	for i := range a {
		for l := range a[i] {
			for j := range a[i][l] {
				e = math.Max(e, math.Abs(a[i][l][j]-b[i][l][j]))
			}
		}
	}
	return e
}

// TestFlashSingleChannel is must-show (b): one channel, flash (all tiles
// direct, all FFT, and the default hybrid) against the float64 direct
// sum, with the normalized error |y−ref| / Σ|h||x| ≤ c·ε·log₂L.
func TestFlashSingleChannel(t *testing.T) {
	for _, L := range []int{1, 2, 3, 7, 8, 100, 300, 1000, 4096} {
		for _, tc := range []struct {
			name    string
			mode    Mode
			fftTile int
		}{
			{"flash-direct", Flash, -1}, {"flash-fft", Flash, 1}, {"flash", Flash, 0},
			{"lazy", Lazy, 0}, {"eager", Eager, 0},
		} {
			t.Run(fmt.Sprintf("L=%d/%s", L, tc.name), func(t *testing.T) {
				r := newRand(uint64(L))
				h := decayingFilter(r, 1, L, float64(L)/3+1)
				x := randF32(r, L)
				o, err := NewOnline(OnlineConfig{Mode: tc.mode, B: 1, LMax: L, Channels: []int{1}, Filters: [][]float32{h}, FFTTile: tc.fftTile, Threads: 1})
				if err != nil {
					t.Fatal(err)
				}
				want, scale := refForward(x, h, 1, 1, L)
				y := make([]float32, L)
				for i := range L {
					if err := o.Step(0, y[i:i+1], x[i:i+1]); err != nil {
						t.Fatal(err)
					}
				}
				e := maxNormErr(y, want, scale)
				bound := tolFor(L)
				t.Logf("normalized error %.3g (bound %.3g)", e, bound)
				if e > bound {
					t.Fatalf("normalized error %.3g > %.3g", e, bound)
				}
				st := o.Stats()
				if tc.mode == Flash && L > 1 && st.DirectTiles+st.FFTTiles == 0 {
					t.Error("no tiles counted")
				}
				if tc.fftTile == 1 && L > 2 && st.FFTTiles == 0 {
					t.Error("FFTTile=1 computed no FFT tiles")
				}
			})
		}
	}
}

// TestModesAgree is must-show (c): a 3-layer toy network with feedback,
// B=2, several channel counts, prompts of 0, 1, 7, 8 and 100 positions
// and a capacity that is not a power of two: flash, lazy and eager all
// match the float64 direct reference, and each other.
func TestModesAgree(t *testing.T) {
	const L = 203
	for _, ch := range [][]int{{3, 1, 4}, {2, 2, 2}} {
		net := newToyNet(7, 2, L, ch)
		for _, P := range []int{0, 1, 7, 8, 100} {
			G := L // generate to the capacity
			if P == 7 {
				G = L - 11 // and stop before it
			}
			ref := net.reference(P, G)
			t.Run(fmt.Sprintf("C=%v/P=%d", ch, P), func(t *testing.T) {
				res := map[string][][][]float64{}
				for _, tc := range []struct {
					name string
					cfg  OnlineConfig
				}{
					{"lazy", OnlineConfig{Mode: Lazy}},
					{"eager", OnlineConfig{Mode: Eager}},
					{"flash", OnlineConfig{Mode: Flash, FFTTile: 4}},
					{"flash-direct", OnlineConfig{Mode: Flash, FFTTile: -1}},
					{"flash-nocache", OnlineConfig{Mode: Flash, FFTTile: 2, SpectrumBytes: -1, Threads: 3}},
				} {
					got := net.online(t, tc.cfg, []chunk{{0, P}}, G)
					e := maxDiff(got, ref)
					t.Logf("%s: max |y - float64 reference| = %.3g", tc.name, e)
					if e > 1e-6 {
						t.Errorf("%s: max |y - float64 reference| = %.3g", tc.name, e)
					}
					res[tc.name] = got
				}
				for _, a := range []string{"eager", "flash", "flash-direct", "flash-nocache"} {
					if e := maxDiff(res[a], res["lazy"]); e > 1e-6 {
						t.Errorf("%s vs lazy: max diff %.3g", a, e)
					}
				}
			})
		}
	}
}

// TestChunkedPrefill prefills after generated positions (multi-turn
// input) and checks every mode against the reference.
func TestChunkedPrefill(t *testing.T) {
	const L = 150
	net := newToyNet(9, 2, L, []int{2, 3, 1})
	chunks := []chunk{{0, 5}, {9, 13}, {1, 1}, {20, 30}}
	// The reference treats positions in prefill chunks as teacher-forced:
	// build it position by position with the same rule.
	forced := make([]bool, L)
	pos := 0
	for _, c := range chunks {
		pos += c.gen
		for j := range c.prefill {
			forced[pos+j] = true
		}
		pos += c.prefill
	}
	ref := net.referenceForced(forced)
	for _, cfg := range []OnlineConfig{{Mode: Lazy}, {Mode: Eager}, {Mode: Flash, FFTTile: 4}, {Mode: Flash}} {
		got := net.online(t, cfg, chunks, L)
		e := maxDiff(got, ref)
		t.Logf("%v (FFTTile %d): max |y - reference| = %.3g", cfg.Mode, cfg.FFTTile, e)
		if e > 1e-6 {
			t.Errorf("%v: max |y - reference| = %.3g", cfg.Mode, e)
		}
	}
}

// referenceForced is reference with an arbitrary set of teacher-forced
// positions. Conv inputs are rounded to float32 as the online path sees
// them; everything else is float64.
func (n *toyNet) referenceForced(forced []bool) [][][]float64 {
	M := len(n.ch)
	G := len(forced)
	hist := make([][][]float64, M)
	out := make([][][]float64, G)
	var last []float64
	for i := range G {
		a := n.prompt[i]
		if !forced[i] && i > 0 {
			a = last
		}
		out[i] = make([][]float64, M)
		for l := range M {
			C := n.ch[l]
			x := n.convIn(l, a)
			for j := range x {
				x[j] = float64(float32(x[j]))
			}
			hist[l] = append(hist[l], x)
			y := make([]float64, n.B*C)
			for b := range n.B {
				for c := range C {
					var s float64
					for j := 0; j <= i; j++ {
						s += float64(n.filt[l][c*n.L+i-j]) * hist[l][j][b*C+c]
					}
					y[b*C+c] = s
				}
			}
			out[i][l] = y
			a = n.convOut(l, x, y)
		}
		last = a
	}
	return out
}

// TestOnlineThreadsDeterministic checks bitwise equality between one
// goroutine and several, with every step and tile batch forced onto the
// parallel path, in every mode and across a prefill.
func TestOnlineThreadsDeterministic(t *testing.T) {
	const L, B, P = 300, 3, 37
	ch := []int{5, 2}
	r := newRand(11)
	filt := [][]float32{decayingFilter(r, ch[0], L, 100), decayingFilter(r, ch[1], L, 100)}
	for _, mode := range []Mode{Lazy, Eager, Flash} {
		var outs [][]float32
		for _, threads := range []int{1, 4} {
			o, err := NewOnline(OnlineConfig{Mode: mode, B: B, LMax: L, Channels: ch, Filters: filt, Threads: threads, FFTTile: 8})
			if err != nil {
				t.Fatal(err)
			}
			o.parWork = 1
			rr := newRand(12)
			var all []float32
			for l, C := range ch {
				x := randF32(rr, B*C*P)
				y := make([]float32, B*C*P)
				if err := o.Prefill(l, y, x); err != nil {
					t.Fatal(err)
				}
				all = append(all, y...)
			}
			for range L - P {
				for l, C := range ch {
					x := randF32(rr, B*C)
					y := make([]float32, B*C)
					if err := o.Step(l, y, x); err != nil {
						t.Fatal(err)
					}
					all = append(all, y...)
				}
			}
			outs = append(outs, all)
		}
		for i := range outs[0] {
			if outs[0][i] != outs[1][i] {
				t.Fatalf("%v: output %d: %v with 1 thread, %v with 4", mode, i, outs[0][i], outs[1][i])
			}
		}
	}
}

// TestOnlineReset checks that a reset Online reproduces its first run.
func TestOnlineReset(t *testing.T) {
	const L = 70
	r := newRand(13)
	h := decayingFilter(r, 2, L, 20)
	x := randF32(r, 2*L)
	o, err := NewOnline(OnlineConfig{Mode: Flash, B: 1, LMax: L, Channels: []int{2}, Filters: [][]float32{h}, FFTTile: 4})
	if err != nil {
		t.Fatal(err)
	}
	run := func() []float32 {
		y := make([]float32, 2*L)
		if err := o.Prefill(0, y[:2*5], append(append([]float32(nil), x[0:5]...), x[L:L+5]...)); err != nil {
			t.Fatal(err)
		}
		for i := 5; i < L; i++ {
			if err := o.Step(0, y[2*i:2*i+2], []float32{x[i], x[L+i]}); err != nil {
				t.Fatal(err)
			}
		}
		return y
	}
	a := run()
	o.Reset()
	b := run()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("after Reset, y[%d] = %v, first run %v", i, b[i], a[i])
		}
	}
}

func TestOnlineErrors(t *testing.T) {
	h := make([]float32, 2*10)
	good := OnlineConfig{Mode: Flash, B: 1, LMax: 10, Channels: []int{1, 1}, Filters: [][]float32{h[:10], h[10:]}}
	for _, tc := range []struct {
		name string
		edit func(*OnlineConfig)
		want string
	}{
		{"no layers", func(c *OnlineConfig) { c.Channels, c.Filters = nil, nil }, "no layers"},
		{"filter count", func(c *OnlineConfig) { c.Filters = c.Filters[:1] }, "1 filter sets for 2 layers"},
		{"batch", func(c *OnlineConfig) { c.B = 0 }, "batch size"},
		{"capacity", func(c *OnlineConfig) { c.LMax = 0 }, "capacity"},
		{"short filters", func(c *OnlineConfig) { c.Channels = []int{2, 1} }, "layer 0: filters have 10 elements, need 20"},
		{"filter length", func(c *OnlineConfig) { c.FilterLen = 5 }, "filter length 5"},
		{"mode", func(c *OnlineConfig) { c.Mode = 7 }, "unknown mode"},
		{"channels", func(c *OnlineConfig) { c.Channels = []int{1, 0} }, "layer 1 has 0 channels"},
	} {
		cfg := good
		tc.edit(&cfg)
		if _, err := NewOnline(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to mention %q", tc.name, err, tc.want)
		}
	}

	o, err := NewOnline(good)
	if err != nil {
		t.Fatal(err)
	}
	y, x := make([]float32, 1), make([]float32, 1)
	wantErr := func(err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to mention %q", err, want)
		}
	}
	wantErr(o.Step(1, y, x), "layer 1 fed at position 0, expected layer 0")
	wantErr(o.Step(2, y, x), "out of range")
	wantErr(o.Step(0, y, make([]float32, 2)), "x has 2 elements, want 1")
	wantErr(o.Step(0, nil, x), "y has 0 elements")
	if err := o.Prefill(0, make([]float32, 3), make([]float32, 3)); err != nil {
		t.Fatal(err)
	}
	wantErr(o.Prefill(1, make([]float32, 2), make([]float32, 2)), "layer 1 prefilled with 2 positions, layer 0 with 3")
	wantErr(o.Step(1, y, x), "fed by Step while layers 0..0 of position 0 were prefilled")
	if err := o.Prefill(1, make([]float32, 3), make([]float32, 3)); err != nil {
		t.Fatal(err)
	}
	if o.Pos() != 3 {
		t.Fatalf("Pos() = %d after a prefill of 3", o.Pos())
	}
	if err := o.Step(0, y, x); err != nil {
		t.Fatal(err)
	}
	wantErr(o.Prefill(1, y, x), "layer 1 prefilled at position 3 after layers 0..0 were stepped")
	if err := o.Step(1, y, x); err != nil {
		t.Fatal(err)
	}
	wantErr(o.Prefill(0, make([]float32, 7), make([]float32, 7)), "positions 4..10 exceed the capacity 10")
}

func TestMeasureFFTTile(t *testing.T) {
	if testing.Short() {
		t.Skip("timing")
	}
	u := MeasureFFTTile()
	if u < 8 || u > 2048 || u&(u-1) != 0 {
		t.Fatalf("MeasureFFTTile() = %d", u)
	}
	t.Logf("FFT tile crossover on this machine: %d (DefaultFFTTile %d)", u, DefaultFFTTile)
}

// TestStepDoesNotAllocate checks that generation steps (red cells and
// tiles, direct and FFT) allocate nothing on the serial path.
func TestStepDoesNotAllocate(t *testing.T) {
	const L = 1024
	r := newRand(17)
	h := decayingFilter(r, 3, L, 200)
	for _, mode := range []Mode{Lazy, Eager, Flash} {
		// Two threads: the steps are too small to go parallel, and the
		// serial path must not pay for the parallel one.
		o, err := NewOnline(OnlineConfig{Mode: mode, B: 2, LMax: L, Channels: []int{3}, Filters: [][]float32{h}, Threads: 2, FFTTile: 8})
		if err != nil {
			t.Fatal(err)
		}
		x, y := randF32(r, 6), make([]float32, 6)
		allocs := testing.AllocsPerRun(L-1, func() {
			if err := o.Step(0, y, x); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%v: %.2f allocations per step", mode, allocs)
		}
	}
}

// TestInPlace checks that y may be x in Step and Prefill.
func TestInPlace(t *testing.T) {
	const L, B, C, P = 90, 2, 3, 11
	r := newRand(19)
	h := decayingFilter(r, C, L, 30)
	xs := randF32(r, B*C*L)
	for _, mode := range []Mode{Lazy, Eager, Flash} {
		var outs [2][]float32
		for k, inPlace := range []bool{false, true} {
			o, err := NewOnline(OnlineConfig{Mode: mode, B: B, LMax: L, Channels: []int{C}, Filters: [][]float32{h}, FFTTile: 4})
			if err != nil {
				t.Fatal(err)
			}
			x := append([]float32(nil), xs[:B*C*P]...)
			y := x
			if !inPlace {
				y = make([]float32, len(x))
			}
			if err := o.Prefill(0, y, x); err != nil {
				t.Fatal(err)
			}
			outs[k] = append(outs[k], y...)
			for i := P; i < L; i++ {
				x := append([]float32(nil), xs[i*B*C:(i+1)*B*C]...)
				y := x
				if !inPlace {
					y = make([]float32, len(x))
				}
				if err := o.Step(0, y, x); err != nil {
					t.Fatal(err)
				}
				outs[k] = append(outs[k], y...)
			}
		}
		for i := range outs[0] {
			if outs[0][i] != outs[1][i] {
				t.Fatalf("%v: output %d: %v in place, %v otherwise", mode, i, outs[1][i], outs[0][i])
			}
		}
	}
}
