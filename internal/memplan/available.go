package memplan

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Available returns the bytes of memory this process may still use: the
// smaller of /proc/meminfo's MemAvailable and what its cgroup's limit
// leaves (cgroup v2 memory.max − memory.current, or v1
// memory.limit_in_bytes − memory.usage_in_bytes). It returns an error when
// neither can be read (not Linux).
func Available() (int64, error) {
	return available("/proc", "/sys/fs/cgroup")
}

// available is Available with the roots of /proc and /sys/fs/cgroup.
func available(proc, cgroupRoot string) (int64, error) {
	best := int64(-1)
	take := func(n int64) {
		if n >= 0 && (best < 0 || n < best) {
			best = n
		}
	}
	if n, err := memAvailable(filepath.Join(proc, "meminfo")); err == nil {
		take(n)
	}
	if n, ok := cgroupLeft(proc, cgroupRoot); ok {
		take(n)
	}
	if best < 0 {
		return 0, fmt.Errorf("memplan: cannot read the available memory (%s/meminfo, cgroup limits)", proc)
	}
	return best, nil
}

// memAvailable reads MemAvailable (kB) from a meminfo file.
func memAvailable(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("memplan: %s: MemAvailable %q: %w", path, fields[1], err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("memplan: %s has no MemAvailable line", path)
}

// cgroupLeft returns the memory the process's cgroup limit leaves, and
// whether a limit is set.
func cgroupLeft(proc, root string) (int64, bool) {
	v2, v1 := cgroupPaths(filepath.Join(proc, "self", "cgroup"))
	// cgroup v2: the process's own group, then its ancestors (a limit on
	// any of them applies).
	if v2 != "" || v1 == "" {
		for dir := filepath.Join(root, v2); ; dir = filepath.Dir(dir) {
			if limit, ok := readBytes(filepath.Join(dir, "memory.max")); ok {
				used, _ := readBytes(filepath.Join(dir, "memory.current"))
				return max(0, limit-used), true
			}
			if len(dir) <= len(root) {
				break
			}
		}
	}
	for _, dir := range []string{filepath.Join(root, "memory", v1), filepath.Join(root, "memory")} {
		if limit, ok := readBytes(filepath.Join(dir, "memory.limit_in_bytes")); ok && limit < 1<<60 {
			used, _ := readBytes(filepath.Join(dir, "memory.usage_in_bytes"))
			return max(0, limit-used), true
		}
	}
	return 0, false
}

// cgroupPaths reads /proc/self/cgroup: the v2 path ("0::/path") and the v1
// memory controller's path.
func cgroupPaths(path string) (v2, v1 string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			if ctl == "memory" {
				v1 = parts[2]
			}
		}
	}
	return v2, v1
}

// readBytes reads a cgroup byte count; "max" and unreadable files are no
// limit.
func readBytes(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}
