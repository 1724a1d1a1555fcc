//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package data

import (
	"os"
	"syscall"
)

// mmapFile maps size bytes of f read-only.
func mmapFile(f *os.File, size int64) ([]byte, error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, syscall.EINVAL
	}
	return syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
}

func munmapFile(b []byte) error { return syscall.Munmap(b) }
