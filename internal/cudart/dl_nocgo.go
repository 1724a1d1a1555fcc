//go:build !cgo

package cudart

import "unsafe"

// Library is a dlopened shared library (unavailable without cgo).
type Library struct {
	Name, Path string
}

// Open returns ErrNoCgo.
func Open(names ...string) (*Library, error) { return nil, ErrNoCgo }

// OpenIn returns ErrNoCgo.
func OpenIn(dirs []string, names ...string) (*Library, error) { return nil, ErrNoCgo }

// Sym returns ErrNoCgo.
func (l *Library) Sym(name string) (unsafe.Pointer, error) { return nil, ErrNoCgo }
