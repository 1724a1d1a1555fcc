package runstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"modernc.org/sqlite"               // database/sql driver "sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/titan-go/titan/internal/metrics"
)

// Status is where a run stands.
type Status string

// The statuses of a run.
const (
	// Running: started and not ended. A run whose process was killed
	// (SIGKILL, a lost node) stays running.
	Running Status = "running"
	// Finished: trained every step.
	Finished Status = "finished"
	// Failed: stopped by an error, recorded in Run.Error.
	Failed Status = "failed"
	// Interrupted: stopped by Ctrl-C or SIGTERM (a checkpoint was saved;
	// the same command resumes it, as a new run).
	Interrupted Status = "interrupted"
)

// StatusOf is the status a run ends with when training returns err: nil
// finished, context.Canceled interrupted, anything else failed.
func StatusOf(err error) Status {
	switch {
	case err == nil:
		return Finished
	case errors.Is(err, context.Canceled):
		return Interrupted
	}
	return Failed
}

// Run is one training run: one `titan train` process (a resumed run is a
// new run, whose steps continue from the checkpoint's).
type Run struct {
	// ID is unique, sortable by start time: "20261201-102653-3fa9"
	// (UTC, then 16 random bits).
	ID string `json:"id"`
	// RecipePath is the recipe file given to titan train ("" for the
	// built-in defaults).
	RecipePath string `json:"recipe_path"`
	// Model and Flavor are model.name and model.flavor.
	Model  string `json:"model"`
	Flavor string `json:"flavor"`
	// Layout is the device mesh, as the log prints it
	// ("pp 1 × dp_replicate 1 × dp_shard 2 × cp 1 × tp 1").
	Layout string `json:"layout"`
	// World is the number of ranks.
	World int `json:"world"`
	// Host is rank 0's host name; Version is titan's (package version).
	Host    string `json:"host"`
	Version string `json:"titan_version"`
	// Description is job.description; DumpFolder job.dump_folder
	// (absolute).
	Description string `json:"description"`
	DumpFolder  string `json:"dump_folder"`
	// StepsPlanned is training.steps.
	StepsPlanned int `json:"steps_planned"`
	// ResumedFrom is the checkpoint step the run resumed from (0: a
	// fresh start; nil: not recorded, as for runs of titan before run
	// store schema 3).
	ResumedFrom *int `json:"resumed_from,omitempty"`
	// TokensPerStep is the number of tokens of one optimizer step (the
	// global batch); step × TokensPerStep is the tokens trained so far.
	TokensPerStep int64 `json:"tokens_per_step"`
	// Recipe is the resolved recipe (config.Job.TOML): titan train
	// --recipe on it trains the same run.
	Recipe string `json:"recipe,omitempty"`
	// StartedAt and EndedAt (nil while running) bound the run.
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	Status    Status     `json:"status"`
	// Error is the error text of a failed run.
	Error string `json:"error,omitempty"`
	// PID is the recording process (rank 0) on Host; Heartbeat the last
	// time it was known to be alive (see Store.Reconcile).
	PID       int        `json:"pid,omitempty"`
	Heartbeat *time.Time `json:"heartbeat_at,omitempty"`
}

// NewID returns a new run ID for a run started at t.
func NewID(t time.Time) string {
	var b [2]byte
	rand.Read(b[:])
	return t.UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}

// Store is an open run store: a SQLite file or a PostgreSQL database at the
// current schema version. Its methods are safe for concurrent use.
type Store struct {
	db     *sql.DB
	pg     bool
	target string
}

// sqliteParams are the connection settings of every SQLite connection:
// wait up to 10 s for another process's write lock, write-ahead logging
// (readers such as `titan runs list` do not block a recording run),
// foreign keys on, and transactions that take the write lock at BEGIN (so
// that two writers wait instead of deadlocking).
const sqliteParams = "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate"

// ErrNoStore is returned by OpenExisting for a SQLite file that does not
// exist.
var ErrNoStore = errors.New("no run store there yet")

// Open opens the run store at target (see ParseTarget), creating the
// SQLite file and its folder when missing, and upgrades its schema to
// SchemaVersion.
func Open(ctx context.Context, target string) (*Store, error) {
	return open(ctx, target, true)
}

