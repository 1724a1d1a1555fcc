package promtext

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/livemetrics"
)

func TestParse(t *testing.T) {
	in := "# HELP a_b Help text, with \"quotes\".\n" +
		"# TYPE a_b gauge\n" +
		"a_b 1.5\n" +
		"\n" +
		"# a free comment\n" +
		"a_b{x=\"1\",y=\"q\\\"u\\\\o\\nte\"} -2e-3 1700000000000\n" +
		"c:d{ z = \"\" , } +Inf\n" +
		"e NaN\n" +
		"f\t-Inf\r\n"
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Sample{
		{Name: "a_b", Value: 1.5},
		{Name: "a_b", Labels: map[string]string{"x": "1", "y": "q\"u\\o\nte"}, Value: -2e-3, Timestamp: 1700000000000, HasTimestamp: true},
		{Name: "c:d", Labels: map[string]string{"z": ""}, Value: math.Inf(1)},
		{Name: "e", Value: math.NaN()},
		{Name: "f", Value: math.Inf(-1)},
	}
	if len(got) != len(want) {
		t.Fatalf("%d samples, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		same := g.Name == w.Name && fmt.Sprint(g.Labels) == fmt.Sprint(w.Labels) && g.Timestamp == w.Timestamp && g.HasTimestamp == w.HasTimestamp &&
			(g.Value == w.Value || math.IsNaN(g.Value) && math.IsNaN(w.Value))
		if !same {
			t.Errorf("sample %d: %+v, want %+v", i, g, w)
		}
	}
}

// TestParseMalformed: each malformed line is refused with its line number
// and the problem.
func TestParseMalformed(t *testing.T) {
	tests := []struct{ in, want string }{
		{"ok 1\n9bad 1\n", "line 2: invalid metric name \"9bad\""},
		{"a\n", "line 1: a: want a value"},
		{"a 1 2 3\n", "line 1: a: want a value and an optional timestamp"},
		{"a one\n", "line 1: a: value \"one\": not a number"},
		{"a inf\n", "line 1: a: value \"inf\": not a number"},
		{"a 1 1.5\n", "line 1: a: timestamp \"1.5\""},
		{"\n\na{x=1} 1\n", "line 3: a: label x: value not quoted"},
		{"a{x=\"1} 1\n", "line 1: a: label x: unterminated value"},
		{"a{x=\"1\" y=\"2\"} 1\n", "line 1: a: label x: want ',' or '}'"},
		{"a{x=\"1\",x=\"2\"} 1\n", "line 1: a: label x twice"},
		{"a{x:y=\"1\"} 1\n", "line 1: a: invalid label name \"x:y\""},
		{"a{x=\"\\t\"} 1\n", `line 1: a: label x: unknown escape \t`},
		{"a{x} 1\n", "line 1: a: label without '='"},
		{"a{x=\"1\"}1\n", "line 1: a: want a value"},
		{"# TYPE a gauge\n# TYPE a counter\n", "line 2: second # TYPE line for a"},
		{"# TYPE a meter\n", "line 1: # TYPE a: want one of"},
		{"# HELP\n", "line 1: # HELP without a valid metric name"},
	}
	for _, tc := range tests {
		_, err := Parse(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.want)
		}
	}
}

// TestParseLiveMetrics: the launcher's exposition parses, every value
// and label as written.
func TestParseLiveMetrics(t *testing.T) {
	s := livemetrics.Snapshot{Time: time.Unix(100, 5e8), Step: 7, Steps: 10, Loss: 1.0 / 3, StepsPerSec: 2, TokensPerSec: 128, MFU: 1.5, Stragglers: 1,
		Ranks: []livemetrics.Rank{{Rank: 0, Host: `a"b\c`, StepS: 0.5, ComputeS: 0.25, MemGiB: 1}, {Rank: 1, Host: "h", StepS: 0.5, ComputeS: 0.4, MemGiB: 0.5}}}
	var b strings.Builder
	if err := livemetrics.WritePrometheus(&b, "j\n1", s, true); err != nil {
		t.Fatal(err)
	}
	got, err := Parse(strings.NewReader(b.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	find := func(name string, rank string) Sample {
		for _, x := range got {
			if x.Name == name && x.Labels["rank"] == rank {
				return x
			}
		}
		t.Fatalf("no %s rank %q", name, rank)
		return Sample{}
	}
	if x := find(livemetrics.MetricLoss, ""); x.Value != 1.0/3 || x.Labels["job_id"] != "j\n1" {
		t.Errorf("loss %+v", x)
	}
	if x := find(livemetrics.MetricRankMemory, "0"); x.Value != 1<<30 || x.Labels["host"] != `a"b\c` {
		t.Errorf("rank 0 memory %+v", x)
	}
	if x := find(livemetrics.MetricLastUpdate, ""); x.Value != 100.5 {
		t.Errorf("last update %+v", x)
	}
}
