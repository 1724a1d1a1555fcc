// Package control implements titan's control plane over gRPC: rendezvous of
// the workers of a job (job id, world size, deterministic rank assignment, a
// per-job secret every caller must present), a key-value store with blocking
// gets, atomic counters and barriers (in the spirit of the c10d store),
// heartbeats and worker-exit reports.
//
// One Server runs per job, normally inside the launcher of node 0. Every
// worker (and every other node's launcher) opens a Client with Dial, joins
// with Client.Join and then uses the store to exchange data-plane addresses.
// The launcher reads Server.Events to learn about workers that exited or
// stopped sending heartbeats, and stops the job.
//
// Security: every call presents the job id and the job secret in the gRPC
// metadata keys "titan-job-id" and "titan-secret"; both are compared in
// constant time, and a call with either wrong gets the same refusal
// (Unauthenticated, "not admitted"), which names neither. The server listens
// on loopback unless told otherwise; on any other address it requires a
// non-empty secret and TLS (unless ServerConfig.Insecure). JobTLS derives the
// TLS configurations of both sides from the job secret (a per-job Ed25519
// certificate that clients pin), so that no certificate authority is needed;
// LoadServerTLS and LoadClientTLS build them from PEM files instead,
// optionally with mutual TLS.
package control

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
)

// NotAdmitted is the message of every refused call (gRPC code
// Unauthenticated), whatever was wrong with its job id or secret.
const NotAdmitted = "not admitted"

// Metadata keys carried by every call.
const (
	// MetadataSecret is the gRPC metadata key that carries the job secret.
	MetadataSecret = "titan-secret"
	// MetadataJobID is the gRPC metadata key that carries the job id.
	MetadataJobID = "titan-job-id"
)

// Event kinds delivered by Server.Events.
const (
	// EventJoined: a worker joined the rendezvous (Rank is its rank).
	EventJoined = "joined"
	// EventLeft: a worker that had joined gave up waiting for the rendezvous
	// to complete (its call was cancelled) and its slot was freed.
	EventLeft = "left"
	// EventExited: a rank was reported as exited (Code and Reason are set).
	EventExited = "exited"
	// EventLost: a rank stopped sending heartbeats for longer than
	// ServerConfig.HeartbeatTimeout (Reason says how long it was silent).
	EventLost = "lost"
	// EventRefused: a connection failed the TLS handshake (a caller
	// without the job's secret, or not speaking TLS); Rank is -1 and
	// Reason names the caller's address and the error. At most one a
	// second is delivered.
	EventRefused = "refused"
)

// Event is a membership event for the launcher.
type Event struct {
	// Kind is one of EventJoined, EventLeft, EventExited, EventLost or
	// EventRefused.
	Kind string
	// Rank is the global rank the event is about.
	Rank int
	// Code is the exit code reported with EventExited (0 otherwise).
	Code int
	// Reason is a human-readable explanation (for example "signal: killed").
	Reason string
}

// String formats the event for logs.
func (e Event) String() string {
	switch e.Kind {
	case EventExited:
		if e.Reason != "" {
			return fmt.Sprintf("rank %d exited with code %d (%s)", e.Rank, e.Code, e.Reason)
		}
		return fmt.Sprintf("rank %d exited with code %d", e.Rank, e.Code)
	case EventLost:
		return fmt.Sprintf("rank %d lost: %s", e.Rank, e.Reason)
	case EventRefused:
		return "refused a connection: " + e.Reason
	default:
		return fmt.Sprintf("rank %d %s", e.Rank, e.Kind)
	}
}

// Member describes one worker that has joined the rendezvous.
type Member struct {
	Rank           int
	NodeRank       int
	LocalRank      int
	LocalWorldSize int
	// Addr is the address the worker advertised in Join.
	Addr string
	// Peer is the network address the server saw the Join call come from;
	// on multi-node jobs its host part is the node's address as seen by the
	// server.
	Peer string
}

// Errors that callers may test for with errors.Is on errors returned by a
// Client.
var (
	// ErrNotAdmitted: the server refused the job id or the job secret the
	// client presented. The server does not say which, nor what it
	// expected.
	ErrNotAdmitted = errors.New(NotAdmitted)
	// ErrRendezvousComplete: Join was called after the world was complete.
	ErrRendezvousComplete = errors.New("rendezvous already complete")
	// ErrSlotTaken: another worker already joined with the same node rank
	// and local rank.
	ErrSlotTaken = errors.New("rendezvous slot already taken")
)

// NewSecret returns a fresh random job secret: 32 bytes from crypto/rand,
// hex-encoded.
func NewSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("control: generating job secret: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
