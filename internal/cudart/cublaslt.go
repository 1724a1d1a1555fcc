//go:build cgo

package cudart

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef int cublasStatus_t;
typedef void *cublasLtHandle_t, *cublasLtMatmulDesc_t, *cublasLtMatrixLayout_t, *cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
	cublasLtMatmulAlgo_t algo;
	size_t workspaceSize;
	cublasStatus_t state;
	float wavesCount;
	int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef cublasStatus_t (*pfn_create)(void **);
typedef cublasStatus_t (*pfn_destroy)(void *);
typedef cublasStatus_t (*pfn_descCreate)(cublasLtMatmulDesc_t *, int, int);
typedef cublasStatus_t (*pfn_setAttr)(void *, int, const void *, size_t);
typedef cublasStatus_t (*pfn_layoutCreate)(cublasLtMatrixLayout_t *, int, uint64_t, uint64_t, int64_t);
typedef cublasStatus_t (*pfn_heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
					cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
					cublasLtMatmulHeuristicResult_t *, int *);
typedef cublasStatus_t (*pfn_matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t,
				     const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t, void *,
				     cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, void *);

static cublasStatus_t c_create(void *f, void **h) { return ((pfn_create)f)(h); }
static cublasStatus_t c_destroy(void *f, void *h) { return ((pfn_destroy)f)(h); }
static cublasStatus_t c_descCreate(void *f, void **d, int ct, int st) { return ((pfn_descCreate)f)((cublasLtMatmulDesc_t *)d, ct, st); }
static cublasStatus_t c_setAttr(void *f, void *o, int a, const void *b, size_t n) { return ((pfn_setAttr)f)(o, a, b, n); }
static cublasStatus_t c_layoutCreate(void *f, void **l, int t, uint64_t r, uint64_t c, int64_t ld) {
	return ((pfn_layoutCreate)f)((cublasLtMatrixLayout_t *)l, t, r, c, ld);
}
// c_matmul picks the first heuristic algorithm that fits the workspace
// and runs it; *state receives which call failed (0 heuristic, 1 matmul).
static cublasStatus_t c_matmul(void *fh, void *fm, void *h, void *desc, const float *alpha, uintptr_t pA, void *la, uintptr_t pB,
			       void *lb, const float *beta, uintptr_t pC, void *lc, void *pref, uintptr_t pws, size_t wsSize, uintptr_t stream,
			       int *state) {
	const void *A = (const void *)pA, *B = (const void *)pB;
	void *C = (void *)pC, *ws = (void *)pws;
	cublasLtMatmulHeuristicResult_t r;
	int n = 0;
	*state = 0;
	cublasStatus_t s = ((pfn_heuristic)fh)(h, desc, la, lb, lc, lc, pref, 1, &r, &n);
	if (s != 0) {
		return s;
	}
	if (n == 0) {
		return 15; // CUBLAS_STATUS_NOT_SUPPORTED
	}
	*state = 1;
	return ((pfn_matmul)fm)(h, desc, alpha, A, la, B, lb, beta, C, lc, C, lc, &r.algo, ws, wsSize, (void *)stream);
}
*/
import "C"

import (
	"sync"
	"unsafe"
)

// Data and compute types of cuBLASLt (library_types.h, cublas_api.h).
const (
	DataFloat32  = 0  // CUDA_R_32F
	DataBFloat16 = 14 // CUDA_R_16BF
	DataE4M3     = 28 // CUDA_R_8F_E4M3
	DataE5M2     = 29 // CUDA_R_8F_E5M2

	Compute32F     = 68 // CUBLAS_COMPUTE_32F
	Compute32FTF32 = 77 // CUBLAS_COMPUTE_32F_FAST_TF32
)

const (
	descTransA       = 3 // CUBLASLT_MATMUL_DESC_TRANSA
	descTransB       = 4
	layoutOrder      = 1 // CUBLASLT_MATRIX_LAYOUT_ORDER
	layoutBatch      = 5 // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT
	layoutBatchOff   = 6 // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
	prefMaxWorkspace = 1 // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
)

var cublasLtSyms = []string{"cublasLtCreate", "cublasLtDestroy", "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy",
	"cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
	"cublasLtMatrixLayoutSetAttribute", "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy",
	"cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul"}

// BlasLt is a cuBLASLt handle.
type BlasLt struct {
	Lib *Library
	fn  map[string]unsafe.Pointer
	h   unsafe.Pointer
}

var (
	ltOnce sync.Once
	ltLib  *Library
	ltFn   map[string]unsafe.Pointer
	ltErr  error
)

// NewBlasLt loads libcublasLt and creates a handle (on the current context).
func NewBlasLt() (*BlasLt, error) {
	ltOnce.Do(func() {
		ltLib, ltErr = Open("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")
		if ltErr != nil {
			return
		}
		ltFn = map[string]unsafe.Pointer{}
		for _, s := range cublasLtSyms {
			p, err := ltLib.Sym(s)
			if err != nil {
				ltErr = err
				return
			}
			ltFn[s] = p
		}
	})
	if ltErr != nil {
		return nil, ltErr
	}
	b := &BlasLt{Lib: ltLib, fn: ltFn}
	var h unsafe.Pointer
	if err := cublasErr("cublasLtCreate", int(C.c_create(b.fn["cublasLtCreate"], &h))); err != nil {
		return nil, err
	}
	b.h = h
	return b, nil
}

