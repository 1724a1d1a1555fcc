//go:build cgo

package cudart

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/titan-go/titan/internal/testenv"
)

// fakeDriver is a libcuda.so.1 stand-in. cuInit succeeds, cuMemAlloc_v2
// reports out of memory, and cuLaunchKernel succeeds only for the
// arguments TestFakeDriver passes, so that the parameter packing is
// checked by the callee.
const fakeDriver = `
#include <stddef.h>
typedef unsigned long long u64;
int cuInit(unsigned f) { return f == 0 ? 0 : 1; }
int cuMemAlloc_v2(u64 *p, size_t n) { *p = 0; return 2; }
int cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		   unsigned shm, void *s, void **params, void **extra) {
	if (fn != (void *)0x1234 || gx != 3 || gy != 1 || gz != 2 || bx != 128 || by != 1 || bz != 1 || extra) return 1;
	if (*(int *)params[0] != -7 || *(float *)params[1] != 2.5f || *(long long *)params[2] != (1LL << 40)) return 1;
	if (*(u64 *)params[3] != 0xdeadbeef000ULL || *(double *)params[4] != 0.125) return 1;
	return 0;
}
`

func buildFake(t *testing.T, dir, name, src string) string {
	t.Helper()
	gcc := testenv.Tool(t, "gcc", "apt-get install gcc")
	c := filepath.Join(dir, "fake.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	if b, err := exec.Command(gcc, "-shared", "-fPIC", "-o", out, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return out
}

func TestMissingSymbolNamesItAndTheLibrary(t *testing.T) {
	dir := t.TempDir()
	path := buildFake(t, dir, "libcuda.so.1", fakeDriver)
	lib, err := OpenIn([]string{dir}, "libcuda.so.1", "libcuda.so")
	if err != nil {
		t.Fatal(err)
	}
	if lib.Path != path {
		t.Errorf("loaded %s, want %s", lib.Path, path)
	}
	if _, err := lib.Sym("cuInit"); err != nil {
		t.Fatalf("cuInit: %v", err)
	}
	_, err = bindDriver(lib)
	var se *SymbolError
	if !errors.As(err, &se) || se.Symbol != "cuDriverGetVersion" {
		t.Fatalf("bindDriver = %v, want the missing cuDriverGetVersion", err)
	}
	for _, s := range []string{"libcuda.so.1", path, "cuDriverGetVersion"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %s", err, s)
		}
	}
}

func TestFakeDriverCalls(t *testing.T) {
	dir := t.TempDir()
	buildFake(t, dir, "libcuda.so.1", fakeDriver)
	lib, err := OpenIn([]string{dir}, "libcuda.so.1")
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{Lib: lib, fn: map[string]unsafe.Pointer{}}
	for _, s := range []string{"cuInit", "cuMemAlloc_v2", "cuLaunchKernel"} {
		p, err := lib.Sym(s)
		if err != nil {
			t.Fatal(err)
		}
		d.fn[s] = p
	}
	if _, err := d.MemAlloc(1 << 30); err == nil || err.Error() != "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)" {
		t.Errorf("MemAlloc = %v, want cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)", err)
	}
	args := []any{int32(-7), float32(2.5), int64(1 << 40), DevPtr(0xdeadbeef000), float64(0.125)}
	if err := d.Launch(0x1234, "k", [3]uint32{3, 1, 2}, [3]uint32{128, 1, 1}, 0, args...); err != nil {
		t.Errorf("Launch with the expected arguments: %v", err)
	}
	args[1] = float32(2.25)
	if err := d.Launch(0x1234, "k", [3]uint32{3, 1, 2}, [3]uint32{128, 1, 1}, 0, args...); err == nil || err.Error() != "cuLaunchKernel(k): CUDA_ERROR_INVALID_VALUE (1)" {
		t.Errorf("Launch with a wrong argument = %v, want cuLaunchKernel(k): CUDA_ERROR_INVALID_VALUE (1)", err)
	}
	if err := d.Launch(0x1234, "k", [3]uint32{3, 1, 2}, [3]uint32{128, 1, 1}, 0, 5); err == nil || !strings.Contains(err.Error(), "unsupported type int") {
		t.Errorf("Launch with a Go int = %v, want a refusal", err)
	}
}

// TestDriverLoadReportsCuInit loads a complete stand-in through the
// search path of TITAN_CUDA_LIB_PATH whose cuInit finds no device.
func TestDriverLoadReportsCuInit(t *testing.T) {
	dir := t.TempDir()
	var src strings.Builder
	src.WriteString("int cuInit(unsigned f) { return 100; }\n")
	for _, s := range driverSyms {
		if s != "cuInit" {
			src.WriteString("int " + s + "(void) { return 0; }\n")
		}
	}
	buildFake(t, dir, "libcuda.so.1", src.String())
	t.Setenv(LibPathEnv, dir)
	_, err := loadDriver()
	if err == nil || err.Error() != "cuInit: CUDA_ERROR_NO_DEVICE (100)" {
		t.Fatalf("loadDriver = %v, want cuInit: CUDA_ERROR_NO_DEVICE (100)", err)
	}
}
