// Package cluster describes the machines titan plan predicts for: the
// accelerator (or CPU) of one rank with its peak throughputs and memory,
// how many sit in a node, the links within and between nodes, and the
// node count. Descriptions are TOML files; titan ships the common ones
// in configs/clusters (H100 SXM, H200, A100 80 GB, B200 and this CPU
// machine) and a path to any other file works the same way.
//
// Every key is checked: an unknown key, a missing one or a value out of
// range is an error naming the key and the file.
package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/titan-go/titan/configs"
)

// Cluster is one cluster description.
type Cluster struct {
	// Name is how the cluster is chosen (the file name without .toml for
	// the shipped ones).
	Name string `toml:"name"`
	// Description says what the machine is, for reports.
	Description string `toml:"description"`
	// Nodes is the number of nodes, DevicesPerNode the ranks of a node
	// (GPUs; worker processes on a CPU host).
	Nodes          int `toml:"nodes"`
	DevicesPerNode int `toml:"devices_per_node"`
	// Device is one rank's device.
	Device Device `toml:"device"`
	// Intra is the link between devices of a node (NVLink; shared
	// memory on a CPU host), Inter the one between nodes (InfiniBand).
	Intra Link `toml:"intra_node"`
	Inter Link `toml:"inter_node"`
	// File is where the description was read from (not a key).
	File string `toml:"-"`
}

// Device is the compute and memory of one rank.
type Device struct {
	// Kind is "gpu" or "cpu". CPU ranks on one host share its cores and
	// run their collectives on them, so nothing overlaps there.
	Kind string `toml:"kind"`
	// Model names the part.
	Model string `toml:"model"`
	// Cores is the host's core count (cpu only).
	Cores int `toml:"cores"`
	// Peak dense throughputs in FLOP/s; PeakFP8 0 means no float8.
	PeakBF16 float64 `toml:"peak_bf16_flops"`
	PeakFP8  float64 `toml:"peak_fp8_flops"`
	PeakFP32 float64 `toml:"peak_fp32_flops"`
	// MemoryBytes is the device memory (HBM; the host's RAM for cpu),
	// MemoryBandwidth its bandwidth in bytes/s.
	MemoryBytes     float64 `toml:"memory_bytes"`
	MemoryBandwidth float64 `toml:"memory_bandwidth"`
}

// Link is a point-to-point link of one device: its bandwidth in bytes/s
// in one direction and the latency of one message in seconds.
type Link struct {
	Bandwidth float64 `toml:"bandwidth"`
	Latency   float64 `toml:"latency"`
}

// World is the number of ranks of the whole cluster.
func (c Cluster) World() int { return c.Nodes * c.DevicesPerNode }

// CPU reports whether the ranks are CPU processes.
func (c Cluster) CPU() bool { return c.Device.Kind == "cpu" }

// String is a one-line summary.
func (c Cluster) String() string {
	return fmt.Sprintf("%s: %d × %d %s (%s)", c.Name, c.Nodes, c.DevicesPerNode, c.Device.Model, c.Description)
}

// Names lists the shipped clusters.
func Names() []string {
	ents, _ := fs.ReadDir(configs.Clusters, "clusters")
	var out []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".toml"); ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Load returns the cluster named by ref: a shipped cluster's name (see
// Names) or the path of a TOML file.
func Load(ref string) (Cluster, error) {
	if ref == "" {
		return Cluster{}, fmt.Errorf("cluster: no cluster given (shipped: %s)", strings.Join(Names(), ", "))
	}
	if !strings.ContainsAny(ref, "/\\") && !strings.HasSuffix(ref, ".toml") {
		raw, err := configs.Clusters.ReadFile(path.Join("clusters", ref+".toml"))
		if err != nil {
			return Cluster{}, fmt.Errorf("cluster: unknown cluster %q (shipped: %s; or give the path of a .toml file)", ref, strings.Join(Names(), ", "))
		}
		return Parse(raw, "configs/clusters/"+ref+".toml")
	}
	raw, err := os.ReadFile(ref)
	if err != nil {
		return Cluster{}, fmt.Errorf("cluster: %w", err)
	}
	return Parse(raw, ref)
}

// Parse decodes and validates a description read from file (named in
// errors).
func Parse(raw []byte, file string) (Cluster, error) {
	var c Cluster
	dec := toml.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			var keys []string
			for _, e := range strict.Errors {
				keys = append(keys, strings.Join(e.Key(), "."))
			}
			return Cluster{}, fmt.Errorf("cluster %s: unknown key(s) %s", file, strings.Join(keys, ", "))
		}
		return Cluster{}, fmt.Errorf("cluster %s: %w", file, err)
	}
	// Which keys were written: every one is required, so that a
	// misspelt or forgotten figure is not silently zero.
	var present map[string]any
	if err := toml.Unmarshal(raw, &present); err != nil {
		return Cluster{}, fmt.Errorf("cluster %s: %w", file, err)
	}
	c.File = file
	if err := c.validate(present); err != nil {
		return Cluster{}, fmt.Errorf("cluster %s: %w", file, err)
	}
	return c, nil
}

