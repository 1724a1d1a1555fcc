package train

import (
	"fmt"
	"os"
	"time"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/livemetrics"
	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/straggler"
)

// The stop agreement's all-reduce vector: the stop vote, rank 0's "live
// metrics on" flag (so that every rank, on every node, reports its
// memory), then statsPerRank figures of each rank: compute seconds, step
// seconds, memory GiB.
const (
	statsPerRank = 3
	statsStart   = 2
)

// observer follows every rank's step times: each rank measures its step
// and its compute time (the step less comm.BlockedTime), the figures
// reach rank 0 in the all-reduce that agree runs anyway before each step,
// and rank 0 names stragglers (package straggler) and, when the launcher
// serves live metrics, writes the snapshot it reads (package
// livemetrics).
type observer struct {
	rank, world int
	hosts       []string
	det         *straggler.Detector
	delay       time.Duration // the TITAN_TEST_SLOW_RANK test hook
	liveFile    string        // livemetrics.EnvFile; "" when off
	wantMem     bool          // rank 0 serves live metrics: report memory
	steps       int
	// figures of the whole job per step, for the live snapshot
	tokensPerStep, flopsPerToken, peakFLOPS float64

	start, lastAgree       time.Time
	blocked                time.Duration
	compute, stepTime, mem float64 // this rank's last step
	have                   bool
	lastStep               int
	loss                   float64
	stragglers             int
	vec                    []float64
	report                 func(format string, args ...any)
}

// newObserver gathers the ranks' host names (a collective on every rank).
func (tr *Trainer) newObserver() (*observer, error) {
	o := &observer{rank: tr.dist.Rank, world: tr.dist.World, liveFile: os.Getenv(livemetrics.EnvFile), steps: tr.Job.Training.Steps,
		vec: make([]float64, statsStart+statsPerRank*tr.dist.World), report: tr.log.Printf}
	var err error
	if o.delay, err = straggler.Delay(o.rank); err != nil {
		return nil, err
	}
	if o.hosts, err = gatherHosts(tr.dist.Group, tr.dist.World); err != nil {
		return nil, fmt.Errorf("gathering the ranks' host names: %w", err)
	}
	o.det = straggler.New(o.world, o.hosts)
	T := tr.Job.Training.SeqLen
	o.tokensPerStep = float64(tr.accum * tr.Job.Training.LocalBatchSize * T * tr.dataRanks())
	o.flopsPerToken = tr.fam.FLOPsPerToken(T)
	o.peakFLOPS = tr.peakFLOPS
	return o, nil
}

// hostLen bounds a host name in the gather.
const hostLen = 64

func gatherHosts(g comm.Group, world int) ([]string, error) {
	host, _ := os.Hostname()
	if world == 1 || g == nil {
		return []string{host}, nil
	}
	mine := make([]int32, hostLen)
	for i := 0; i < len(host) && i < hostLen; i++ {
		mine[i] = int32(host[i])
	}
	all := make([]int32, hostLen*world)
	if err := g.AllGather(commCtx, comm.I32(mine), comm.I32(all)); err != nil {
		return nil, err
	}
	out := make([]string, world)
	for r := range out {
		var b []byte
		for _, c := range all[r*hostLen : (r+1)*hostLen] {
			if c == 0 {
				break
			}
			b = append(b, byte(c))
		}
		out[r] = string(b)
	}
	return out, nil
}

// begin starts measuring a step.
func (o *observer) begin() {
	o.start, o.blocked = time.Now(), comm.BlockedTime()
	if o.delay > 0 {
		time.Sleep(o.delay) // test hook: this rank computes slower
	}
}

// end finishes measuring the step that brought the run to step.
func (o *observer) end(step int, loss float64) {
	d := time.Since(o.start)
	o.stepTime = d.Seconds()
	o.compute = (d - (comm.BlockedTime() - o.blocked)).Seconds()
	if o.wantMem || o.liveFile != "" {
		o.mem = metrics.PeakRSSGiB()
	}
	o.have, o.lastStep, o.loss = true, step, loss
}

// pack fills the agreement vector: the stop vote, then this rank's
// figures in its slot (zeros elsewhere, so the sum is every rank's).
func (o *observer) pack(stop bool) []float64 {
	clear(o.vec)
	if stop {
		o.vec[0] = 1
	}
	if o.rank == 0 && o.liveFile != "" {
		o.vec[1] = 1
	}
	if o.have {
		s := o.vec[statsStart+statsPerRank*o.rank:]
		s[0], s[1], s[2] = o.compute, o.stepTime, o.mem
	}
	return o.vec
}

// received handles the summed vector on rank 0: straggler reports and
// the live snapshot of the previous step.
func (o *observer) received(v []float64) error {
	now := time.Now()
	period := now.Sub(o.lastAgree)
	first := o.lastAgree.IsZero()
	o.lastAgree = now
	o.wantMem = v[1] > 0
	if o.rank != 0 || !o.have {
		return nil
	}
	compute := make([]time.Duration, o.world)
	for r := range compute {
		compute[r] = time.Duration(v[statsStart+statsPerRank*r] * 1e9)
	}
	for _, rep := range o.det.Observe(o.lastStep, compute) {
		o.stragglers++
		o.report("titan: warning: %s", rep)
	}
	if o.liveFile == "" || first {
		return nil
	}
	s := livemetrics.Snapshot{Time: now, Step: o.lastStep, Steps: o.steps, Loss: o.loss, Stragglers: o.stragglers}
	if p := period.Seconds(); p > 0 {
		s.StepsPerSec = 1 / p
		s.TokensPerSec = o.tokensPerStep / p
		if o.peakFLOPS > 0 {
			s.MFU = 100 * o.flopsPerToken * s.TokensPerSec / o.peakFLOPS
		}
	}
	for r := range o.world {
		f := v[statsStart+statsPerRank*r:]
		s.Ranks = append(s.Ranks, livemetrics.Rank{Rank: r, Host: o.hosts[r], ComputeS: f[0], StepS: f[1], MemGiB: f[2]})
	}
	return livemetrics.Write(o.liveFile, s)
}
