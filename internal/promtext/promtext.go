// Package promtext parses the Prometheus text exposition format (version
// 0.0.4): samples with their labels, values and optional timestamps,
// "# HELP" and "# TYPE" lines checked, other comments skipped. A line
// that breaks the format is an error naming its line number.
//
// Grammar of a sample line (spaces or tabs between tokens):
//
//	name [ "{" label "=" "\"" value "\"" { "," label "=" "\"" value "\"" } [ "," ] "}" ] number [ timestamp ]
//
// with name [a-zA-Z_:][a-zA-Z0-9_:]*, label [a-zA-Z_][a-zA-Z0-9_]*, a
// label value's escapes \\ \" \n, number a float (NaN, +Inf, -Inf too)
// and timestamp an integer of milliseconds.
package promtext

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Sample is one sample line.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
	// Timestamp is in milliseconds since the Unix epoch, when HasTimestamp.
	Timestamp    int64
	HasTimestamp bool
}

// Types of a "# TYPE" line.
var types = map[string]bool{"counter": true, "gauge": true, "histogram": true, "summary": true, "untyped": true}

// Parse reads an exposition. It returns the samples in order, or the
// first error, "line N: ...".
func Parse(r io.Reader) ([]Sample, error) {
	var out []Sample
	typed := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		var err error
		if t := strings.TrimLeft(line, " \t"); strings.HasPrefix(t, "#") {
			err = comment(t, typed)
		} else {
			var s Sample
			if s, err = sample(line); err == nil {
				out = append(out, s)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("promtext: %w", err)
	}
	return out, nil
}

// comment checks a "# HELP name text" or "# TYPE name type" line; other
// comments pass.
func comment(line string, typed map[string]bool) error {
	f := strings.Fields(strings.TrimPrefix(line, "#"))
	if len(f) == 0 || (f[0] != "HELP" && f[0] != "TYPE") {
		return nil
	}
	if len(f) < 2 || !validName(f[1]) {
		return fmt.Errorf("# %s without a valid metric name: %q", f[0], line)
	}
	if f[0] == "HELP" {
		return nil
	}
	if len(f) != 3 || !types[f[2]] {
		return fmt.Errorf("# TYPE %s: want one of counter, gauge, histogram, summary, untyped: %q", f[1], line)
	}
	if typed[f[1]] {
		return fmt.Errorf("second # TYPE line for %s", f[1])
	}
	typed[f[1]] = true
	return nil
}

func validName(s string) bool {
	for i, c := range s {
		if !(c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return s != ""
}

func validLabel(s string) bool { return validName(s) && !strings.Contains(s, ":") }

// sample parses a sample line.
func sample(line string) (Sample, error) {
	var s Sample
	i := 0
	for i < len(line) && line[i] != '{' && line[i] != ' ' && line[i] != '\t' {
		i++
	}
	s.Name = line[:i]
	if !validName(s.Name) {
		return s, fmt.Errorf("invalid metric name %q", s.Name)
	}
	rest := line[i:]
	if strings.HasPrefix(rest, "{") {
		var err error
		if s.Labels, rest, err = labels(rest[1:]); err != nil {
			return s, fmt.Errorf("%s: %w", s.Name, err)
		}
	}
	f := strings.Fields(rest)
	if len(f) == 0 || len(f) > 2 || (rest != "" && rest[0] != ' ' && rest[0] != '\t') {
		return s, fmt.Errorf("%s: want a value and an optional timestamp after the name and labels, got %q", s.Name, strings.TrimSpace(rest))
	}
	v, err := value(f[0])
	if err != nil {
		return s, fmt.Errorf("%s: value %q: %w", s.Name, f[0], err)
	}
	s.Value = v
	if len(f) == 2 {
		if s.Timestamp, err = strconv.ParseInt(f[1], 10, 64); err != nil {
			return s, fmt.Errorf("%s: timestamp %q: want integer milliseconds", s.Name, f[1])
		}
		s.HasTimestamp = true
	}
	return s, nil
}

// value parses a sample value: a Go float, or NaN, +Inf, -Inf.
func value(s string) (float64, error) {
	switch s {
	case "NaN":
		return math.NaN(), nil
	case "+Inf", "Inf":
		return math.Inf(1), nil
	case "-Inf":
		return math.Inf(-1), nil
	}
	if strings.ContainsAny(s, "nNiI_xXpP") { // ParseFloat's "nan", "inf", underscores, hex: not the format's
		return 0, errors.New("not a number")
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, errors.New("not a number")
	}
	return v, nil
}

// labels parses `name="value",...}` (after the brace) and returns the
// labels and the text after the closing brace.
func labels(s string) (map[string]string, string, error) {
	out := map[string]string{}
	for {
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, "}") {
			return out, s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, "", fmt.Errorf("label without '=' in %q", s)
		}
		name := strings.TrimSpace(s[:eq])
		if !validLabel(name) {
			return nil, "", fmt.Errorf("invalid label name %q", name)
		}
		if _, dup := out[name]; dup {
			return nil, "", fmt.Errorf("label %s twice", name)
		}
		s = strings.TrimLeft(s[eq+1:], " \t")
		if !strings.HasPrefix(s, `"`) {
			return nil, "", fmt.Errorf("label %s: value not quoted", name)
		}
		var v strings.Builder
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] != '\\' {
				v.WriteByte(s[i])
				continue
			}
			if i++; i == len(s) {
				break
			}
			switch s[i] {
			case '\\', '"':
				v.WriteByte(s[i])
			case 'n':
				v.WriteByte('\n')
			default:
				return nil, "", fmt.Errorf(`label %s: unknown escape \%c`, name, s[i])
			}
		}
		if i >= len(s) {
			return nil, "", fmt.Errorf("label %s: unterminated value", name)
		}
		out[name] = v.String()
		s = strings.TrimLeft(s[i+1:], " \t")
		switch {
		case strings.HasPrefix(s, ","):
			s = s[1:]
		case strings.HasPrefix(s, "}"):
		default:
			return nil, "", fmt.Errorf("label %s: want ',' or '}' after its value", name)
		}
	}
}
