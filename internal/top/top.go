// Package top is titan top: a live view of a running job's ranks on a
// terminal, from the launcher's Prometheus endpoint (titan train
// --metrics-addr, package livemetrics).
//
// Each refresh scrapes the endpoint, parses it (package promtext) into a
// View and renders the job line — step, loss, steps/s, tokens/s, MFU,
// straggler reports, the snapshot's age — over a table with one row per
// rank: its host, step time, compute time (the step less the time it was
// blocked in communication), compute share, peak memory and a bar of its
// step time against the slowest rank's (█ compute, ░ communication). On a
// terminal the view is redrawn in place every interval; with Once, or
// when the output is not a terminal, it is printed once.
package top

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/titan-go/titan/internal/livemetrics"
	"github.com/titan-go/titan/internal/promtext"
)

// Job is the job's line of the view.
type Job struct {
	ID string
	// Up is false before rank 0 has reported its first step.
	Up                              bool
	Step, Steps                     int
	Loss, StepsPerSec, TokensPerSec float64
	MFU                             float64 // percent
	Stragglers                      int
	Updated                         time.Time
}

// Rank is one rank's row.
type Rank struct {
	Rank             int
	Host             string
	StepS, ComputeS  float64
	MemBytes         float64
	hasStep, hasComp bool
}

// View is what one scrape shows.
type View struct {
	Job
	Ranks []Rank // by rank
}

// FromSamples builds the view of an exposition of package livemetrics.
func FromSamples(samples []promtext.Sample) (View, error) {
	var v View
	seenUp := false
	ranks := map[int]*Rank{}
	for _, s := range samples {
		if id, ok := s.Labels["job_id"]; ok && v.ID == "" {
			v.ID = id
		}
		if rs, ok := s.Labels["rank"]; ok {
			n, err := strconv.Atoi(rs)
			if err != nil || n < 0 {
				return v, fmt.Errorf("%s: rank label %q: want a rank number", s.Name, rs)
			}
			r := ranks[n]
			if r == nil {
				r = &Rank{Rank: n, Host: s.Labels["host"]}
				ranks[n] = r
			}
			switch s.Name {
			case livemetrics.MetricRankStep:
				r.StepS, r.hasStep = s.Value, true
			case livemetrics.MetricRankCompute:
				r.ComputeS, r.hasComp = s.Value, true
			case livemetrics.MetricRankMemory:
				r.MemBytes = s.Value
			}
			continue
		}
		switch s.Name {
		case livemetrics.MetricUp:
			v.Up, seenUp = s.Value == 1, true
		case livemetrics.MetricStep:
			v.Step = int(s.Value)
		case livemetrics.MetricSteps:
			v.Steps = int(s.Value)
		case livemetrics.MetricLoss:
			v.Loss = s.Value
		case livemetrics.MetricStepsPerSec:
			v.StepsPerSec = s.Value
		case livemetrics.MetricTokensPerSec:
			v.TokensPerSec = s.Value
		case livemetrics.MetricMFU:
			v.MFU = s.Value
		case livemetrics.MetricStragglers:
			v.Stragglers = int(s.Value)
		case livemetrics.MetricLastUpdate:
			sec, frac := math.Modf(s.Value)
			v.Updated = time.Unix(int64(sec), int64(frac*1e9))
		}
	}
	if !seenUp {
		return v, fmt.Errorf("no %s sample: not a titan metrics endpoint", livemetrics.MetricUp)
	}
	for _, r := range ranks {
		v.Ranks = append(v.Ranks, *r)
	}
	sort.Slice(v.Ranks, func(i, j int) bool { return v.Ranks[i].Rank < v.Ranks[j].Rank })
	return v, nil
}

// BarWidth is the width of a rank's bar in characters.
const BarWidth = 30

