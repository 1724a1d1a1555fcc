package launch

import (
	"fmt"
	"strconv"
	"strings"
)

// maxNodelistHosts bounds ExpandNodelist so that a typo such as
// "n[0-99999999]" fails instead of exhausting memory.
const maxNodelistHosts = 1 << 20

// ExpandNodelist expands a Slurm host list such as "node[01-04,07]",
// "a,b", "host" or "rack[1-2]-n[1-3]" into host names, in order.
// Numeric ranges keep the zero padding of their lower bound ("n[08-10]"
// gives n08, n09, n10). Several bracket groups in one name expand to their
// cartesian product, the last group varying fastest.
func ExpandNodelist(list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return nil, fmt.Errorf("empty node list")
	}
	var hosts []string
	for _, item := range splitTopLevel(list) {
		if item == "" {
			return nil, fmt.Errorf("node list %q: empty host name", list)
		}
		expanded, err := expandHost(item, maxNodelistHosts-len(hosts))
		if err != nil {
			return nil, fmt.Errorf("node list %q: %w", list, err)
		}
		hosts = append(hosts, expanded...)
	}
	return hosts, nil
}

// FirstHost returns the first host of a Slurm host list; see ExpandNodelist.
func FirstHost(list string) (string, error) {
	// Expanding only the first top-level item keeps a huge list cheap.
	items := splitTopLevel(strings.TrimSpace(list))
	if len(items) == 0 || items[0] == "" {
		return "", fmt.Errorf("node list %q: empty host name", list)
	}
	hosts, err := expandHost(items[0], maxNodelistHosts)
	if err != nil {
		return "", fmt.Errorf("node list %q: %w", list, err)
	}
	return hosts[0], nil
}

// splitTopLevel splits s at the commas outside brackets.
func splitTopLevel(s string) []string {
	var items []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				items = append(items, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(items, strings.TrimSpace(s[start:]))
}

// expandHost expands one host pattern with zero or more bracket groups,
// producing at most limit names.
func expandHost(pattern string, limit int) ([]string, error) {
	open := strings.IndexByte(pattern, '[')
	if open < 0 {
		if strings.ContainsAny(pattern, "]") {
			return nil, fmt.Errorf("unbalanced ']' in %q", pattern)
		}
		return []string{pattern}, nil
	}
	end := strings.IndexByte(pattern[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unbalanced '[' in %q", pattern)
	}
	end += open
	prefix, body, rest := pattern[:open], pattern[open+1:end], pattern[end+1:]
	if strings.ContainsAny(prefix, "]") || strings.ContainsAny(body, "[") {
		return nil, fmt.Errorf("malformed brackets in %q", pattern)
	}
	values, err := expandRanges(body, limit)
	if err != nil {
		return nil, fmt.Errorf("host %q: %w", pattern, err)
	}
	tails, err := expandHost(rest, limit)
	if err != nil {
		return nil, err
	}
	if len(values)*len(tails) > limit {
		return nil, fmt.Errorf("host %q expands to more than %d names", pattern, limit)
	}
	out := make([]string, 0, len(values)*len(tails))
	for _, v := range values {
		for _, t := range tails {
			out = append(out, prefix+v+t)
		}
	}
	return out, nil
}

// expandRanges expands the inside of one bracket group, e.g. "01-04,07".
func expandRanges(body string, limit int) ([]string, error) {
	if body == "" {
		return nil, fmt.Errorf("empty brackets")
	}
	var out []string
	for _, part := range strings.Split(body, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		if !isDigits(lo) || (isRange && !isDigits(hi)) {
			return nil, fmt.Errorf("bad range %q (want N or N-M with decimal digits)", part)
		}
		if !isRange {
			out = append(out, lo)
			continue
		}
		a, errA := strconv.Atoi(lo)
		b, errB := strconv.Atoi(hi)
		if errA != nil || errB != nil {
			return nil, fmt.Errorf("bad range %q: number too large", part)
		}
		if b < a {
			return nil, fmt.Errorf("bad range %q: end below start", part)
		}
		if b-a+1 > limit-len(out) {
			return nil, fmt.Errorf("range %q expands to more than %d names", part, limit)
		}
		width := len(lo)
		for v := a; v <= b; v++ {
			out = append(out, fmt.Sprintf("%0*d", width, v))
		}
	}
	return out, nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ParseTasksPerNode expands Slurm's SLURM_TASKS_PER_NODE notation, such as
// "2(x3),1", into one task count per node: [2 2 2 1].
func ParseTasksPerNode(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("empty tasks-per-node list")
	}
	var counts []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		num, rep, hasRep := strings.Cut(part, "(x")
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("tasks per node %q: bad count %q", s, part)
		}
		times := 1
		if hasRep {
			r, ok := strings.CutSuffix(rep, ")")
			times, err = strconv.Atoi(r)
			if !ok || err != nil || times < 1 {
				return nil, fmt.Errorf("tasks per node %q: bad repeat %q", s, part)
			}
			if times > maxNodelistHosts-len(counts) {
				return nil, fmt.Errorf("tasks per node %q: more than %d nodes", s, maxNodelistHosts)
			}
		}
		for range times {
			counts = append(counts, n)
		}
	}
	return counts, nil
}
