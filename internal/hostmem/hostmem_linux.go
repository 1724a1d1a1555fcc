package hostmem

import (
	"syscall"
	"unsafe"
)

// mapFloat32s maps n float32s of anonymous memory, asking for huge
// pages (madvise MADV_HUGEPAGE, honoured when transparent huge pages are
// "always" or "madvise").
func mapFloat32s(n int) ([]float32, func(), bool) {
	m, err := syscall.Mmap(-1, 0, n*4, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, nil, false
	}
	const madvHugePage = 14 // MADV_HUGEPAGE
	syscall.Madvise(m, madvHugePage)
	return unsafe.Slice((*float32)(unsafe.Pointer(&m[0])), n), func() { syscall.Munmap(m) }, true
}