// OpenExisting is Open for readers: a SQLite file that does not exist is
// ErrNoStore instead of being created.
func OpenExisting(ctx context.Context, target string) (*Store, error) {
	return open(ctx, target, false)
}

func open(ctx context.Context, target string, create bool) (*Store, error) {
	kind, where, err := ParseTarget(target)
	if err != nil {
		return nil, fmt.Errorf("runstore: %w", err)
	}
	s := &Store{target: target, pg: kind == Postgres}
	if s.pg {
		if s.db, err = sql.Open("pgx", where); err != nil {
			return nil, s.wrap(err)
		}
		s.db.SetMaxOpenConns(4)
		s.db.SetConnMaxIdleTime(time.Minute)
	} else {
		if _, err := os.Stat(where); errors.Is(err, os.ErrNotExist) && !create {
			return nil, fmt.Errorf("runstore: %s: %w", target, ErrNoStore)
		}
		if dir := filepath.Dir(where); create {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, s.wrap(err)
			}
		}
		if s.db, err = sql.Open("sqlite", where+sqliteParams); err != nil {
			return nil, s.wrap(err)
		}
		s.db.SetMaxOpenConns(4)
	}
	// A new SQLite file's first connections race to switch it to WAL,
	// and SQLite answers the losers SQLITE_BUSY at once, without waiting
	// for busy_timeout: retry those for a while.
	giveUp := time.Now().Add(busyFor)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		err = s.migrate(ctx, migrations)
		if err == nil || s.pg || !isBusy(err) || ctx.Err() != nil || time.Now().After(giveUp) {
			break
		}
		time.Sleep(wait)
	}
	if err != nil {
		s.db.Close()
		return nil, s.wrap(err)
	}
	return s, nil
}

// busyFor bounds the retries of a busy SQLite open.
const busyFor = 10 * time.Second

// isBusy reports whether err is SQLite's "database is locked".
func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

// Target is where the store is (as given to Open).
func (s *Store) Target() string { return s.target }

// Backend is SQLite or Postgres.
func (s *Store) Backend() string {
	if s.pg {
		return Postgres
	}
	return SQLite
}

// DB is the underlying database, for queries of one's own (the metrics
// table, Aggify's aggregates).
func (s *Store) DB() *sql.DB { return s.db }

// wrap names the store in err.
func (s *Store) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("runstore %s: %w", Redact(s.target), err)
}

