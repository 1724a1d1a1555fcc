//go:build !linux

package comm

import "time"

const shmSupported = false

func shmCreate(path string, size int) ([]byte, error) { return nil, errNoShm }
func shmOpen(path string, size int) ([]byte, error)   { return nil, errNoShm }
func shmUnlink(path string)                           {}
func shmUnmap(mem []byte)                             {}
func futexWait(addr *uint32, val uint32, d time.Duration) {
	time.Sleep(min(d, 50*time.Microsecond))
}
func futexWake(addr *uint32) {}

func processAlive(pid int) bool { return true }
