//go:build cgo

package cudart

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
*/
import "C"

import (
	"strings"
	"sync"
	"unsafe"
)

// Library is a dlopened shared library.
type Library struct {
	Name string // what was asked for, e.g. "libcuda.so.1"
	Path string // what was loaded
	h    unsafe.Pointer

	mu   sync.Mutex
	syms map[string]unsafe.Pointer
}

// Open loads the first of the candidate files for names (see SearchDirs)
// that the loader accepts. names go from the most to the least specific
// ("libcublasLt.so.12", "libcublasLt.so"); the error lists every path
// tried and why each failed.
func Open(names ...string) (*Library, error) {
	return OpenIn(SearchDirs(), names...)
}

// OpenIn is Open with explicit search folders.
func OpenIn(dirs []string, names ...string) (*Library, error) {
	var tried []string
	for _, p := range candidates(names, dirs) {
		cp := C.CString(p)
		h := C.dlopen(cp, C.RTLD_NOW|C.RTLD_GLOBAL)
		C.free(unsafe.Pointer(cp))
		if h != nil {
			return &Library{Name: names[0], Path: p, h: h, syms: map[string]unsafe.Pointer{}}, nil
		}
		reason := "not found"
		if e := C.dlerror(); e != nil {
			reason = C.GoString(e)
		}
		if !strings.HasPrefix(reason, p+":") {
			reason = p + ": " + reason
		}
		tried = append(tried, reason)
	}
	return nil, &LibraryError{Lib: names[0], Tried: tried}
}

// Sym returns the address of a function of the library.
func (l *Library) Sym(name string) (unsafe.Pointer, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.syms[name]; ok {
		return p, nil
	}
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	C.dlerror()
	p := C.dlsym(l.h, cn)
	if p == nil {
		return nil, &SymbolError{Lib: l.Name, Path: l.Path, Symbol: name}
	}
	l.syms[name] = p
	return p, nil
}

// Syms resolves every name into the pointers of dst (same length); the
// first missing one is the error.
func (l *Library) Syms(dst []*unsafe.Pointer, names []string) error {
	for i, n := range names {
		p, err := l.Sym(n)
		if err != nil {
			return err
		}
		*dst[i] = p
	}
	return nil
}
