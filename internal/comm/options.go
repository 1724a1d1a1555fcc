package comm

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// Options configures a world and the groups created from it.
type Options struct {
	// Transport is "auto" (the default: shared memory when every member
	// of a group runs on the same host, TCP otherwise), "tcp" or "shm".
	// Sub-groups decide for themselves under the same rule.
	Transport string
	// Timeout bounds every collective and point-to-point operation, from
	// the moment it starts executing. Default 100 s.
	Timeout time.Duration
	// InitTimeout bounds NewWorld and NewGroup: waiting for the other
	// ranks to publish their addresses and to connect. Default 5 min.
	InitTimeout time.Duration
	// TraceDir, when set, is where the flight recorder is dumped (file
	// flight-rank<R>.json) when an operation times out or the group is
	// aborted by a peer.
	TraceDir string
	// FlightSize is the number of operations the flight recorder keeps
	// (0: the default, 2000); a negative size turns the recorder off: it
	// records nothing and writes no dumps. FlightSizeOf maps the recipe's
	// comm.trace_buf_size (0: off) to it.
	FlightSize int
	// Addr is the TCP address to listen on, "host:port" (port 0 picks a
	// free port). Default "127.0.0.1:0", enough for one host; multi-host
	// jobs listen on an interface the other hosts reach.
	Addr string
	// AdvertiseHost is the host name or IP other ranks dial. Default: the
	// host of Addr, or the machine's host name when Addr's host is empty
	// or unspecified (0.0.0.0, ::).
	AdvertiseHost string
	// HostID identifies the machine; ranks with equal HostIDs may share
	// memory. Default: host name plus kernel boot id.
	HostID string
	// StorePrefix prefixes every Store key NewWorld uses (default "comm").
	// Two worlds sharing a Store need different prefixes.
	StorePrefix string
	// SegmentBytes is the pipelining granularity of TCP reductions
	// (default 1 MiB).
	SegmentBytes int
	// SocketBuffer sets SO_SNDBUF and SO_RCVBUF of data connections; 0
	// (the default) leaves the kernel's automatic tuning on.
	SocketBuffer int
	// ShmSlotBytes is the size of each of a rank's three staging slots in
	// a shared-memory segment. The default gives a group's segment about
	// 48 MiB, with slots between 1 and 8 MiB.
	ShmSlotBytes int
	// Secret is the job secret. Every TCP connection of the world and of
	// its groups starts with a challenge-response in which both ends prove
	// that they hold it, bound to this world (a fresh id per NewWorld), to
	// both ranks and to the connection's purpose, before anything else
	// crosses it (see ErrAuth). Empty: the ends prove knowledge of the
	// world id alone, which the Store hands to anyone who can read it. The
	// shared-memory transport needs no proof beyond its control
	// connections: its segments are files of the user, mapped by ranks on
	// the same host.
	Secret string
	// ShmDir is where shared-memory segments are created (default
	// /dev/shm). Segments are unlinked as soon as every member mapped
	// them, so nothing is left behind when processes die.
	ShmDir string
}

const (
	defaultTimeout      = 100 * time.Second
	defaultInitTimeout  = 5 * time.Minute
	defaultFlightSize   = 2000
	defaultSegmentBytes = 1 << 20
)

func (o Options) withDefaults() (Options, error) {
	switch o.Transport {
	case "":
		o.Transport = "auto"
	case "auto", "tcp", "shm":
	default:
		return o, fmt.Errorf("comm: unknown transport %q (want auto, tcp or shm)", o.Transport)
	}
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.InitTimeout <= 0 {
		o.InitTimeout = defaultInitTimeout
	}
	if o.FlightSize == 0 {
		o.FlightSize = defaultFlightSize
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		return o, fmt.Errorf("comm: listen address %q: %w", o.Addr, err)
	}
	if o.AdvertiseHost == "" {
		host, _, _ := net.SplitHostPort(o.Addr)
		ip := net.ParseIP(host)
		if host == "" || (ip != nil && ip.IsUnspecified()) {
			h, err := os.Hostname()
			if err != nil {
				return o, fmt.Errorf("comm: advertise host: %w", err)
			}
			host = h
		}
		o.AdvertiseHost = host
	}
	if o.HostID == "" {
		o.HostID = defaultHostID()
	}
	if o.StorePrefix == "" {
		o.StorePrefix = "comm"
	}
	if o.SegmentBytes <= 0 {
		o.SegmentBytes = defaultSegmentBytes
	}
	if o.SegmentBytes < 64 {
		o.SegmentBytes = 64
	}
	if o.ShmSlotBytes > 0 {
		o.ShmSlotBytes = max(o.ShmSlotBytes, 4096) &^ 63
	}
	if o.ShmDir == "" {
		o.ShmDir = "/dev/shm"
	}
	return o, nil
}

// FlightSizeOf returns the Options.FlightSize for a recipe's
// comm.trace_buf_size: the same number of operations, or -1 (recorder
// off) for 0.
func FlightSizeOf(traceBufSize int) int {
	if traceBufSize <= 0 {
		return -1
	}
	return traceBufSize
}

func defaultHostID() string {
	h, _ := os.Hostname()
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return h + "/" + strings.TrimSpace(string(b))
}
