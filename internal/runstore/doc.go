// Package runstore records titan's training runs in a database and reads
// them back for `titan runs list|show|compare`.
//
// Every run (one `titan train` process; a resumed run, or an elastic round
// that restarts the workers, is a new run that records the step it resumed
// from, and the runs of a dump folder that continued one another are a
// job: Store.Lineage) records
// its resolved recipe, recipe file, host, titan version (package version),
// device mesh, model name and flavor, start and end time, status (running,
// finished, failed with the error text, interrupted) and every logged step:
// the fields of metrics.Record, the same records metrics.jsonl holds.
// Rank 0 records; the recipe turns it off with metrics.enable_db = false.
//
// # Where
//
// The store is a SQLite file by default, or a PostgreSQL database. Target
// picks it: the recipe's metrics.db (a path, or a postgres:// or
// postgresql:// URL) when set, else the TITAN_DB environment variable,
// else DefaultPath, the user's
//
//	$XDG_DATA_HOME/titan/runs.db, by default ~/.local/share/titan/runs.db
//
// (macOS: ~/Library/Application Support/titan/runs.db; Windows:
// %LocalAppData%\titan\runs.db). SQLite runs in write-ahead-log mode, so
// `titan runs list` reads while runs write; WAL needs a local file system,
// so on a cluster whose home folders are on NFS point TITAN_DB at a local
// disk or at PostgreSQL. Many processes may write one store at once (they
// wait for SQLite's write lock up to 10 s, PostgreSQL has no such limit).
//
// # Schema
//
// Versioned: a one-row table schema_version holds the version, and Open
// runs the missing migrations (the migrations list) in one transaction,
// from version 0 for a new database; running them again is a no-op, and
// concurrent Opens serialise on SQLite's write lock or a PostgreSQL
// advisory lock. A database newer than this titan is refused
// (ErrNewerSchema). Version 1:
//
//	runs    (run_id text PRIMARY KEY, recipe_path, model, flavor, layout,
//	         world, host, titan_version, description, dump_folder,
//	         steps_planned, tokens_per_step, recipe (TOML), started_at,
//	         ended_at (NULL while running), status CHECK (running | finished
//	         | failed | interrupted), error (NULL unless failed))
//	metrics (run_id REFERENCES runs ON DELETE CASCADE, step, loss,
//	         grad_norm, lr, tokens_per_sec, tflops, mfu, mem_gib,
//	         state_gib, gathered_units, tokens, elapsed_s, val_loss,
//	         PRIMARY KEY (run_id, step))
//
// Every metric is a nullable number (REAL / double precision, INTEGER /
// bigint for step, gathered_units and tokens): val_loss is NULL on steps without
// validation, and SQLite stores NaN as NULL (Steps reads it back as NaN).
// On SQLite metrics is a WITHOUT ROWID table, so its rows lie in (run_id,
// step) order; on both backends a run's steps in order (WHERE run_id = ?
// ORDER BY step) come off the primary key without a sort: the input of an
// ordered aggregate such as Aggify's (both engines still sort inside an
// agg(... ORDER BY step) call, cheaply on input already in order). Times are
// timestamptz on PostgreSQL and fixed-width RFC 3339 UTC text
// ("2026-12-01T10:26:53.123Z") on SQLite, whose order is time order. Store.DB
// gives the database/sql handle for queries of one's own.
//
// # Off the training path
//
// Start returns a Recorder at once; the store is opened by its goroutine.
// Step only puts the record on a bounded queue (dropping it, and counting,
// if the queue is full); the goroutine writes every Options.Batch records
// or Options.Interval, each batch in one transaction of upserts on (run_id,
// step). When the store cannot be opened or a write fails (server down,
// disk full, file locked), the batch is appended to the dump folder's
// runstore_spool.jsonl (SpoolFile) and the store is retried with
// exponential backoff, replaying the spool first; Close (the end of the
// run) makes a last attempt within its deadline, then syncs the spool. A
// spool left by a run is replayed at the next run in the same dump folder.
// Every write is idempotent, so a record replayed twice is stored once.
//
// What it costs training (2 shared cores): one Step is about 0.2 µs
// (BenchmarkRecorderStep). BenchmarkRunStoreOverhead in package train runs
// the same 30-step tiny_bench run, every step logged, with the store off
// and on, alternating, 7 and 10 pairs: the logged tokens/s on/off is 0.9987
// and 0.9997 (medians), the wall-clock tokens/s of the whole Run (opening
// the store and the final flush included) 0.989 and 0.992, the process CPU
// time 1.005 — within the machine's noise of a few percent per pair.
//
// # Driver
//
// SQLite is modernc.org/sqlite (pure Go, transpiled from SQLite's C; cgo
// is not needed), PostgreSQL is github.com/jackc/pgx/v5 through its
// database/sql driver. modernc was chosen over the other pure-Go driver,
// github.com/ncruces/go-sqlite3 v0.37.0 (SQLite as Wasm translated to Go),
// by measurement on this project's 2-core machine (shared with other
// work, so: the two alternating, 9 runs each, medians with the range; both
// bundle SQLite 3.54.1; the metrics table above, WAL, synchronous NORMAL,
// database/sql):
//
//	                                       modernc v1.62.0     ncruces v0.37.0
//	insert 100k metric rows                 1.09 s               1.07 s
//	  (upserts, 100 per transaction)        (0.98-1.26)          (0.91-1.61)
//	grouped aggregate over them              32 ms               45 ms
//	  (count, min, avg, max by run_id)      (28-53)              (40-69)
//	open + first query                       0.5 ms              0.6 ms
//	binary size over database/sql alone     +7.7 MB             +11 MB
//	peak RSS of the benchmark                19 MB               16 MB
//	first build (cold cache), wall          53 s                27 s
//
// Through this package (PutSteps: multi-row upserts, 100 steps per
// transaction) the same 100k rows take 0.72 s (BenchmarkStoreInsert100k,
// 140k rows/s), the grouped aggregate 32 ms and List's summaries of the 10
// runs 81 ms (BenchmarkStoreAggregate).
//
// Inserting is a tie; modernc aggregates about 30% faster and makes the
// smaller binary, so it is the driver. Both register Go aggregate
// functions (modernc: RegisterFunction with MakeAggregate, with ORDER BY
// inside the call), which Aggify needs. modernc's cost, its long first
// build (one large generated file), is paid once per build cache.
package runstore
