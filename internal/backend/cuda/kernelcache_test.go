package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/kernels"
)

func TestKernelCache(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(CacheDirEnv, dir)
	key := cacheKey("sm_90", 12040, [2]int{12, 4})
	if !strings.HasPrefix(key, kernels.Hash()[:24]) || !strings.Contains(key, "sm_90-drv12040-nvrtc12.4") {
		t.Fatalf("key %q", key)
	}
	for _, other := range []string{cacheKey("sm_80", 12040, [2]int{12, 4}), cacheKey("sm_90", 12050, [2]int{12, 4}), cacheKey("sm_90", 12040, [2]int{12, 6})} {
		if other == key {
			t.Errorf("keys of different builds collide: %s", key)
		}
	}
	calls := 0
	compile := func() ([]byte, error) { calls++; return []byte("cubin"), nil }
	b, hit, err := cachedCubin(key, compile)
	if err != nil || hit || string(b) != "cubin" || calls != 1 {
		t.Fatalf("first: %q %v %v (compiled %d times)", b, hit, err, calls)
	}
	b, hit, err = cachedCubin(key, compile)
	if err != nil || !hit || string(b) != "cubin" || calls != 1 {
		t.Fatalf("second: %q %v %v (compiled %d times)", b, hit, err, calls)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != key {
		t.Errorf("cache folder holds %v, want just %s", ents, key)
	}
	boom := errors.New("nvrtcCompileProgram: NVRTC_ERROR_COMPILATION (6)")
	if _, _, err := cachedCubin("other", func() ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("compile error lost: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "other")); err == nil {
		t.Error("a failed compilation left a cache entry")
	}
}

// TestKernelSourceForNVRTC checks that the translation unit NVRTC gets
// includes nothing but common.cuh (NVRTC has no CUDA headers here) and
// holds every kernel.
func TestKernelSourceForNVRTC(t *testing.T) {
	src := KernelSource()
	for _, line := range strings.Split(src, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#include") && !strings.Contains(line, `"common.cuh"`) {
			t.Errorf("kernel source includes %s", line)
		}
	}
	names := kernels.Names()
	if len(names) < 40 {
		t.Errorf("only %d kernels: %v", len(names), names)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Errorf("kernel %s defined twice", n)
		}
		seen[n] = true
	}
}

func TestOpenWithoutGPU(t *testing.T) {
	if os.Getenv("TITAN_CUDA_PARITY") == "gpu" {
		t.Skip("a GPU is expected here")
	}
	t.Setenv("TITAN_CUDA_LIB_PATH", t.TempDir())
	_, err := Open(0, Options{})
	if err == nil {
		t.Skip("this machine has a usable GPU")
	}
	if !errors.Is(err, ErrNoGPU) {
		t.Fatalf("Open = %v, want an error wrapping ErrNoGPU", err)
	}
	t.Logf("Open without a GPU: %v", err)
}

// TestKernelNamesAreUnique: no kernel shares its name with another
// function of the sources (a C++ overload beside an extern "C" kernel
// would make cuModuleGetFunction's lookup depend on the compiler).
func TestKernelNamesAreUnique(t *testing.T) {
	src := KernelSource() + kernels.Read("common.cuh")
	for _, n := range kernels.Names() {
		if c := strings.Count(src, " "+n+"("); c != 1 {
			t.Errorf("%s( appears %d times in the sources", n, c)
		}
	}
}
