package runstore

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// EnvDB is the environment variable naming the run store when the recipe's
// metrics.db is empty: a SQLite file path or a postgres:// URL.
const EnvDB = "TITAN_DB"

// SpoolFile is the name of the spool in a run's dump folder: the records
// that could not reach the store, one JSON object per line, flushed to the
// store when it is back or at the next run in the same folder.
const SpoolFile = "runstore_spool.jsonl"

// Target resolves where runs are recorded: db (the recipe's metrics.db, or
// a --db flag) when not empty, else $TITAN_DB (read with getenv), else
// DefaultPath. The result is a SQLite file path or a PostgreSQL URL; it is
// checked with ParseTarget.
func Target(db string, getenv func(string) string) (string, error) {
	src := "metrics.db"
	if db == "" {
		db, src = getenv(EnvDB), EnvDB
	}
	if db == "" {
		p, err := defaultPath(getenv)
		if err != nil {
			return "", err
		}
		return p, nil
	}
	if _, _, err := ParseTarget(db); err != nil {
		return "", fmt.Errorf("%s: %w", src, err)
	}
	return db, nil
}

// DefaultPath is the run store used when neither metrics.db nor TITAN_DB
// names one: runs.db in the user's data folder,
//
//   - $XDG_DATA_HOME/titan/runs.db when XDG_DATA_HOME is set (any system),
//   - ~/.local/share/titan/runs.db on Linux and other Unix systems,
//   - ~/Library/Application Support/titan/runs.db on macOS,
//   - %LocalAppData%\titan\runs.db on Windows.
func DefaultPath() (string, error) { return defaultPath(os.Getenv) }

func defaultPath(getenv func(string) string) (string, error) {
	if x := getenv("XDG_DATA_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "titan", "runs.db"), nil
	}
	switch runtime.GOOS {
	case "windows":
		if d := getenv("LocalAppData"); d != "" {
			return filepath.Join(d, "titan", "runs.db"), nil
		}
	case "darwin", "ios":
		if h := getenv("HOME"); h != "" {
			return filepath.Join(h, "Library", "Application Support", "titan", "runs.db"), nil
		}
	default:
		if h := getenv("HOME"); h != "" {
			return filepath.Join(h, ".local", "share", "titan", "runs.db"), nil
		}
	}
	return "", errors.New("runstore: no default run store: neither XDG_DATA_HOME nor HOME is set (set metrics.db or " + EnvDB + ")")
}

// Backend kinds of ParseTarget.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// ParseTarget says which backend target names: Postgres for a postgres://
// or postgresql:// URL (returned as is), SQLite for anything else that is
// not a URL (a file path, returned as is). Other URL schemes, and file
// paths holding '?' (which SQLite would read as URI parameters), are
// errors.
func ParseTarget(target string) (kind, where string, err error) {
	switch {
	case target == "":
		return "", "", errors.New("empty run store")
	case strings.HasPrefix(target, "postgres://"), strings.HasPrefix(target, "postgresql://"):
		if _, err := url.Parse(target); err != nil {
			return "", "", fmt.Errorf("bad PostgreSQL URL: %w", err)
		}
		return Postgres, target, nil
	case strings.Contains(target, "://"):
		scheme, _, _ := strings.Cut(target, "://")
		return "", "", fmt.Errorf("%q: unsupported scheme %s:// (want a SQLite file path or a postgres:// URL)", target, scheme)
	case strings.ContainsAny(target, "?#"):
		return "", "", fmt.Errorf("%q: a SQLite path may not contain '?' or '#'", target)
	}
	return SQLite, target, nil
}

// Redact is target with the password of a URL (user:password@ or
// ?password=) replaced by "xxxxx", for logs and error messages.
func Redact(target string) string {
	if kind, _, err := ParseTarget(target); err != nil || kind != Postgres {
		return target
	}
	u, err := url.Parse(target)
	if err != nil {
		return target
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
