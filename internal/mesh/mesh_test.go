package mesh

import (
	"fmt"
	"strings"
	"testing"
)

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		world int
		d     Degrees
		want  string // "" = ok
	}{
		{8, Degrees{1, 1, -1, 1, 1}, ""},
		{8, Degrees{2, 1, -1, 1, 2}, ""},
		{8, Degrees{2, 2, 2, 1, 1}, ""},
		{6, Degrees{1, 1, -1, 1, 4}, "whole quotient"},
		{8, Degrees{1, 1, 2, 1, 2}, "must equal the world size"},
		{4, Degrees{0, 1, -1, 1, 1}, "pipeline_parallel_degree"},
		{4, Degrees{1, 1, -2, 1, 1}, "data_parallel_shard_degree"},
	} {
		_, err := New(tc.world, tc.d)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("New(%d, %+v) = %v, want %q", tc.world, tc.d, err, tc.want)
		}
	}
}

func TestGroups2x2(t *testing.T) {
	m, err := New(4, Degrees{PP: 1, DPReplicate: 1, DPShard: 2, CP: 1, TP: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dims []string
		want string
	}{
		{[]string{"tp"}, "[[0 1] [2 3]]"},
		{[]string{"dp_shard"}, "[[0 2] [1 3]]"},
		{[]string{"dp_replicate", "dp_shard"}, "[[0 2] [1 3]]"},
		{[]string{"dp_shard", "tp"}, "[[0 1 2 3]]"},
		{[]string{"pp"}, "[[0] [1] [2] [3]]"},
	} {
		g, err := m.Groups(tc.dims...)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(g); got != tc.want {
			t.Errorf("Groups(%v) = %s, want %s", tc.dims, got, tc.want)
		}
	}
	if _, err := m.Group(0, "ep"); err == nil {
		t.Error("unknown dimension must be an error")
	}
}

// TestCoordsRoundTrip checks every rank of a 5-D mesh against an
// independent nested-loop enumeration of the layout.
func TestCoordsRoundTrip(t *testing.T) {
	d := Degrees{PP: 2, DPReplicate: 2, DPShard: 3, CP: 2, TP: 2}
	m, err := New(48, d)
	if err != nil {
		t.Fatal(err)
	}
	r := 0
	for pp := 0; pp < 2; pp++ {
		for dr := 0; dr < 2; dr++ {
			for ds := 0; ds < 3; ds++ {
				for cp := 0; cp < 2; cp++ {
					for tp := 0; tp < 2; tp++ {
						want := []int{pp, dr, ds, cp, tp}
						if got := m.Coords(r); fmt.Sprint(got) != fmt.Sprint(want) || m.Rank(want) != r {
							t.Fatalf("rank %d: coords %v, want %v", r, got, want)
						}
						r++
					}
				}
			}
		}
	}
	// Every group along cp has 2 members differing only in cp.
	gs, _ := m.Groups("cp")
	if len(gs) != 24 {
		t.Fatalf("%d cp groups, want 24", len(gs))
	}
	for _, g := range gs {
		a, b := m.Coords(g[0]), m.Coords(g[1])
		if a[3] != 0 || b[3] != 1 || a[0] != b[0] || a[1] != b[1] || a[2] != b[2] || a[4] != b[4] {
			t.Fatalf("cp group %v has coords %v, %v", g, a, b)
		}
	}
}