// q rewrites the ? placeholders of query for the backend ($1, $2, ...
// for PostgreSQL). The queries of this package hold no '?' elsewhere.
func (s *Store) q(query string) string {
	if !s.pg {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// timeLayout is how SQLite holds times: RFC 3339 in UTC with
// milliseconds, fixed width, so that text order is time order and
// SQLite's date functions read it.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// timeArg is t as the backend stores it.
func (s *Store) timeArg(t time.Time) any {
	if s.pg {
		return t
	}
	return t.UTC().Format(timeLayout)
}

// scanTime converts a scanned time column (time.Time from PostgreSQL,
// text from SQLite, nil for NULL).
func scanTime(v any) (*time.Time, error) {
	var t time.Time
	switch x := v.(type) {
	case nil:
		return nil, nil
	case time.Time:
		t = x
	case string, []byte:
		var s string
		if b, ok := x.([]byte); ok {
			s = string(b)
		} else {
			s = x.(string)
		}
		var err error
		if t, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return nil, fmt.Errorf("bad time %q: %w", s, err)
		}
	default:
		return nil, fmt.Errorf("bad time %v (%T)", v, v)
	}
	t = t.UTC()
	return &t, nil
}

// An event is one thing the recorder writes: a run's start, one logged
// step, or its end. It is also the spool's line format.
type event struct {
	Kind  string          `json:"kind"` // "run", "step", "beat" or "end"
	RunID string          `json:"run_id"`
	Run   *Run            `json:"run,omitempty"`
	Step  *metrics.Record `json:"step,omitempty"`
	End   *runEnd         `json:"end,omitempty"`
	// At is a heartbeat's time.
	At *time.Time `json:"at,omitempty"`
}

// runEnd is how a run ended.
type runEnd struct {
	Status Status    `json:"status"`
	Error  string    `json:"error,omitempty"`
	At     time.Time `json:"at"`
}

// PutRun records the start of run r. Recording a run whose ID the store
// already has changes nothing (so a replayed spool is harmless).
func (s *Store) PutRun(ctx context.Context, r Run) error {
	return s.apply(ctx, []event{{Kind: "run", RunID: r.ID, Run: &r}})
}

// PutSteps records logged steps of run id, replacing any the store has
// for the same (run, step).
func (s *Store) PutSteps(ctx context.Context, id string, recs []metrics.Record) error {
	evs := make([]event, len(recs))
	for i := range recs {
		evs[i] = event{Kind: "step", RunID: id, Step: &recs[i]}
	}
	return s.apply(ctx, evs)
}

// EndRun records how run id ended.
func (s *Store) EndRun(ctx context.Context, id string, status Status, errText string, at time.Time) error {
	return s.apply(ctx, []event{{Kind: "end", RunID: id, End: &runEnd{Status: status, Error: errText, At: at}}})
}

// metricCols are the metrics table's columns after run_id, in
// metrics.Record order.
const metricCols = "step, loss, grad_norm, lr, tokens_per_sec, tflops, mfu, mem_gib, state_gib, gathered_units, tokens, elapsed_s, val_loss"

// stepChunk is the most steps of one INSERT (13 parameters each: well
// under SQLite's 32766 and PostgreSQL's 65535).
const stepChunk = 256

// apply writes evs in order, in one transaction: all of them or none.
// Every write is idempotent (run starts are inserted once, steps upserted
// on (run_id, step), ends set), so applying the same events again leaves
// the store as it was.
func (s *Store) apply(ctx context.Context, evs []event) (err error) {
	if len(evs) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.wrap(err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
			err = s.wrap(err)
		}
	}()
	var steps []metrics.Record
	stepsOf := ""
	flush := func() error {
		for len(steps) > 0 {
			n := min(len(steps), stepChunk)
			if err := s.upsertSteps(ctx, tx, stepsOf, steps[:n]); err != nil {
				return err
			}
			steps = steps[n:]
		}
		return nil
	}
	for _, ev := range evs {
		if ev.Kind != "step" || ev.RunID != stepsOf {
			if err := flush(); err != nil {
				return err
			}
		}
		switch ev.Kind {
		case "step":
			if ev.Step == nil {
				return fmt.Errorf("step event of run %s without a record", ev.RunID)
			}
			steps, stepsOf = append(steps, *ev.Step), ev.RunID
		case "run":
			if ev.Run == nil {
				return fmt.Errorf("run event %s without a run", ev.RunID)
			}
			if err := s.insertRun(ctx, tx, ev.Run); err != nil {
				return err
			}
		case "beat":
			if ev.At == nil {
				return fmt.Errorf("heartbeat of run %s without a time", ev.RunID)
			}
			// A run Reconcile took for interrupted is alive after all
			// (its store was unreachable): it runs again.
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE runs SET heartbeat_at = ?, status = 'running', error = NULL, ended_at = NULL
WHERE run_id = ? AND (status = 'running' OR (status = 'interrupted' AND error LIKE ?))`),
				s.timeArg(*ev.At), ev.RunID, reconciledPrefix+"%"); err != nil {
				return fmt.Errorf("heartbeat of run %s: %w", ev.RunID, err)
			}
		case "end":
			if ev.End == nil {
				return fmt.Errorf("end event of run %s without an end", ev.RunID)
			}
			e := ev.End
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, error = ?, ended_at = ? WHERE run_id = ?`),
				string(e.Status), nullString(e.Error), s.timeArg(e.At), ev.RunID); err != nil {
				return fmt.Errorf("end of run %s: %w", ev.RunID, err)
			}
		default:
			return fmt.Errorf("unknown event kind %q", ev.Kind)
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *Store) insertRun(ctx context.Context, tx *sql.Tx, r *Run) error {
	status := r.Status
	if status == "" {
		status = Running
	}
	var ended any
	if r.EndedAt != nil {
		ended = s.timeArg(*r.EndedAt)
	}
	var pid any
	if r.PID > 0 {
		pid = r.PID
	}
	var resumed any
	if r.ResumedFrom != nil {
		resumed = *r.ResumedFrom
	}
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO runs (run_id, recipe_path, model, flavor, layout, world, host, titan_version,
	description, dump_folder, steps_planned, tokens_per_step, recipe, started_at, ended_at, status, error, pid, heartbeat_at, resumed_from)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING`),
		r.ID, r.RecipePath, r.Model, r.Flavor, r.Layout, r.World, r.Host, r.Version,
		r.Description, r.DumpFolder, r.StepsPlanned, r.TokensPerStep, r.Recipe, s.timeArg(r.StartedAt), ended, string(status), nullString(r.Error),
		pid, s.timeArg(r.StartedAt), resumed)
	if err != nil {
		return fmt.Errorf("run %s: %w", r.ID, err)
	}
	return nil
}

// upsertSteps writes recs of run id in one INSERT ... ON CONFLICT.
func (s *Store) upsertSteps(ctx context.Context, tx *sql.Tx, id string, recs []metrics.Record) error {
	var b strings.Builder
	b.WriteString("INSERT INTO metrics (run_id, " + metricCols + ") VALUES ")
	args := make([]any, 0, 14*len(recs))
	for i, r := range recs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
		var val any
		if r.ValLoss != nil {
			val = *r.ValLoss
		}
		args = append(args, id, r.Step, r.Loss, r.GradNorm, r.LR, r.TokensPerSec, r.TFLOPs, r.MFU,
			r.MemGiB, r.StateGiB, r.GatheredUnits, r.Tokens, r.ElapsedS, val)
	}
	b.WriteString(" ON CONFLICT (run_id, step) DO UPDATE SET ")
	for i, c := range strings.Split(metricCols, ", ")[1:] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c + " = excluded." + c)
	}
	if _, err := tx.ExecContext(ctx, s.q(b.String()), args...); err != nil {
		return fmt.Errorf("steps %d..%d of run %s: %w", recs[0].Step, recs[len(recs)-1].Step, id, err)
	}
	return nil
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// runCols are the runs table's columns as scanRun reads them.
const runCols = `r.run_id, r.recipe_path, r.model, r.flavor, r.layout, r.world, r.host, r.titan_version,
	r.description, r.dump_folder, r.steps_planned, r.tokens_per_step, r.started_at, r.ended_at, r.status, r.error,
	r.pid, r.heartbeat_at, r.resumed_from`

type scanner interface{ Scan(dest ...any) error }

// scanRun reads runCols (without the recipe) followed by extra.
func scanRun(sc scanner, extra ...any) (Run, error) {
	var r Run
	var started, ended, beat any
	var errText sql.NullString
	var pid, resumed sql.NullInt64
	var status string
	dest := append([]any{&r.ID, &r.RecipePath, &r.Model, &r.Flavor, &r.Layout, &r.World, &r.Host, &r.Version,
		&r.Description, &r.DumpFolder, &r.StepsPlanned, &r.TokensPerStep, &started, &ended, &status, &errText,
		&pid, &beat, &resumed}, extra...)
	if err := sc.Scan(dest...); err != nil {
		return r, err
	}
	st, err := scanTime(started)
	if err != nil {
		return r, fmt.Errorf("run %s started_at: %w", r.ID, err)
	}
	if st != nil {
		r.StartedAt = *st
	}
	if r.EndedAt, err = scanTime(ended); err != nil {
		return r, fmt.Errorf("run %s ended_at: %w", r.ID, err)
	}
	if r.Heartbeat, err = scanTime(beat); err != nil {
		return r, fmt.Errorf("run %s heartbeat_at: %w", r.ID, err)
	}
	r.Status, r.Error, r.PID = Status(status), errText.String, int(pid.Int64)
	if resumed.Valid {
		v := int(resumed.Int64)
		r.ResumedFrom = &v
	}
	return r, nil
}

// ErrNotFound is returned for a run ID (or prefix) that matches no run.
var ErrNotFound = errors.New("no such run")

// Resolve returns the ID of the one run whose ID is id or starts with id.
func (s *Store) Resolve(ctx context.Context, id string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("empty run ID")
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT run_id FROM runs WHERE substr(run_id, 1, ?) = ? ORDER BY run_id LIMIT 6`), len(id), id)
	if err != nil {
		return "", s.wrap(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var x string
		if err := rows.Scan(&x); err != nil {
			return "", s.wrap(err)
		}
		if x == id {
			return x, nil
		}
		ids = append(ids, x)
	}
	if err := rows.Err(); err != nil {
		return "", s.wrap(err)
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("run %s: %w in %s", id, ErrNotFound, Redact(s.target))
	case 1:
		return ids[0], nil
	}
	more := ""
	if len(ids) > 5 {
		ids, more = ids[:5], ", ..."
	}
	return "", fmt.Errorf("run ID %s is ambiguous: %s%s", id, strings.Join(ids, ", "), more)
}