// Render writes the view: the job line, then the rank table. rows > 0
// limits the table to that many rows: the slowest ranks (by step time),
// in rank order, and a line counting the others.
func Render(w io.Writer, source string, v View, now time.Time, rows int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "titan top  %s  job %s", source, v.ID)
	if !v.Up {
		b.WriteString("\nwaiting for the job's first step\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	if !v.Updated.IsZero() {
		fmt.Fprintf(&b, "  updated %.1f s ago", math.Max(0, now.Sub(v.Updated).Seconds()))
	}
	fmt.Fprintf(&b, "\nstep %d/%d  loss %.4f  %.2f steps/s  %.0f tokens/s  mfu %.2f%%  stragglers reported %d\n",
		v.Step, v.Steps, v.Loss, v.StepsPerSec, v.TokensPerSec, v.MFU, v.Stragglers)
	shown, hidden := v.Ranks, 0
	if rows > 0 && len(shown) > rows {
		shown, hidden = slowest(v.Ranks, rows-1), len(v.Ranks)-(rows-1)
	}
	hostW := len("host")
	slow := 0.0
	for _, r := range v.Ranks {
		slow = math.Max(slow, r.StepS)
	}
	for _, r := range shown {
		hostW = max(hostW, len(r.Host))
	}
	fmt.Fprintf(&b, "%5s  %-*s  %9s  %10s  %7s  %8s  %s\n", "rank", hostW, "host", "step ms", "compute ms", "compute", "mem GiB", "step time (█ compute, ░ communication)")
	for _, r := range shown {
		share := "-"
		if r.hasStep && r.hasComp && r.StepS > 0 {
			share = fmt.Sprintf("%.1f%%", 100*r.ComputeS/r.StepS)
		}
		fmt.Fprintf(&b, "%5d  %-*s  %9.2f  %10.2f  %7s  %8.3f  %s\n", r.Rank, hostW, r.Host, 1e3*r.StepS, 1e3*r.ComputeS, share, r.MemBytes/(1<<30), bar(r, slow))
	}
	if hidden > 0 {
		noun := "ranks"
		if hidden == 1 {
			noun = "rank"
		}
		fmt.Fprintf(&b, "(%d faster %s not shown)\n", hidden, noun)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// bar draws r's step time against the slowest step time.
func bar(r Rank, slow float64) string {
	if !(slow > 0) {
		return ""
	}
	total := int(math.Round(BarWidth * r.StepS / slow))
	comp := min(total, max(0, int(math.Round(BarWidth*r.ComputeS/slow))))
	return strings.Repeat("█", comp) + strings.Repeat("░", total-comp)
}

// slowest returns the n ranks of the longest step time, in rank order.
func slowest(ranks []Rank, n int) []Rank {
	s := append([]Rank(nil), ranks...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].StepS > s[j].StepS })
	s = s[:max(0, n)]
	sort.Slice(s, func(i, j int) bool { return s[i].Rank < s[j].Rank })
	return s
}

// URL turns --metrics-addr's value, HOST:PORT or an http(s) URL, into the
// URL to scrape (path /metrics when the URL has none).
func URL(addr string) (string, error) {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--metrics-addr %q: want HOST:PORT or an http:// URL", strings.TrimPrefix(addr, "http://"))
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/metrics"
	}
	return u.String(), nil
}

// Scrape fetches and parses the endpoint at u.
func Scrape(ctx context.Context, client *http.Client, u string) (View, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return View{}, err
	}
	resp, err := client.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return View{}, fmt.Errorf("%w (is a job running with --metrics-addr on that address?)", err)
	}
	if err != nil {
		return View{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return View{}, fmt.Errorf("%s: %s: %s", u, resp.Status, strings.TrimSpace(string(msg)))
	}
	samples, err := promtext.Parse(resp.Body)
	if err != nil {
		return View{}, fmt.Errorf("%s: %w", u, err)
	}
	v, err := FromSamples(samples)
	if err != nil {
		return View{}, fmt.Errorf("%s: %w", u, err)
	}
	return v, nil
}

// Options configure Run.
type Options struct {
	// URL is the endpoint (see URL).
	URL string
	// Interval between refreshes on a terminal.
	Interval time.Duration
	// Once prints one view and returns; so does a non-terminal output.
	Once bool
	// Terminal says the output is a terminal: redraw in place.
	Terminal bool
	// Rows limits the rank table (0: all; a terminal's height, less the
	// header lines, where known).
	Rows int
}

// ANSI sequences of an in-place redraw.
const (
	home      = "\033[H"
	clearEOL  = "\033[K"
	clearDown = "\033[J"
)

// Run shows the view on out until ctx ends (terminal) or once. Printing
// once, a failed scrape is the error; on a terminal it is shown and the
// next refresh tries again.
func Run(ctx context.Context, out io.Writer, o Options) error {
	if o.Interval <= 0 {
		return errors.New("--interval: want a positive duration")
	}
	client := &http.Client{Timeout: max(2*time.Second, o.Interval)}
	once := o.Once || !o.Terminal
	if !once {
		io.WriteString(out, home+"\033[2J")
	}
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for {
		v, err := Scrape(ctx, client, o.URL)
		if once {
			if err != nil {
				return err
			}
			return Render(out, o.URL, v, time.Now(), o.Rows)
		}
		var b strings.Builder
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintf(&b, "titan top  %s\n%v (next try in %s)\n", o.URL, err, o.Interval)
		} else {
			Render(&b, o.URL, v, time.Now(), o.Rows)
		}
		frame := home + strings.ReplaceAll(b.String(), "\n", clearEOL+"\n") + clearDown
		if _, err := io.WriteString(out, frame); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
