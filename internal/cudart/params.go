//go:build cgo

package cudart

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"
)

// Params is a kernel's argument array in C memory, as cuLaunchKernel
// takes it: entry i points at the value of argument i.
type Params struct {
	vals unsafe.Pointer // 8 bytes per argument
	ptrs unsafe.Pointer // one pointer per argument
	n    int
}

// PackParams copies kernel arguments into C memory. Each argument is a
// device pointer (uintptr or DevPtr), int32, uint32, int64, float32 or
// float64, matching the kernel's parameter (int, unsigned, long long,
// float, double, T*); Go's int is refused, as its C width is ambiguous.
func PackParams(args []any) (*Params, error) {
	n := max(len(args), 1)
	p := &Params{vals: C.calloc(C.size_t(n), 8), ptrs: C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(uintptr(0)))), n: len(args)}
	vals := unsafe.Slice((*uint64)(p.vals), n)
	ptrs := unsafe.Slice((*unsafe.Pointer)(p.ptrs), n)
	for i, a := range args {
		var v uint64
		switch x := a.(type) {
		case uintptr:
			v = uint64(x)
		case DevPtr:
			v = uint64(x)
		case int32:
			v = uint64(uint32(x))
		case uint32:
			v = uint64(x)
		case int64:
			v = uint64(x)
		case float32:
			v = uint64(math.Float32bits(x))
		case float64:
			v = math.Float64bits(x)
		default:
			p.Free()
			return nil, fmt.Errorf("argument %d: unsupported type %T", i, a)
		}
		vals[i] = v
		ptrs[i] = unsafe.Add(p.vals, 8*i)
	}
	return p, nil
}

// Ptr is the void** to pass to a launch.
func (p *Params) Ptr() *unsafe.Pointer { return (*unsafe.Pointer)(p.ptrs) }

// Free releases the C memory.
func (p *Params) Free() {
	C.free(p.vals)
	C.free(p.ptrs)
}
