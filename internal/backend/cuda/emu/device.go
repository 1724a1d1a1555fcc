//go:build cgo

package emu

/*
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
typedef int (*pfn_launch)(const char *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void **, char *, int);
typedef void (*pfn_order)(int);
static int c_launch(void *f, const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		    void **params, char *err, int errlen) {
	return ((pfn_launch)f)(name, gx, gy, gz, bx, by, bz, params, err, errlen);
}
static void c_order(void *f, int o) { ((pfn_order)f)(o); }
static void c_copy(uintptr_t dst, uintptr_t src, size_t n) { memcpy((void *)dst, (const void *)src, n); }
static void c_zero(uintptr_t dst, size_t n) { memset((void *)dst, 0, n); }
static uintptr_t c_alloc(size_t n) { return (uintptr_t)calloc(n, 1); }
static void c_free(uintptr_t p) { free((void *)p); }
*/
import "C"

import (
	"fmt"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/titan-go/titan/internal/backend/cuda"
	"github.com/titan-go/titan/internal/cudart"
)

// Scheduling orders of the threads of a block (cuda_emu::Order).
const (
	Forward   = 0
	Reverse   = 1
	Alternate = 2
)

// Device is the emulated device: host memory and the host build of the
// kernels. It implements cuda.Device; launches run synchronously, one at
// a time.
type Device struct {
	lib    *cudart.Library
	launch unsafe.Pointer
	order  unsafe.Pointer
	mu     sync.Mutex

	// Launches counts the kernel launches by name.
	Launches map[string]int
}

var _ cuda.Device = (*Device)(nil)

// Open loads a library built by Build.
func Open(lib string) (*Device, error) {
	l, err := cudart.OpenIn([]string{filepath.Dir(lib)}, filepath.Base(lib))
	if err != nil {
		return nil, err
	}
	d := &Device{lib: l, Launches: map[string]int{}}
	if d.launch, err = l.Sym("emu_launch"); err != nil {
		return nil, err
	}
	if d.order, err = l.Sym("emu_set_order"); err != nil {
		return nil, err
	}
	return d, nil
}

// SetOrder selects the order in which the threads of a block run between
// barriers (Forward, Reverse, Alternate).
func (d *Device) SetOrder(o int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	C.c_order(d.order, C.int(o))
}

// Name returns "emulator".
func (d *Device) Name() string { return "emulator" }

// Malloc allocates zeroed host memory.
func (d *Device) Malloc(bytes int) (uintptr, error) {
	p := uintptr(C.c_alloc(C.size_t(max(bytes, 1))))
	if p == 0 {
		return 0, fmt.Errorf("emu: out of memory allocating %d bytes", bytes)
	}
	return p, nil
}

// Free frees memory from Malloc.
func (d *Device) Free(p uintptr) error {
	C.c_free(C.uintptr_t(p))
	return nil
}

// CopyHtoD copies host memory in.
func (d *Device) CopyHtoD(dst uintptr, src unsafe.Pointer, bytes int) error {
	C.c_copy(C.uintptr_t(dst), C.uintptr_t(uintptr(src)), C.size_t(bytes))
	return nil
}

// CopyDtoH copies out to host memory.
func (d *Device) CopyDtoH(dst unsafe.Pointer, src uintptr, bytes int) error {
	C.c_copy(C.uintptr_t(uintptr(dst)), C.uintptr_t(src), C.size_t(bytes))
	return nil
}

// CopyDtoD copies between device buffers.
func (d *Device) CopyDtoD(dst, src uintptr, bytes int) error {
	C.c_copy(C.uintptr_t(dst), C.uintptr_t(src), C.size_t(bytes))
	return nil
}

// Memset zeroes device memory.
func (d *Device) Memset(dst uintptr, bytes int) error {
	C.c_zero(C.uintptr_t(dst), C.size_t(bytes))
	return nil
}

// Launch runs the kernel name on the emulated grid.
func (d *Device) Launch(name string, grid, block cuda.Dim3, args ...any) error {
	for _, g := range grid {
		if g == 0 {
			return fmt.Errorf("emu: launch of %s with an empty grid %v", name, grid)
		}
	}
	if n := block[0] * block[1] * block[2]; n == 0 || n > 1024 {
		return fmt.Errorf("emu: launch of %s with block %v (%d threads, want 1..1024)", name, block, n)
	}
	p, err := cudart.PackParams(args)
	if err != nil {
		return fmt.Errorf("emu: launch of %s: %w", name, err)
	}
	defer p.Free()
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	msg := (*C.char)(C.calloc(512, 1))
	defer C.free(unsafe.Pointer(msg))
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Launches[name]++
	if rc := C.c_launch(d.launch, cn, C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
		C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), p.Ptr(), msg, 512); rc != 0 {
		return fmt.Errorf("emu: launch of %s: %s", name, C.GoString(msg))
	}
	return nil
}

// Sync returns at once: launches are synchronous.
func (d *Device) Sync() error { return nil }
