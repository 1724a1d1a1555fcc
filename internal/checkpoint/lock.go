package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LockFile is the name of the lock file [Lock] creates in a folder.
const LockFile = ".titan.lock"

// Owner identifies a process: the host it runs on and its pid.
type Owner struct {
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	// Job and Round: see ElasticRound.
	Job   string `json:"job,omitempty"`
	Round int    `json:"round,omitempty"`
}

// ElasticRound is set by the workers of an elastic job (internal/launch):
// the job's run id and the rendezvous round they belong to. A lock held
// by a process of an earlier round of the same job is stale: its
// launchers stopped every worker of that round, or lost its node (whose
// pid cannot be checked from another host), before starting this one.
var ElasticRound struct {
	Job   string
	Round int
}

func (o Owner) String() string { return fmt.Sprintf("pid %d on host %s", o.PID, o.Host) }

// self is this process.
func self() Owner {
	h, _ := os.Hostname()
	return Owner{Host: h, PID: os.Getpid(), Job: ElasticRound.Job, Round: ElasticRound.Round}
}

// gone reports whether o is a process of this host that no longer runs.
// A process of another host is never known to be gone.
func (o Owner) gone() bool {
	me := self()
	return o.Host == me.Host && o.PID > 0 && o.PID != me.PID && !alive(o.PID)
}

// hostTag is the host name as it may appear in a file name.
func hostTag(h string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' {
			return r
		}
		return '_'
	}, h)
}

// tmpPrefix is the prefix of a temporary folder of this process, for
// os.MkdirTemp: .tmp-<what>-p<pid>-<host>-.
func tmpPrefix(what string) string {
	me := self()
	return fmt.Sprintf(".tmp-%s-p%d-%s-", what, me.PID, hostTag(me.Host))
}

var tmpName = regexp.MustCompile(`^\.tmp-[a-z]+(?:-[a-z]+)?-\d+-p(\d+)-([A-Za-z0-9._]+)-`)

// leftover reports whether the temporary folder at path belongs to no
// running process: its writer (named in it) is gone from this host, or,
// for a name without a writer, it is over a day old.
func leftover(path string) bool {
	m := tmpName.FindStringSubmatch(filepath.Base(path))
	if m == nil {
		st, err := os.Stat(path)
		return err == nil && time.Since(st.ModTime()) > 24*time.Hour
	}
	pid, _ := strconv.Atoi(m[1])
	me := self()
	return m[2] == hostTag(me.Host) && pid != me.PID && !alive(pid)
}

// Lock is a held lock on a folder (see [Acquire]).
type Lock struct {
	path  string
	owner Owner
}

// held are the lock files this process holds.
var held sync.Map

// Acquire takes the lock of folder (created if needed): the file
// LockFile, created exclusively (O_EXCL) with this process's host and
// pid. While another live process holds it, Acquire fails with an error
// naming the holder. A lock left by a process of this host that is gone
// is stale and taken over. Release gives it back.
func Acquire(folder string) (*Lock, error) {
	if err := os.MkdirAll(folder, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	path := filepath.Join(folder, LockFile)
	me := self()
	me.Started = time.Now().UTC().Truncate(time.Second)
	body, _ := json.Marshal(me)
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			_, werr := f.Write(append(body, '\n'))
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				os.Remove(path)
				return nil, fmt.Errorf("checkpoint: writing %s: %w", path, werr)
			}
			held.Store(path, true)
			return &Lock{path: path, owner: me}, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("checkpoint: locking %s: %w", folder, err)
		}
		holder, stale, rerr := readLock(path)
		if rerr != nil {
			return nil, rerr
		}
		if _, mine := held.Load(path); mine && holder.PID == self().PID {
			return nil, fmt.Errorf("checkpoint: %s is in use by another run of this process (%s); a dump folder takes one run at a time", folder, holder)
		}
		if !stale || attempt > 0 {
			return nil, fmt.Errorf("checkpoint: %s is in use by another run (%s, since %s; lock file %s); wait for it, choose another job.dump_folder, or remove the lock file if that run is gone", folder, holder, holder.Started.Format(time.RFC3339), path)
		}
		// Stale: its holder is gone. Take it over.
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("checkpoint: removing the stale lock %s of %s: %w", path, holder, err)
		}
	}
}

// readLock reads the holder of a lock file and whether it is stale (its
// process is gone from this host, or the file has been unreadable for
// longer than a writer needs to fill it).
func readLock(path string) (Owner, bool, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Owner{}, true, nil // released meanwhile
	}
	if err != nil {
		return Owner{}, false, fmt.Errorf("checkpoint: reading lock %s: %w", path, err)
	}
	var o Owner
	if err := json.Unmarshal(raw, &o); err != nil || o.PID <= 0 {
		st, serr := os.Stat(path)
		old := serr == nil && time.Since(st.ModTime()) > 10*time.Second
		return Owner{Host: "unknown", PID: 0}, old, nil
	}
	if o.PID == self().PID && o.Host == self().Host {
		// Written by this pid but not held by this process: a previous
		// process of the same pid, long gone.
		if _, mine := held.Load(path); !mine {
			return o, true, nil
		}
		return o, false, nil
	}
	earlierRound := o.Job != "" && o.Job == ElasticRound.Job && o.Round < ElasticRound.Round
	return o, o.gone() || earlierRound, nil
}

// Release removes the lock file if it is still this lock's.
func (l *Lock) Release() error {
	if l == nil {
		return nil
	}
	held.Delete(l.path)
	raw, err := os.ReadFile(l.path)
	if err != nil {
		return nil
	}
	var o Owner
	if json.Unmarshal(raw, &o) == nil && o.PID == l.owner.PID && o.Host == l.owner.Host {
		if err := os.Remove(l.path); err != nil {
			return fmt.Errorf("checkpoint: releasing %s: %w", l.path, err)
		}
	}
	return nil
}
