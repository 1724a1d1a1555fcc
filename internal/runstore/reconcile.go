package runstore

import (
	"context"
	"fmt"
	"time"

	"github.com/titan-go/titan/internal/process"
)

// Heartbeats. A recording process that is killed (SIGKILL, the
// out-of-memory killer, a lost node) cannot record how its run ended, so
// its run would stay "running" for ever. Its Recorder therefore records a
// heartbeat every Options.Heartbeat, and Reconcile, which the readers of
// the store call (titan runs ...), marks such runs interrupted: at once
// when the recording process ran on this host and is gone, else once no
// heartbeat came for StaleAfter. A heartbeat that arrives later (the
// store was unreachable, not the process dead) sets the run running again.

// StaleAfter is how long a running run may go without a heartbeat before
// Reconcile takes it for interrupted: ten heartbeats of the default
// interval, so that a store that was briefly unreachable is not mistaken
// for a dead run.
const StaleAfter = 5 * time.Minute

// reconciledPrefix starts the error text of a run Reconcile interrupted;
// a later heartbeat revives only such runs.
const reconciledPrefix = "no end recorded: "

// Reconcile marks interrupted the running runs whose recording process is
// gone: those recorded from host (this machine's name) by a pid that no
// longer runs, and those without a heartbeat for longer than stale (any
// host). It returns how many it marked. now is the current time.
func (s *Store) Reconcile(ctx context.Context, host string, now time.Time, stale time.Duration) (int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT run_id, host, pid, heartbeat_at, started_at FROM runs WHERE status = 'running'`)
	if err != nil {
		return 0, s.wrap(err)
	}
	type mark struct {
		id, reason string
		at         time.Time
	}
	var marks []mark
	for rows.Next() {
		var id, h string
		var pid *int64
		var beat, started any
		if err := rows.Scan(&id, &h, &pid, &beat, &started); err != nil {
			rows.Close()
			return 0, s.wrap(err)
		}
		last, err := scanTime(beat)
		if err == nil && last == nil {
			last, err = scanTime(started)
		}
		if err != nil || last == nil {
			rows.Close()
			return 0, fmt.Errorf("run %s: %v", id, err)
		}
		who := "the recording process on " + h
		if pid != nil {
			who = fmt.Sprintf("the recording process (pid %d on %s)", *pid, h)
		}
		switch {
		case pid != nil && h == host && !process.Alive(int(*pid)):
			marks = append(marks, mark{id, fmt.Sprintf("%s%s is gone (killed, e.g. by SIGKILL or the out-of-memory killer); last heartbeat %s",
				reconciledPrefix, who, last.Format(time.RFC3339)), *last})
		case now.Sub(*last) > stale:
			marks = append(marks, mark{id, fmt.Sprintf("%sno heartbeat from %s since %s (more than %s)",
				reconciledPrefix, who, last.Format(time.RFC3339), stale), *last})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, s.wrap(err)
	}
	for _, m := range marks {
		if _, err := s.db.ExecContext(ctx, s.q(`UPDATE runs SET status = 'interrupted', error = ?, ended_at = ? WHERE run_id = ? AND status = 'running'`),
			m.reason, s.timeArg(m.at), m.id); err != nil {
			return 0, s.wrap(fmt.Errorf("marking run %s interrupted: %w", m.id, err))
		}
	}
	return len(marks), nil
}
