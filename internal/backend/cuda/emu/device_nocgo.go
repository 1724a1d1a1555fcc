//go:build !cgo

package emu

import (
	"unsafe"

	"github.com/titan-go/titan/internal/backend/cuda"
	"github.com/titan-go/titan/internal/cudart"
)

// Scheduling orders of the threads of a block.
const (
	Forward   = 0
	Reverse   = 1
	Alternate = 2
)

// Device is the emulated device (unavailable without cgo).
type Device struct{ Launches map[string]int }

var _ cuda.Device = (*Device)(nil)

// Open returns cudart.ErrNoCgo.
func Open(lib string) (*Device, error) { return nil, cudart.ErrNoCgo }

// SetOrder does nothing.
func (d *Device) SetOrder(o int) {}

// Name returns "emulator".
func (d *Device) Name() string                                      { return "emulator" }
func (d *Device) Malloc(int) (uintptr, error)                       { return 0, cudart.ErrNoCgo }
func (d *Device) Free(uintptr) error                                { return cudart.ErrNoCgo }
func (d *Device) CopyHtoD(uintptr, unsafe.Pointer, int) error       { return cudart.ErrNoCgo }
func (d *Device) CopyDtoH(unsafe.Pointer, uintptr, int) error       { return cudart.ErrNoCgo }
func (d *Device) CopyDtoD(uintptr, uintptr, int) error              { return cudart.ErrNoCgo }
func (d *Device) Memset(uintptr, int) error                         { return cudart.ErrNoCgo }
func (d *Device) Launch(string, cuda.Dim3, cuda.Dim3, ...any) error { return cudart.ErrNoCgo }
func (d *Device) Sync() error                                       { return cudart.ErrNoCgo }