// Get returns run id (an ID or a unique prefix), with its recipe.
func (s *Store) Get(ctx context.Context, id string) (Run, error) {
	full, err := s.Resolve(ctx, id)
	if err != nil {
		return Run{}, err
	}
	var recipe string
	r, err := scanRun(s.db.QueryRowContext(ctx, s.q(`SELECT `+runCols+`, r.recipe FROM runs r WHERE r.run_id = ?`), full), &recipe)
	if err != nil {
		return Run{}, s.wrap(err)
	}
	r.Recipe = recipe
	return r, nil
}

// Steps returns the logged steps of run id (a full ID), in step order. A
// NULL column reads as NaN (SQLite stores NaN as NULL), except ValLoss,
// which stays nil.
func (s *Store) Steps(ctx context.Context, id string) ([]metrics.Record, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+metricCols+` FROM metrics WHERE run_id = ? ORDER BY step`), id)
	if err != nil {
		return nil, s.wrap(err)
	}
	defer rows.Close()
	var out []metrics.Record
	for rows.Next() {
		var r metrics.Record
		var f [9]sql.NullFloat64
		var units, tokens sql.NullInt64
		var val sql.NullFloat64
		if err := rows.Scan(&r.Step, &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &units, &tokens, &f[8], &val); err != nil {
			return nil, s.wrap(err)
		}
		nan := func(x sql.NullFloat64) float64 {
			if x.Valid {
				return x.Float64
			}
			return math.NaN()
		}
		r.Loss, r.GradNorm, r.LR, r.TokensPerSec, r.TFLOPs, r.MFU, r.MemGiB, r.StateGiB, r.ElapsedS =
			nan(f[0]), nan(f[1]), nan(f[2]), nan(f[3]), nan(f[4]), nan(f[5]), nan(f[6]), nan(f[7]), nan(f[8])
		r.GatheredUnits, r.Tokens = int(units.Int64), tokens.Int64
		if val.Valid {
			v := val.Float64
			r.ValLoss = &v
		}
		out = append(out, r)
	}
	return out, s.wrap(rows.Err())
}

