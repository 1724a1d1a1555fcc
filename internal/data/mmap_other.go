//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package data

import (
	"errors"
	"os"
)

// mmapFile is not supported here; token files are read with ReadAt.
func mmapFile(f *os.File, size int64) ([]byte, error) {
	return nil, errors.New("mmap not supported")
}

func munmapFile(b []byte) error { return nil }
