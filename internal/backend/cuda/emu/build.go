// Package emu is an emulated CUDA device: the kernels of package kernels
// compiled for the host with the system C++ compiler against
// kernels/emu/cuda_emu.h (blocks run one after the other, the threads of a
// block as cooperatively scheduled fibers with real __syncthreads and warp
// shuffle semantics), with host memory standing in for device memory. It
// lets the CUDA backend, launch shapes and kernels included, run and be
// checked against the CPU backend on a machine without a GPU.
package emu

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/titan-go/titan/kernels"
)

// CompilerEnv names the variable that overrides the C++ compiler (g++).
const CompilerEnv = "TITAN_EMU_CXX"

// Source returns the translation unit of the host build: every kernel
// source, then the kernel table of kernels/emu/emu_api.h.
func Source() string { return source("", nil) }

// source is Source with extra kernels (their code and names) appended.
func source(extra string, extraNames []string) string {
	var s strings.Builder
	for _, f := range kernels.Sources() {
		fmt.Fprintf(&s, "#include %q\n", f)
	}
	s.WriteString(extra)
	s.WriteString("\n#include \"emu/emu_api.h\"\nTITAN_EMU_KERNELS(\n")
	for i, k := range append(kernels.Names(), extraNames...) {
		if i > 0 {
			s.WriteString(",\n")
		}
		fmt.Fprintf(&s, "\tcuda_emu::kernel(%q, &%s)", k, k)
	}
	s.WriteString(")\n")
	return s.String()
}

// Compiler returns the C++ compiler Build uses.
func Compiler() (string, error) {
	cxx := os.Getenv(CompilerEnv)
	if cxx == "" {
		cxx = "g++"
	}
	return exec.LookPath(cxx)
}

// Build writes the kernel sources into dir and compiles them into a
// shared library there, returning its path.
func Build(dir string) (string, error) { return BuildWith(dir, "", nil) }

// BuildWith is Build with extra kernels compiled in (tests of the
// emulator itself): their source and the names of their extern "C"
// __global__ functions.
func BuildWith(dir, extra string, extraNames []string) (string, error) {
	cxx, err := Compiler()
	if err != nil {
		return "", fmt.Errorf("emu: no C++ compiler (%s or g++): %w", CompilerEnv, err)
	}
	src := filepath.Join(dir, "src")
	names := append(kernels.Sources(), "common.cuh", "emu/cuda_emu.h", "emu/emu_api.h")
	for _, n := range names {
		p := filepath.Join(src, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(kernels.Read(n)), 0o644); err != nil {
			return "", err
		}
	}
	tu := filepath.Join(src, "all.cpp")
	if err := os.WriteFile(tu, []byte(source(extra, extraNames)), 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libtitan_kernels_emu.so")
	// -ffp-contract=off: no fused multiply-adds where the source has none.
	cmd := exec.Command(cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-w",
		"-include", filepath.Join(src, "emu", "cuda_emu.h"), "-I", src, "-x", "c++", tu, "-o", lib)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("emu: %s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return lib, nil
}
