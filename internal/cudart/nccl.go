//go:build cgo

package cudart

/*
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

typedef int ncclResult_t;
typedef void *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;

typedef ncclResult_t (*pfn_ncclGetUniqueId)(ncclUniqueId *);
typedef ncclResult_t (*pfn_ncclCommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
typedef ncclResult_t (*pfn_ncclCommDestroy)(ncclComm_t);
typedef ncclResult_t (*pfn_ncclCommGetAsyncError)(ncclComm_t, ncclResult_t *);
typedef ncclResult_t (*pfn_ncclAllReduce)(const void *, void *, size_t, int, int, ncclComm_t, void *);
typedef ncclResult_t (*pfn_ncclReduceScatter)(const void *, void *, size_t, int, int, ncclComm_t, void *);
typedef ncclResult_t (*pfn_ncclAllGather)(const void *, void *, size_t, int, ncclComm_t, void *);
typedef ncclResult_t (*pfn_ncclBroadcast)(const void *, void *, size_t, int, int, ncclComm_t, void *);
typedef ncclResult_t (*pfn_ncclGroup)(void);

static ncclResult_t c_ncclGetUniqueId(void *f, void *out) { return ((pfn_ncclGetUniqueId)f)((ncclUniqueId *)out); }
static ncclResult_t c_ncclCommInitRank(void *f, ncclComm_t *c, int n, const void *id, int rank) {
	ncclUniqueId u;
	memcpy(&u, id, sizeof u);
	return ((pfn_ncclCommInitRank)f)(c, n, u, rank);
}
static ncclResult_t c_ncclCommDestroy(void *f, uintptr_t c) { return ((pfn_ncclCommDestroy)f)((ncclComm_t)c); }
static ncclResult_t c_ncclCommGetAsyncError(void *f, uintptr_t c, ncclResult_t *r) { return ((pfn_ncclCommGetAsyncError)f)((ncclComm_t)c, r); }
static ncclResult_t c_ncclAllReduce(void *f, uintptr_t s, uintptr_t r, size_t n, int t, int op, uintptr_t c, uintptr_t st) {
	return ((pfn_ncclAllReduce)f)((const void *)s, (void *)r, n, t, op, (ncclComm_t)c, (void *)st);
}
static ncclResult_t c_ncclReduceScatter(void *f, uintptr_t s, uintptr_t r, size_t n, int t, int op, uintptr_t c, uintptr_t st) {
	return ((pfn_ncclReduceScatter)f)((const void *)s, (void *)r, n, t, op, (ncclComm_t)c, (void *)st);
}
static ncclResult_t c_ncclAllGather(void *f, uintptr_t s, uintptr_t r, size_t n, int t, uintptr_t c, uintptr_t st) {
	return ((pfn_ncclAllGather)f)((const void *)s, (void *)r, n, t, (ncclComm_t)c, (void *)st);
}
static ncclResult_t c_ncclBroadcast(void *f, uintptr_t s, uintptr_t r, size_t n, int t, int root, uintptr_t c, uintptr_t st) {
	return ((pfn_ncclBroadcast)f)((const void *)s, (void *)r, n, t, root, (ncclComm_t)c, (void *)st);
}
static ncclResult_t c_ncclGroup(void *f) { return ((pfn_ncclGroup)f)(); }
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// NCCL data types and reduction operations (nccl.h).
const (
	NCCLInt32    = 2
	NCCLFloat32  = 7
	NCCLBFloat16 = 9
	NCCLSum      = 0
	NCCLAvg      = 4
)

// UniqueIDBytes is the size of an ncclUniqueId.
const UniqueIDBytes = 128

var ncclSyms = []string{"ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy", "ncclCommGetAsyncError",
	"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast", "ncclGroupStart", "ncclGroupEnd"}

// NCCL is the loaded libnccl.
type NCCL struct {
	Lib *Library
	fn  map[string]unsafe.Pointer
}

var (
	ncclOnce sync.Once
	ncclLib  *NCCL
	ncclErr0 error
)

// LoadNCCL loads libnccl.so.2.
func LoadNCCL() (*NCCL, error) {
	ncclOnce.Do(func() {
		lib, err := Open("libnccl.so.2", "libnccl.so")
		if err != nil {
			ncclErr0 = err
			return
		}
		n := &NCCL{Lib: lib, fn: map[string]unsafe.Pointer{}}
		for _, s := range ncclSyms {
			p, err := lib.Sym(s)
			if err != nil {
				ncclErr0 = err
				return
			}
			n.fn[s] = p
		}
		ncclLib = n
	})
	return ncclLib, ncclErr0
}

// UniqueID creates the id that rank 0 shares with the others.
func (n *NCCL) UniqueID() ([]byte, error) {
	buf := C.malloc(UniqueIDBytes)
	defer C.free(buf)
	if err := ncclErr("ncclGetUniqueId", int(C.c_ncclGetUniqueId(n.fn["ncclGetUniqueId"], buf))); err != nil {
		return nil, err
	}
	return C.GoBytes(buf, UniqueIDBytes), nil
}

// Comm is an NCCL communicator.
type Comm uintptr

// InitRank joins the communicator of nranks ranks identified by id.
func (n *NCCL) InitRank(nranks, rank int, id []byte) (Comm, error) {
	if len(id) != UniqueIDBytes {
		return 0, fmt.Errorf("ncclCommInitRank: unique id of %d bytes, want %d", len(id), UniqueIDBytes)
	}
	cid := C.CBytes(id)
	defer C.free(cid)
	var c C.ncclComm_t
	err := ncclErr("ncclCommInitRank", int(C.c_ncclCommInitRank(n.fn["ncclCommInitRank"], &c, C.int(nranks), cid, C.int(rank))))
	return Comm(uintptr(c)), err
}

// Destroy frees the communicator.
func (n *NCCL) Destroy(c Comm) error {
	return ncclErr("ncclCommDestroy", int(C.c_ncclCommDestroy(n.fn["ncclCommDestroy"], C.uintptr_t(c))))
}

// AsyncError reports an error raised by the communicator's kernels.
func (n *NCCL) AsyncError(c Comm) error {
	var r C.ncclResult_t
	if err := ncclErr("ncclCommGetAsyncError", int(C.c_ncclCommGetAsyncError(n.fn["ncclCommGetAsyncError"], C.uintptr_t(c), &r))); err != nil {
		return err
	}
	return ncclErr("NCCL kernel (async)", int(r))
}

// AllReduce queues an all-reduce of count elements on s.
func (n *NCCL) AllReduce(send, recv DevPtr, count, dtype, op int, c Comm, s Stream) error {
	return ncclErr("ncclAllReduce", int(C.c_ncclAllReduce(n.fn["ncclAllReduce"], C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dtype), C.int(op), C.uintptr_t(c), C.uintptr_t(s))))
}

// ReduceScatter queues a reduce-scatter with recvCount elements per rank.
func (n *NCCL) ReduceScatter(send, recv DevPtr, recvCount, dtype, op int, c Comm, s Stream) error {
	return ncclErr("ncclReduceScatter", int(C.c_ncclReduceScatter(n.fn["ncclReduceScatter"], C.uintptr_t(send), C.uintptr_t(recv), C.size_t(recvCount), C.int(dtype), C.int(op), C.uintptr_t(c), C.uintptr_t(s))))
}

// AllGather queues an all-gather with sendCount elements per rank.
func (n *NCCL) AllGather(send, recv DevPtr, sendCount, dtype int, c Comm, s Stream) error {
	return ncclErr("ncclAllGather", int(C.c_ncclAllGather(n.fn["ncclAllGather"], C.uintptr_t(send), C.uintptr_t(recv), C.size_t(sendCount), C.int(dtype), C.uintptr_t(c), C.uintptr_t(s))))
}

// Broadcast queues a broadcast from root.
func (n *NCCL) Broadcast(send, recv DevPtr, count, dtype, root int, c Comm, s Stream) error {
	return ncclErr("ncclBroadcast", int(C.c_ncclBroadcast(n.fn["ncclBroadcast"], C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dtype), C.int(root), C.uintptr_t(c), C.uintptr_t(s))))
}

// GroupStart and GroupEnd bracket collectives issued together.
func (n *NCCL) GroupStart() error {
	return ncclErr("ncclGroupStart", int(C.c_ncclGroup(n.fn["ncclGroupStart"])))
}

// GroupEnd ends a group (see GroupStart).
func (n *NCCL) GroupEnd() error {
	return ncclErr("ncclGroupEnd", int(C.c_ncclGroup(n.fn["ncclGroupEnd"])))
}