// Summary is a run with the figures `titan runs list` shows. The
// pointers are nil for a run without logged steps.
type Summary struct {
	Run
	// Steps is the number of logged steps; FirstStep and LastStep the
	// first and the last one (a resumed run starts after its checkpoint).
	Steps     int `json:"steps"`
	FirstStep int `json:"first_step"`
	LastStep  int `json:"last_step"`
	// FinalLoss is the loss of the last logged step.
	FinalLoss *float64 `json:"final_loss"`
	// MeanTokensPerSec and MeanMFU average the logged steps after the
	// first (whose window holds the start-up), or the first alone.
	MeanTokensPerSec *float64 `json:"mean_tokens_per_sec"`
	MeanMFU          *float64 `json:"mean_mfu"`
	// PeakMemGiB is the largest logged mem_gib.
	PeakMemGiB *float64 `json:"peak_mem_gib"`
}

// summaryQuery computes the Summary of the runs selected by the page CTE,
// newest first.
const summaryQuery = `WITH page AS (%s),
agg AS (
	SELECT m.run_id, count(*) AS n, min(m.step) AS first_step, max(m.step) AS last_step, max(m.mem_gib) AS peak_mem
	FROM metrics m JOIN page p ON p.run_id = m.run_id GROUP BY m.run_id),
rate AS (
	SELECT m.run_id, avg(m.tokens_per_sec) AS tps, avg(m.mfu) AS mfu
	FROM metrics m JOIN agg a ON a.run_id = m.run_id
	WHERE m.step > a.first_step OR a.n = 1 GROUP BY m.run_id)
SELECT ` + runCols + `, coalesce(a.n, 0), coalesce(a.first_step, 0), coalesce(a.last_step, 0), f.loss, rate.tps, rate.mfu, a.peak_mem
FROM runs r JOIN page p ON p.run_id = r.run_id
LEFT JOIN agg a ON a.run_id = r.run_id
LEFT JOIN metrics f ON f.run_id = r.run_id AND f.step = a.last_step
LEFT JOIN rate ON rate.run_id = r.run_id
ORDER BY r.started_at DESC, r.run_id DESC`

