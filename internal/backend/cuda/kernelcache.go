package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/titan-go/titan/internal/atomicfile"
	"github.com/titan-go/titan/kernels"
)

// CacheDirEnv overrides the folder of compiled kernels (default: the
// user cache folder's titan/kernels).
const CacheDirEnv = "TITAN_KERNEL_CACHE"

// KernelSource is the one translation unit NVRTC compiles: every .cu file
// of package kernels (each includes common.cuh, passed as a header).
func KernelSource() string {
	var s strings.Builder
	for _, f := range kernels.Sources() {
		fmt.Fprintf(&s, "// ---- %s\n%s\n", f, kernels.Read(f))
	}
	return s.String()
}

// cacheKey names a cubin by everything that changes it: the sources, the
// architecture, the driver and the compiler.
func cacheKey(arch string, driver int, nvrtc [2]int) string {
	return fmt.Sprintf("%s-%s-drv%d-nvrtc%d.%d.cubin", kernels.Hash()[:24], arch, driver, nvrtc[0], nvrtc[1])
}

// cacheDir returns the folder of compiled kernels.
func cacheDir() (string, error) {
	if d := os.Getenv(CacheDirEnv); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "titan", "kernels"), nil
}

// cachedCubin returns the cubin for key, or compiles it with compile and
// stores it (written to a temporary file, synced, renamed: a reader never
// sees half a cubin). A cache that cannot be written is not an error.
func cachedCubin(key string, compile func() ([]byte, error)) (cubin []byte, hit bool, err error) {
	dir, derr := cacheDir()
	if derr == nil {
		if b, err := os.ReadFile(filepath.Join(dir, key)); err == nil && len(b) > 0 {
			return b, true, nil
		}
	}
	cubin, err = compile()
	if err != nil {
		return nil, false, err
	}
	if derr == nil {
		if os.MkdirAll(dir, 0o755) == nil {
			_ = atomicfile.WriteBytes(filepath.Join(dir, key), cubin)
		}
	}
	return cubin, false, nil
}
