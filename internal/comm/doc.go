// Package comm is titan's data plane: process groups and collectives
// (all-reduce, reduce-scatter, all-gather, broadcast, all-to-all, barrier,
// send/recv) over Go slices, between processes on one or several hosts.
//
// # Groups
//
// NewWorld creates the group of all ranks of a job. Ranks find each other
// through a Store (the control plane's key-value store, or FileStore and
// MemStore in tests), then connect directly. Sub-groups, e.g. the rows and
// columns of a device mesh, come from NewGroup; each has its own
// connections or shared memory, and its own operation sequence.
//
// Every member issues the same collectives on a group in the same order.
// A group executes its operations one at a time, in issue order, on a
// goroutine of its own; the ...Async methods return a *Work at once, so
// that communication overlaps computation (and operations on different
// groups run concurrently). Send and Recv are matched per pair of ranks,
// in issue order, and run beside the collectives.
//
// # Data types and chunks
//
// Buffers are typed views of Go slices: F32, F64, BF16 ([]uint16 holding
// bfloat16), I32 and I64. Collectives that split a buffer across ranks
// (ReduceScatter, AllGather, AllToAll without counts) give rank i the
// elements [i*n/size, (i+1)*n/size), see ChunkBounds; sizes need not be
// divisible by the group size, and empty buffers are fine.
//
// # Determinism
//
// Every reduction folds the ranks' contributions in group rank order,
// ((x0 ⊕ x1) ⊕ x2) ⊕ ... ⊕ x(n-1), element by element, in the
// accumulation type (float32 for bfloat16, which is rounded once at the
// end). The order does not depend on the transport, the buffer size, the
// chunking or the pipelining, so every rank gets bitwise the same result,
// run after run, and TCP and shared memory agree bit for bit.
//
// This rules out the classic ring reduce-scatter, whose partial sums start
// at a different rank for every chunk. Instead the owner of each chunk
// receives the other ranks' raw elements for it and folds them itself
// (a direct reduce-scatter): each rank sends and receives (n-1)/n of the
// buffer, the same volume as a ring, and bfloat16 travels as 2 bytes.
//
// # Transports
//
// Options.Transport "auto" picks shared memory when all members of a group
// share a host (Options.HostID) and TCP otherwise. The TCP transport keeps
// a connection per pair of members (a full mesh, TCP_NODELAY) and pipelines
// reductions in Options.SegmentBytes segments, so that folding overlaps
// the transfer. The shared-memory transport maps one /dev/shm segment per
// group, unlinked as soon as every member mapped it, and synchronises with
// per-rank step counters in the segment (brief spinning, then futex
// sleeps). Both keep a control connection per pair of members, whose loss
// tells that a peer died.
//
// # Authentication
//
// Every TCP connection between two members starts with a mutual
// challenge-response: both ends prove, with HMAC-SHA256 under a key
// derived from Options.Secret (the job secret) and the world's id (fresh
// for every NewWorld), that they hold the secret of this very world,
// before anything else crosses the connection. A peer without it, or with
// the key of an earlier world, is closed out; the dialer of such a peer
// fails with an error matching ErrAuth, and the acceptor's error, should
// the expected connection then never come, counts the refused ones. The
// bytes that follow the handshake are neither encrypted nor authenticated.
// Shared-memory segments are files of the user (mode 0600), agreed over
// the authenticated control connections.
//
// # Failures
//
// Every operation has a timeout (Options.Timeout, 100 s by default). A
// timeout fails the operation with an *Error naming the group, the
// operation, its sequence number and the ranks it was waiting for — and
// which of them never entered it. A peer that dies (its connections close
// without a goodbye) fails the operation at once with an error naming it.
// Mismatched collectives (different operations, types or sizes on
// different ranks) are detected and reported. After any failure the group
// is aborted: its peers are told why, and later operations fail at once.
//
// # Flight recorder
//
// Each process records its last Options.FlightSize operations (group,
// sequence number, operation, size, state, times). The record is dumped to
// Options.TraceDir as flight-rank<R>.json when an operation times out or a
// peer aborts the group, and on SIGUSR1 once InstallFlightDumpOnSignal was
// called. AnalyzeFlight reads the dumps of all ranks and names the ranks
// that never entered the collective the others are waiting in.
//
// # Benchmarks
//
// BenchCollective times a collective and reports algorithm and bus
// bandwidth as nccl-tests does; cmd/commbench runs it with N local
// processes, and bench/gloo/compare.sh sets it against PyTorch Gloo.
package comm