// List returns the summaries of the newest limit runs (limit <= 0: all),
// newest first.
func (s *Store) List(ctx context.Context, limit int) ([]Summary, error) {
	page := `SELECT run_id FROM runs ORDER BY started_at DESC, run_id DESC`
	var args []any
	if limit > 0 {
		page += ` LIMIT ?`
		args = append(args, limit)
	}
	return s.summaries(ctx, page, args)
}

// Summaries returns the summaries of the runs ids (IDs or unique
// prefixes), in the order given.
func (s *Store) Summaries(ctx context.Context, ids []string) ([]Summary, error) {
	full := make([]string, len(ids))
	args := make([]any, len(ids))
	for i, id := range ids {
		f, err := s.Resolve(ctx, id)
		if err != nil {
			return nil, err
		}
		full[i], args[i] = f, f
	}
	if len(ids) == 0 {
		return nil, nil
	}
	page := `SELECT run_id FROM runs WHERE run_id IN (?` + strings.Repeat(", ?", len(ids)-1) + `)`
	got, err := s.summaries(ctx, page, args)
	if err != nil {
		return nil, err
	}
	byID := map[string]Summary{}
	for _, g := range got {
		byID[g.ID] = g
	}
	out := make([]Summary, len(full))
	for i, f := range full {
		out[i] = byID[f]
	}
	return out, nil
}

// Lineage returns the summaries of the runs of run id's job, oldest
// first: every resume and every elastic round (a restart of the workers
// after a failure) is a run of its own that continues from its dump
// folder's checkpoint, so the job is the run's folder's runs from the
// last fresh start (ResumedFrom 0) at or before it up to the next fresh
// start. Runs recorded before ResumedFrom was (nil) are taken to continue.
func (s *Store) Lineage(ctx context.Context, id string) ([]Summary, error) {
	r, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	all, err := s.summaries(ctx, `SELECT run_id FROM runs WHERE dump_folder = ?`, []any{r.DumpFolder})
	if err != nil {
		return nil, err
	}
	slices.Reverse(all)
	at := slices.IndexFunc(all, func(x Summary) bool { return x.ID == r.ID })
	if at < 0 {
		return nil, fmt.Errorf("run %s: not among its dump folder's runs", r.ID)
	}
	fresh := func(x Summary) bool { return x.ResumedFrom != nil && *x.ResumedFrom == 0 }
	first, last := at, at
	for first > 0 && !fresh(all[first]) {
		first--
	}
	for last+1 < len(all) && !fresh(all[last+1]) {
		last++
	}
	return all[first : last+1], nil
}

func (s *Store) summaries(ctx context.Context, page string, args []any) ([]Summary, error) {
	rows, err := s.db.QueryContext(ctx, s.q(fmt.Sprintf(summaryQuery, page)), args...)
	if err != nil {
		return nil, s.wrap(err)
	}
	defer rows.Close()
	var out []Summary
	for rows.Next() {
		var sm Summary
		var loss, tps, mfu, mem sql.NullFloat64
		r, err := scanRun(rows, &sm.Steps, &sm.FirstStep, &sm.LastStep, &loss, &tps, &mfu, &mem)
		if err != nil {
			return nil, s.wrap(err)
		}
		sm.Run = r
		sm.FinalLoss, sm.MeanTokensPerSec, sm.MeanMFU, sm.PeakMemGiB = ptr(loss), ptr(tps), ptr(mfu), ptr(mem)
		out = append(out, sm)
	}
	return out, s.wrap(rows.Err())
}

// ptr is x as a pointer: nil when NULL (or NaN or infinite, which JSON
// cannot hold).
func ptr(x sql.NullFloat64) *float64 {
	if !x.Valid || math.IsNaN(x.Float64) || math.IsInf(x.Float64, 0) {
		return nil
	}
	v := x.Float64
	return &v
}
