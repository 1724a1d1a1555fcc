package train

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/runstore"
	"github.com/titan-go/titan/internal/version"
)

// storeCloseTimeout bounds the run store's last flush when a run ends;
// what is not written by then stays in the dump folder's spool.
const storeCloseTimeout = 5 * time.Second

// startRecording starts recording the run in the run store
// (metrics.enable_db, metrics.db): on rank 0 only, in the background. A
// store that cannot be resolved is a warning, not an error: the run
// trains unrecorded.
func (tr *Trainer) startRecording() {
	job := tr.Job
	if tr.dist.Rank != 0 || !job.Metrics.EnableDB {
		return
	}
	target, err := runstore.Target(job.Metrics.DB, os.Getenv)
	if err != nil {
		tr.log.Printf("titan: warning: run store: %v; this run is not recorded", err)
		return
	}
	recipe, err := job.TOML()
	if err != nil {
		tr.log.Printf("titan: warning: run store: %v; this run is not recorded", err)
		return
	}
	dump := job.Job.DumpFolder
	if abs, err := filepath.Abs(dump); err == nil {
		dump = abs
	}
	host, _ := os.Hostname()
	start := time.Now()
	resumed := tr.Step // the checkpoint step this run resumed from (0: a fresh start)
	run := runstore.Run{
		ID: runstore.NewID(start), RecipePath: tr.RecipePath, Model: job.Model.Name, Flavor: job.Model.Flavor,
		Layout: tr.mesh.String(), World: tr.dist.World, Host: host, Version: version.String(),
		Description: job.Job.Description, DumpFolder: dump, StepsPlanned: job.Training.Steps, ResumedFrom: &resumed,
		TokensPerStep: int64(tr.accum * job.Training.LocalBatchSize * job.Training.SeqLen * tr.dataRanks()),
		Recipe:        recipe, StartedAt: start, PID: os.Getpid(),
	}
	spool := ""
	if job.Job.DumpFolder != "" {
		spool = filepath.Join(job.Job.DumpFolder, runstore.SpoolFile)
	}
	tr.rec = runstore.Start(run, runstore.Options{Target: target, Spool: spool})
	tr.log.Printf("titan: run %s, recording to %s (spooled into the dump folder while it cannot be reached)", run.ID, runstore.Redact(target))
}

// recordStep hands a logged step to the run store.
func (tr *Trainer) recordStep(r metrics.Record) {
	if tr.rec == nil {
		return
	}
	tr.rec.Step(r)
	tr.storeNotes()
}

// storeNotes prints the run store's messages (store down, back, spool
// flushed).
func (tr *Trainer) storeNotes() {
	for _, n := range tr.rec.Notes() {
		tr.log.Printf("titan: run store: %s", n)
	}
}

// endRecording records how the run ended (runErr: nil finished,
// context.Canceled interrupted, else failed) and flushes the store.
func (tr *Trainer) endRecording(runErr error) {
	if tr.rec == nil {
		return
	}
	errText := ""
	if runErr != nil {
		errText = runErr.Error()
	}
	if runstore.StatusOf(runErr) == runstore.Interrupted {
		errText = fmt.Sprintf("stopped after step %d (Ctrl-C or SIGTERM), its checkpoint saved; resume with the same command", tr.Step)
		if !SavesCheckpoints(tr.Job) {
			errText = fmt.Sprintf("stopped after step %d (Ctrl-C or SIGTERM); checkpoint.enable is off, so nothing was saved to resume from", tr.Step)
		}
	}
	rec := tr.rec
	tr.rec = nil
	_, err := rec.Close(runstore.StatusOf(runErr), errText, storeCloseTimeout)
	for _, n := range rec.Notes() {
		tr.log.Printf("titan: run store: %s", n)
	}
	if err != nil {
		tr.log.Printf("titan: warning: %v", err)
	}
}

// RecordingID is the run store ID of the run in progress ("" when it is
// not recorded).
func (tr *Trainer) RecordingID() string {
	if tr.rec == nil {
		return ""
	}
	return tr.rec.ID()
}