// required lists every key and whether a value of 0 is allowed.
var required = []struct {
	key      string
	zeroOK   bool
	cpuOnly  bool
	positive func(Cluster) float64
}{
	{"name", false, false, nil},
	{"description", false, false, nil},
	{"nodes", false, false, func(c Cluster) float64 { return float64(c.Nodes) }},
	{"devices_per_node", false, false, func(c Cluster) float64 { return float64(c.DevicesPerNode) }},
	{"device.kind", false, false, nil},
	{"device.model", false, false, nil},
	{"device.cores", false, true, func(c Cluster) float64 { return float64(c.Device.Cores) }},
	{"device.peak_bf16_flops", false, false, func(c Cluster) float64 { return c.Device.PeakBF16 }},
	{"device.peak_fp8_flops", true, false, func(c Cluster) float64 { return c.Device.PeakFP8 }},
	{"device.peak_fp32_flops", false, false, func(c Cluster) float64 { return c.Device.PeakFP32 }},
	{"device.memory_bytes", false, false, func(c Cluster) float64 { return c.Device.MemoryBytes }},
	{"device.memory_bandwidth", false, false, func(c Cluster) float64 { return c.Device.MemoryBandwidth }},
	{"intra_node.bandwidth", false, false, func(c Cluster) float64 { return c.Intra.Bandwidth }},
	{"intra_node.latency", true, false, func(c Cluster) float64 { return c.Intra.Latency }},
	{"inter_node.bandwidth", false, false, func(c Cluster) float64 { return c.Inter.Bandwidth }},
	{"inter_node.latency", true, false, func(c Cluster) float64 { return c.Inter.Latency }},
}

func lookup(m map[string]any, key string) bool {
	parts := strings.Split(key, ".")
	for i, p := range parts {
		v, ok := m[p]
		if !ok {
			return false
		}
		if i == len(parts)-1 {
			return true
		}
		if m, ok = v.(map[string]any); !ok {
			return false
		}
	}
	return false
}

func (c Cluster) validate(present map[string]any) error {
	switch c.Device.Kind {
	case "gpu", "cpu":
	default:
		return fmt.Errorf("device.kind %q: want \"gpu\" or \"cpu\"", c.Device.Kind)
	}
	for _, r := range required {
		if r.cpuOnly && !c.CPU() {
			if lookup(present, r.key) {
				return fmt.Errorf("%s is only for device.kind = \"cpu\"", r.key)
			}
			continue
		}
		if !lookup(present, r.key) {
			return fmt.Errorf("missing key %s", r.key)
		}
		if r.positive == nil {
			continue
		}
		v := r.positive(c)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%s = %g: must be a finite number", r.key, v)
		}
		if v < 0 || v == 0 && !r.zeroOK {
			return fmt.Errorf("%s = %g: must be %s", r.key, v, map[bool]string{true: ">= 0", false: "> 0"}[r.zeroOK])
		}
	}
	if c.Name == "" {
		return fmt.Errorf("name must not be empty")
	}
	if c.Device.MemoryBytes >= 1<<60 {
		return fmt.Errorf("device.memory_bytes = %g: more than an exbibyte; give the bytes of one device", c.Device.MemoryBytes)
	}
	if c.Device.PeakFP8 > 0 && c.Device.PeakFP8 < c.Device.PeakBF16 {
		return fmt.Errorf("device.peak_fp8_flops %g is below peak_bf16_flops %g", c.Device.PeakFP8, c.Device.PeakBF16)
	}
	if c.Nodes > 1 && c.Inter.Bandwidth > c.Intra.Bandwidth {
		return fmt.Errorf("inter_node.bandwidth %g exceeds intra_node.bandwidth %g", c.Inter.Bandwidth, c.Intra.Bandwidth)
	}
	return nil
}

// WithWorld returns c resized to world ranks: whole nodes of
// DevicesPerNode, or one node of world ranks when world is smaller.
func (c Cluster) WithWorld(world int) (Cluster, error) {
	if world < 1 {
		return c, fmt.Errorf("cluster %s: %d ranks", c.Name, world)
	}
	if world <= c.DevicesPerNode {
		if c.CPU() {
			c.Nodes, c.DevicesPerNode = 1, world
			return c, nil
		}
		c.Nodes = 1
		if world < c.DevicesPerNode {
			c.DevicesPerNode = world
		}
		return c, nil
	}
	if world%c.DevicesPerNode != 0 {
		return c, fmt.Errorf("cluster %s: %d ranks is not a whole number of %d-device nodes", c.Name, world, c.DevicesPerNode)
	}
	c.Nodes = world / c.DevicesPerNode
	return c, nil
}
