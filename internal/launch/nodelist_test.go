package launch

import (
	"slices"
	"strings"
	"testing"
)

func TestExpandNodelist(t *testing.T) {
	tests := []struct {
		list string
		want []string
	}{
		{"host", []string{"host"}},
		{"a,b", []string{"a", "b"}},
		{" a , b ", []string{"a", "b"}},
		{"node[01-04,07]", []string{"node01", "node02", "node03", "node04", "node07"}},
		{"n[8-10]", []string{"n8", "n9", "n10"}},
		{"n[08-10]", []string{"n08", "n09", "n10"}},
		{"n[3]", []string{"n3"}},
		{"gpu[1-2]-ib", []string{"gpu1-ib", "gpu2-ib"}},
		{"rack[1-2]-n[1-3]", []string{"rack1-n1", "rack1-n2", "rack1-n3", "rack2-n1", "rack2-n2", "rack2-n3"}},
		{"login,c[1-2],d[09-10]", []string{"login", "c1", "c2", "d09", "d10"}},
		{"node-7.cluster.local", []string{"node-7.cluster.local"}},
	}
	for _, tc := range tests {
		got, err := ExpandNodelist(tc.list)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ExpandNodelist(%q) = %q, %v; want %q", tc.list, got, err, tc.want)
		}
		first, err := FirstHost(tc.list)
		if err != nil || first != tc.want[0] {
			t.Errorf("FirstHost(%q) = %q, %v; want %q", tc.list, first, err, tc.want[0])
		}
	}
}

func TestExpandNodelistErrors(t *testing.T) {
	tests := []struct{ list, want string }{
		{"", "empty node list"},
		{"a,,b", "empty host name"},
		{"node[1-4", "unbalanced '['"},
		{"node1-4]", "unbalanced ']'"},
		{"node[]", "empty brackets"},
		{"node[4-1]", "end below start"},
		{"node[a-c]", "bad range"},
		{"node[1-]", "bad range"},
		{"node[1,,2]", "bad range"},
		{"n[0-99999999]", "more than"},
		{"n[[1]]", "malformed brackets"},
	}
	for _, tc := range tests {
		_, err := ExpandNodelist(tc.list)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ExpandNodelist(%q) error = %v, want one containing %q", tc.list, err, tc.want)
		}
	}
	if _, err := FirstHost(""); err == nil {
		t.Error(`FirstHost("") succeeded`)
	}
	// FirstHost expands only the first item of a list.
	if h, err := FirstHost("a[1-2],broken[x]"); err != nil || h != "a1" {
		t.Errorf("FirstHost = %q, %v; want a1", h, err)
	}
}

func TestParseTasksPerNode(t *testing.T) {
	tests := []struct {
		s    string
		want []int
	}{
		{"4", []int{4}},
		{"2(x3)", []int{2, 2, 2}},
		{"2(x3),1", []int{2, 2, 2, 1}},
		{"1,2,3", []int{1, 2, 3}},
	}
	for _, tc := range tests {
		got, err := ParseTasksPerNode(tc.s)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseTasksPerNode(%q) = %v, %v; want %v", tc.s, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "x", "2(x)", "2(x0)", "2(x3", "-1", "2(y3)"} {
		if got, err := ParseTasksPerNode(bad); err == nil {
			t.Errorf("ParseTasksPerNode(%q) = %v, want an error", bad, got)
		}
	}
}
