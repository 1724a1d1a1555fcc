package cluster

import (
	"strings"
	"testing"

	"github.com/titan-go/titan/configs"
)

func TestShippedClustersLoad(t *testing.T) {
	names := Names()
	for _, want := range []string{"a100-80gb", "b200", "cpu-2core", "h100-grandteton", "h100-sxm", "h200"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("cluster %s is not shipped (have %v)", want, names)
		}
	}
	for _, n := range names {
		c, err := Load(n)
		if err != nil {
			t.Fatal(err)
		}
		if c.Name != n {
			t.Errorf("%s: name = %q, want the file's name", n, c.Name)
		}
		if c.World() < 1 || c.Device.PeakBF16 <= 0 {
			t.Errorf("%s: %+v", n, c)
		}
	}
}

func TestBadDescriptions(t *testing.T) {
	good, err := configs.Clusters.ReadFile("clusters/h100-sxm.toml")
	if err != nil {
		t.Fatal(err)
	}
	src := string(good)
	cases := []struct {
		name, edit, want string
	}{
		{"unknown top-level key", "gpus = 8\n" + src, "unknown key(s) gpus"},
		{"unknown nested key", strings.Replace(src, "latency = 3e-6", "latency = 3e-6\nlatncy = 1", 1), "intra_node.latncy"},
		{"missing key", strings.Replace(src, "peak_fp32_flops = 67e12\n", "", 1), "missing key device.peak_fp32_flops"},
		{"zero bandwidth", strings.Replace(src, "bandwidth = 50e9", "bandwidth = 0", 1), "inter_node.bandwidth = 0"},
		{"negative nodes", strings.Replace(src, "nodes = 16", "nodes = -1", 1), "nodes = -1"},
		{"bad kind", strings.Replace(src, `kind = "gpu"`, `kind = "tpu"`, 1), `device.kind "tpu"`},
		{"cores on a gpu", strings.Replace(src, `kind = "gpu"`, "kind = \"gpu\"\ncores = 4", 1), "device.cores is only for"},
		{"wrong type", strings.Replace(src, "nodes = 16", `nodes = "many"`, 1), "cluster x.toml"},
		{"nan bandwidth", strings.Replace(src, "bandwidth = 50e9", "bandwidth = nan", 1), "inter_node.bandwidth = NaN: must be a finite number"},
		{"infinite latency", strings.Replace(src, "latency = 3e-6", "latency = inf", 1), "intra_node.latency = +Inf"},
		{"nan peak", strings.Replace(src, "peak_bf16_flops = 989e12", "peak_bf16_flops = nan", 1), "device.peak_bf16_flops = NaN"},
		{"absurd memory", strings.Replace(src, "memory_bytes = 85899345920", "memory_bytes = 1e30", 1), "device.memory_bytes = 1e+30"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.edit), "x.toml")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := Load("no-such-cluster"); err == nil || !strings.Contains(err.Error(), "h100-sxm") {
		t.Errorf("unknown cluster: %v, want the shipped names listed", err)
	}
}

func TestWithWorld(t *testing.T) {
	c, _ := Load("h100-sxm")
	for _, tc := range []struct{ world, nodes, per int }{{8, 1, 8}, {4, 1, 4}, {256, 32, 8}} {
		r, err := c.WithWorld(tc.world)
		if err != nil || r.Nodes != tc.nodes || r.DevicesPerNode != tc.per {
			t.Errorf("WithWorld(%d) = %d × %d, %v", tc.world, r.Nodes, r.DevicesPerNode, err)
		}
	}
	if _, err := c.WithWorld(12); err == nil {
		t.Error("12 GPUs of 8-GPU nodes accepted")
	}
}
