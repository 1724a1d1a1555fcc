//go:build linux

package comm

import (
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const shmSupported = true

func shmCreate(path string, size int) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create shared memory %s: %w", path, err)
	}
	defer unix.Close(fd)
	// Reserve the pages now: on a full tmpfs a plain ftruncate succeeds
	// and the first touch of a missing page kills the process (SIGBUS).
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) {
			unix.Unlink(path)
			return nil, fmt.Errorf("reserve %d bytes of shared memory in %s: %w (make it larger, lower Options.ShmSlotBytes or use Transport \"tcp\")", size, path, err)
		}
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			unix.Unlink(path)
			return nil, fmt.Errorf("size shared memory %s: %w", path, err)
		}
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Unlink(path)
		return nil, fmt.Errorf("map shared memory %s: %w", path, err)
	}
	return mem, nil
}

func shmOpen(path string, size int) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open shared memory %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat shared memory %s: %w", path, err)
	}
	if st.Size < int64(size) {
		return nil, fmt.Errorf("shared memory %s has %d bytes, want %d", path, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map shared memory %s: %w", path, err)
	}
	return mem, nil
}

func shmUnlink(path string) { unix.Unlink(path) }

func shmUnmap(mem []byte) { unix.Munmap(mem) }

const (
	futexWaitOp = 0 // FUTEX_WAIT, not private: the word is shared between processes
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait sleeps while *addr == val, at most d.
func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every waiter on addr.
func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, math.MaxInt32, 0, 0, 0)
}

// processAlive reports whether a process with this pid exists.
func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
