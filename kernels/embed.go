// Package kernels holds the CUDA C++ sources of titan's GPU kernels.
//
// The CUDA backend (internal/backend/cuda) compiles them with NVRTC for
// the device's architecture on first use; the tests compile the very same
// sources for the host against emu/cuda_emu.h, a header that emulates the
// CUDA execution model, and compare every kernel with the CPU backend.
// The .cu files include only common.cuh, so that NVRTC needs no CUDA
// headers.
package kernels

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"regexp"
	"sort"
)

// FS holds the kernel sources (*.cu), their shared header (common.cuh) and
// the host emulation (emu/).
//
//go:embed *.cu common.cuh emu/*
var FS embed.FS

// Sources returns the names of the .cu files, sorted.
func Sources() []string {
	names, err := fs.Glob(FS, "*.cu")
	if err != nil {
		panic(err)
	}
	sort.Strings(names)
	return names
}

// Read returns the content of one embedded file.
func Read(name string) string {
	b, err := FS.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

var kernelDecl = regexp.MustCompile(`extern "C" __global__ void ([A-Za-z_][A-Za-z0-9_]*)\(`)

// Names returns the kernels (extern "C" __global__ functions) of every
// source, in source order.
func Names() []string {
	var out []string
	for _, s := range Sources() {
		for _, m := range kernelDecl.FindAllStringSubmatch(Read(s), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// Hash is the SHA-256 of every source and header, the key (with the
// architecture and driver) of the compiled-kernel cache.
func Hash() string {
	h := sha256.New()
	for _, n := range append(Sources(), "common.cuh") {
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write([]byte(Read(n)))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}
