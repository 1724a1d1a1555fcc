//go:build cgo

package cudart

/*
#include <stddef.h>
#include <stdlib.h>

typedef int nvrtcResult;
typedef void *nvrtcProgram;
typedef nvrtcResult (*pfn_nvrtcVersion)(int *, int *);
typedef nvrtcResult (*pfn_nvrtcCreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *);
typedef nvrtcResult (*pfn_nvrtcCompileProgram)(nvrtcProgram, int, const char *const *);
typedef nvrtcResult (*pfn_nvrtcGetSize)(nvrtcProgram, size_t *);
typedef nvrtcResult (*pfn_nvrtcGetBytes)(nvrtcProgram, char *);
typedef nvrtcResult (*pfn_nvrtcDestroyProgram)(nvrtcProgram *);

static nvrtcResult c_nvrtcVersion(void *f, int *a, int *b) { return ((pfn_nvrtcVersion)f)(a, b); }
static nvrtcResult c_nvrtcCreateProgram(void *f, nvrtcProgram *p, const char *src, const char *name, int nh, char **h, char **hn) {
	return ((pfn_nvrtcCreateProgram)f)(p, src, name, nh, (const char *const *)h, (const char *const *)hn);
}
static nvrtcResult c_nvrtcCompileProgram(void *f, nvrtcProgram p, int n, char **opts) {
	return ((pfn_nvrtcCompileProgram)f)(p, n, (const char *const *)opts);
}
static nvrtcResult c_nvrtcGetSize(void *f, nvrtcProgram p, size_t *n) { return ((pfn_nvrtcGetSize)f)(p, n); }
static nvrtcResult c_nvrtcGetBytes(void *f, nvrtcProgram p, char *b) { return ((pfn_nvrtcGetBytes)f)(p, b); }
static nvrtcResult c_nvrtcDestroyProgram(void *f, nvrtcProgram *p) { return ((pfn_nvrtcDestroyProgram)f)(p); }
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

var nvrtcSyms = []string{"nvrtcVersion", "nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
	"nvrtcGetProgramLog", "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcDestroyProgram"}

// NVRTC is the loaded runtime compiler.
type NVRTC struct {
	Lib *Library
	fn  map[string]unsafe.Pointer
}

var (
	nvrtcOnce sync.Once
	nvrtcLib  *NVRTC
	nvrtcErr0 error
)

// LoadNVRTC loads libnvrtc (the CUDA 12 and 13 names, then any version).
func LoadNVRTC() (*NVRTC, error) {
	nvrtcOnce.Do(func() {
		lib, err := Open("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")
		if err != nil {
			nvrtcErr0 = err
			return
		}
		n := &NVRTC{Lib: lib, fn: map[string]unsafe.Pointer{}}
		for _, s := range nvrtcSyms {
			p, err := lib.Sym(s)
			if err != nil {
				nvrtcErr0 = err
				return
			}
			n.fn[s] = p
		}
		nvrtcLib = n
	})
	return nvrtcLib, nvrtcErr0
}

// Version is NVRTC's CUDA version.
func (n *NVRTC) Version() (major, minor int, err error) {
	var a, b C.int
	err = nvrtcErr("nvrtcVersion", int(C.c_nvrtcVersion(n.fn["nvrtcVersion"], &a, &b)))
	return int(a), int(b), err
}

// Header is one file a program may #include.
type Header struct{ Name, Source string }

// CompileCUBIN compiles src (named name, with headers) with opts into a
// cubin. A failed compilation's error carries the compiler log.
func (n *NVRTC) CompileCUBIN(name, src string, headers []Header, opts []string) ([]byte, error) {
	cstr := func(s string) *C.char { return C.CString(s) }
	var frees []unsafe.Pointer
	defer func() {
		for _, p := range frees {
			C.free(p)
		}
	}()
	keep := func(p *C.char) *C.char { frees = append(frees, unsafe.Pointer(p)); return p }
	array := func(ss []string) **C.char {
		if len(ss) == 0 {
			return nil
		}
		a := (**C.char)(C.calloc(C.size_t(len(ss)), C.size_t(unsafe.Sizeof(uintptr(0)))))
		frees = append(frees, unsafe.Pointer(a))
		s := unsafe.Slice(a, len(ss))
		for i, x := range ss {
			s[i] = keep(cstr(x))
		}
		return a
	}
	var hs, hn []string
	for _, h := range headers {
		hs = append(hs, h.Source)
		hn = append(hn, h.Name)
	}
	var prog C.nvrtcProgram
	if err := nvrtcErr("nvrtcCreateProgram", int(C.c_nvrtcCreateProgram(n.fn["nvrtcCreateProgram"], &prog, keep(cstr(src)), keep(cstr(name)),
		C.int(len(headers)), array(hs), array(hn)))); err != nil {
		return nil, err
	}
	defer C.c_nvrtcDestroyProgram(n.fn["nvrtcDestroyProgram"], &prog)
	cerr := nvrtcErr("nvrtcCompileProgram", int(C.c_nvrtcCompileProgram(n.fn["nvrtcCompileProgram"], prog, C.int(len(opts)), array(opts))))
	if cerr != nil {
		var sz C.size_t
		if C.c_nvrtcGetSize(n.fn["nvrtcGetProgramLogSize"], prog, &sz) == 0 && sz > 1 {
			buf := C.malloc(sz)
			defer C.free(buf)
			if C.c_nvrtcGetBytes(n.fn["nvrtcGetProgramLog"], prog, (*C.char)(buf)) == 0 {
				cerr.(*Error).Log = C.GoString((*C.char)(buf))
			}
		}
		return nil, fmt.Errorf("compiling %s: %w", name, cerr)
	}
	var sz C.size_t
	if err := nvrtcErr("nvrtcGetCUBINSize", int(C.c_nvrtcGetSize(n.fn["nvrtcGetCUBINSize"], prog, &sz))); err != nil {
		return nil, err
	}
	buf := C.malloc(sz)
	defer C.free(buf)
	if err := nvrtcErr("nvrtcGetCUBIN", int(C.c_nvrtcGetBytes(n.fn["nvrtcGetCUBIN"], prog, (*C.char)(buf)))); err != nil {
		return nil, err
	}
	return C.GoBytes(buf, C.int(sz)), nil
}
