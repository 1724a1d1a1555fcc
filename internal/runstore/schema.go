package runstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// A migration moves the schema from version-1 to version. Its statements
// run in one transaction with the others of the same upgrade, so an
// upgrade either completes or leaves the database as it was.
type migration struct {
	version  int
	sqlite   []string
	postgres []string
}

// migrations is the schema's history, oldest first. Append to it; never
// edit a released entry (databases at that version already ran it).
var migrations = []migration{
	{
		version: 1,
		sqlite: []string{
			`CREATE TABLE runs (
	run_id          TEXT PRIMARY KEY,
	recipe_path     TEXT NOT NULL,
	model           TEXT NOT NULL,
	flavor          TEXT NOT NULL,
	layout          TEXT NOT NULL,
	world           INTEGER NOT NULL,
	host            TEXT NOT NULL,
	titan_version   TEXT NOT NULL,
	description     TEXT NOT NULL,
	dump_folder     TEXT NOT NULL,
	steps_planned   INTEGER NOT NULL,
	tokens_per_step INTEGER NOT NULL,
	recipe          TEXT NOT NULL,
	started_at      TEXT NOT NULL,
	ended_at        TEXT,
	status          TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed', 'interrupted')),
	error           TEXT
)`,
			`CREATE INDEX runs_started_at ON runs (started_at)`,
			`CREATE TABLE metrics (
	run_id         TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
	step           INTEGER NOT NULL,
	loss           REAL,
	grad_norm      REAL,
	lr             REAL,
	tokens_per_sec REAL,
	tflops         REAL,
	mfu            REAL,
	mem_gib        REAL,
	state_gib      REAL,
	gathered_units INTEGER,
	tokens         INTEGER,
	elapsed_s      REAL,
	val_loss       REAL,
	PRIMARY KEY (run_id, step)
) WITHOUT ROWID`,
		},
		postgres: []string{
			`CREATE TABLE runs (
	run_id          text PRIMARY KEY,
	recipe_path     text NOT NULL,
	model           text NOT NULL,
	flavor          text NOT NULL,
	layout          text NOT NULL,
	world           integer NOT NULL,
	host            text NOT NULL,
	titan_version   text NOT NULL,
	description     text NOT NULL,
	dump_folder     text NOT NULL,
	steps_planned   bigint NOT NULL,
	tokens_per_step bigint NOT NULL,
	recipe          text NOT NULL,
	started_at      timestamptz NOT NULL,
	ended_at        timestamptz,
	status          text NOT NULL CHECK (status IN ('running', 'finished', 'failed', 'interrupted')),
	error           text
)`,
			`CREATE INDEX runs_started_at ON runs (started_at)`,
			`CREATE TABLE metrics (
	run_id         text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
	step           bigint NOT NULL,
	loss           double precision,
	grad_norm      double precision,
	lr             double precision,
	tokens_per_sec double precision,
	tflops         double precision,
	mfu            double precision,
	mem_gib        double precision,
	state_gib      double precision,
	gathered_units bigint,
	tokens         bigint,
	elapsed_s      double precision,
	val_loss       double precision,
	PRIMARY KEY (run_id, step)
)`,
		},
	},
	{
		// Version 2: the recording process (pid on host) and its last
		// heartbeat, so that a run whose process was killed without
		// recording its end is shown interrupted (Store.Reconcile).
		version: 2,
		sqlite: []string{
			`ALTER TABLE runs ADD COLUMN pid INTEGER`,
			`ALTER TABLE runs ADD COLUMN heartbeat_at TEXT`,
		},
		postgres: []string{
			`ALTER TABLE runs ADD COLUMN pid bigint`,
			`ALTER TABLE runs ADD COLUMN heartbeat_at timestamptz`,
		},
	},
	{
		// Version 3: the step a run resumed from (0: a fresh start), so
		// that a dump folder's runs split into the jobs that continued
		// one another (Store.Lineage). NULL for the runs recorded before.
		version:  3,
		sqlite:   []string{`ALTER TABLE runs ADD COLUMN resumed_from INTEGER`},
		postgres: []string{`ALTER TABLE runs ADD COLUMN resumed_from bigint`},
	},
}

// SchemaVersion is the schema version this titan writes: the last
// migration's.
func SchemaVersion() int { return migrations[len(migrations)-1].version }

// ErrNewerSchema is returned by Open for a database whose schema is newer
// than this titan knows.
var ErrNewerSchema = errors.New("the run store's schema is newer than this titan's")

// pgMigrationLock is the pg_advisory_xact_lock key that serialises
// concurrent migrations of one PostgreSQL database ("titan" in ASCII).
const pgMigrationLock = 0x746974616e

// migrate brings the database to the last of migs, in one transaction:
// it creates schema_version (one row: the version) when missing, reads the
// version (0 for a new database) and runs every later migration. Running
// it again, or from several processes at once, is harmless: the
// transaction holds SQLite's write lock (BEGIN IMMEDIATE) or a PostgreSQL
// advisory lock while it reads the version.
func (s *Store) migrate(ctx context.Context, migs []migration) (err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	if s.pg {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(pgMigrationLock)); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	var v sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT max(version) FROM schema_version`).Scan(&v); err != nil {
		return err
	}
	cur, last := int(v.Int64), migs[len(migs)-1].version
	if cur > last {
		return fmt.Errorf("%w: version %d, this titan knows up to %d (use a newer titan, or another metrics.db)", ErrNewerSchema, cur, last)
	}
	if cur == last {
		return tx.Commit()
	}
	for _, m := range migs {
		if m.version <= cur {
			continue
		}
		stmts := m.sqlite
		if s.pg {
			stmts = m.postgres
		}
		for _, q := range stmts {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("migration to schema version %d: %w", m.version, err)
			}
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM schema_version`); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO schema_version (version) VALUES (?)`), last); err != nil {
		return err
	}
	return tx.Commit()
}

// Version reads the database's schema version (0: no schema yet).
func (s *Store) Version(ctx context.Context) (int, error) {
	var v sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT max(version) FROM schema_version`).Scan(&v)
	if err != nil {
		return 0, s.wrap(err)
	}
	return int(v.Int64), nil
}