// MatmulArgs describes one row-major (strided batched) product
// C = alpha op(A) op(B) + beta C, op(A) m×k, op(B) k×n. A and B have the
// same data type; C is float32.
type MatmulArgs struct {
	TransA, TransB  bool
	M, N, K         int
	Alpha, Beta     float32
	A, B, C         DevPtr
	Lda, Ldb, Ldc   int
	SA, SB, SC      int64 // batch strides in elements
	Batch           int
	ABType, Compute int
	Workspace       DevPtr
	WorkspaceBytes  int
	Stream          Stream
}

// Matmul runs a on cuBLASLt. Row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T: the operands are swapped and each row-major
// matrix is read as its column-major transpose.
func (b *BlasLt) Matmul(a MatmulArgs) error {
	f := b.fn
	var desc unsafe.Pointer
	if err := cublasErr("cublasLtMatmulDescCreate", int(C.c_descCreate(f["cublasLtMatmulDescCreate"], &desc, C.int(a.Compute), DataFloat32))); err != nil {
		return err
	}
	defer C.c_destroy(f["cublasLtMatmulDescDestroy"], desc)
	setI32 := func(fn string, obj unsafe.Pointer, attr int, v int32) error {
		p := C.malloc(4)
		defer C.free(p)
		*(*int32)(p) = v
		return cublasErr(fn, int(C.c_setAttr(f[fn], obj, C.int(attr), p, 4)))
	}
	setI64 := func(fn string, obj unsafe.Pointer, attr int, v int64) error {
		p := C.malloc(8)
		defer C.free(p)
		*(*int64)(p) = v
		return cublasErr(fn, int(C.c_setAttr(f[fn], obj, C.int(attr), p, 8)))
	}
	op := func(t bool) int32 {
		if t {
			return 1
		}
		return 0
	}
	// Swapped: the first operand is B, the second A.
	if err := setI32("cublasLtMatmulDescSetAttribute", desc, descTransA, op(a.TransB)); err != nil {
		return err
	}
	if err := setI32("cublasLtMatmulDescSetAttribute", desc, descTransB, op(a.TransA)); err != nil {
		return err
	}
	layout := func(typ, rows, cols, ld int, stride int64) (unsafe.Pointer, error) {
		var l unsafe.Pointer
		if err := cublasErr("cublasLtMatrixLayoutCreate", int(C.c_layoutCreate(f["cublasLtMatrixLayoutCreate"], &l, C.int(typ), C.uint64_t(rows), C.uint64_t(cols), C.int64_t(ld)))); err != nil {
			return nil, err
		}
		if a.Batch > 1 {
			if err := setI32("cublasLtMatrixLayoutSetAttribute", l, layoutBatch, int32(a.Batch)); err != nil {
				return nil, err
			}
			if err := setI64("cublasLtMatrixLayoutSetAttribute", l, layoutBatchOff, stride); err != nil {
				return nil, err
			}
		}
		return l, nil
	}
	// Column-major views: B (row-major k×n, or n×k when transposed) is
	// n×k (k×n); A is k×m (m×k); C is n×m.
	br, bc := a.N, a.K
	if a.TransB {
		br, bc = a.K, a.N
	}
	ar, ac := a.K, a.M
	if a.TransA {
		ar, ac = a.M, a.K
	}
	lb, err := layout(a.ABType, br, bc, a.Ldb, a.SB)
	if err != nil {
		return err
	}
	defer C.c_destroy(f["cublasLtMatrixLayoutDestroy"], lb)
	la, err := layout(a.ABType, ar, ac, a.Lda, a.SA)
	if err != nil {
		return err
	}
	defer C.c_destroy(f["cublasLtMatrixLayoutDestroy"], la)
	lc, err := layout(DataFloat32, a.N, a.M, a.Ldc, a.SC)
	if err != nil {
		return err
	}
	defer C.c_destroy(f["cublasLtMatrixLayoutDestroy"], lc)
	var pref unsafe.Pointer
	if err := cublasErr("cublasLtMatmulPreferenceCreate", int(C.c_create(f["cublasLtMatmulPreferenceCreate"], &pref))); err != nil {
		return err
	}
	defer C.c_destroy(f["cublasLtMatmulPreferenceDestroy"], pref)
	if err := setI64("cublasLtMatmulPreferenceSetAttribute", pref, prefMaxWorkspace, int64(a.WorkspaceBytes)); err != nil {
		return err
	}
	scal := (*C.float)(C.malloc(8))
	defer C.free(unsafe.Pointer(scal))
	s := unsafe.Slice(scal, 2)
	s[0], s[1] = C.float(a.Alpha), C.float(a.Beta)
	var state C.int
	st := C.c_matmul(f["cublasLtMatmulAlgoGetHeuristic"], f["cublasLtMatmul"], b.h, desc, &s[0],
		C.uintptr_t(a.B), lb, C.uintptr_t(a.A), la, &s[1], C.uintptr_t(a.C), lc,
		pref, C.uintptr_t(a.Workspace), C.size_t(a.WorkspaceBytes), C.uintptr_t(a.Stream), &state)
	call := "cublasLtMatmulAlgoGetHeuristic"
	if state == 1 {
		call = "cublasLtMatmul"
	}
	return cublasErr(call, int(st))
}

// Close destroys the handle.
func (b *BlasLt) Close() error {
	return cublasErr("cublasLtDestroy", int(C.c_destroy(b.fn["cublasLtDestroy"], b.h)))
}
