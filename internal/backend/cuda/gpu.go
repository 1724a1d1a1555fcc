//go:build cgo

package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/titan-go/titan/internal/cudart"
	"github.com/titan-go/titan/kernels"
)

// Props are a GPU's properties.
type Props struct {
	Ordinal        int
	Name           string
	Major, Minor   int // compute capability
	SMs            int
	ClockKHz       int // SM clock
	MemoryBytes    int64
	DriverVersion  int
	KernelsCached  bool // the cubin came from the disk cache
	KernelCacheKey string
}

// gpu is a Device on one CUDA GPU. Every call binds the device's primary
// context to the calling OS thread first (goroutines move between
// threads), and all work goes to one non-blocking stream.
type gpu struct {
	drv    *cudart.Driver
	ctx    cudart.Context
	props  Props
	stream cudart.Stream
	mod    cudart.Module

	mu  sync.Mutex
	fns map[string]cudart.Function

	lt      *cudart.BlasLt
	ws      cudart.DevPtr
	wsBytes int
}

var _ Matmuler = (*gpu)(nil)

// workspaceBytes is cuBLASLt's workspace (32 MiB, Hopper's recommendation).
const workspaceBytes = 32 << 20

// Open returns a Backend on GPU ordinal: it loads the driver, compiles
// the kernels with NVRTC for the GPU's architecture (or reads them from
// the disk cache) and creates a cuBLASLt handle. Without a usable GPU the
// error wraps ErrNoGPU and says why.
func Open(ordinal int, opt Options) (*Backend, error) {
	g, err := openGPU(ordinal)
	if err != nil {
		return nil, err
	}
	return NewWithDevice(g, opt), nil
}

// Properties returns the properties of the GPU under b, false for an
// emulated device.
func (b *Backend) Properties() (Props, bool) {
	g, ok := b.dev.(*gpu)
	if !ok {
		return Props{}, false
	}
	return g.props, true
}

func (g *gpu) bind() func() {
	runtime.LockOSThread()
	if err := g.drv.SetCurrent(g.ctx); err != nil {
		panic(fmt.Sprintf("cuda: %v", err))
	}
	return runtime.UnlockOSThread
}

func openGPU(ordinal int) (*gpu, error) {
	drv, err := cudart.LoadDriver()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoGPU, err)
	}
	n, err := drv.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoGPU, err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("%w: GPU %d requested, %d present", ErrNoGPU, ordinal, n)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dev, err := drv.Device(ordinal)
	if err != nil {
		return nil, err
	}
	p := Props{Ordinal: ordinal}
	if p.Name, err = drv.DeviceName(dev); err != nil {
		return nil, err
	}
	for _, a := range []struct {
		attr int
		dst  *int
	}{{cudart.AttrComputeCapMajor, &p.Major}, {cudart.AttrComputeCapMinor, &p.Minor},
		{cudart.AttrMultiprocessorCount, &p.SMs}, {cudart.AttrClockRate, &p.ClockKHz}} {
		if *a.dst, err = drv.Attribute(dev, a.attr); err != nil {
			return nil, err
		}
	}
	if p.MemoryBytes, err = drv.TotalMem(dev); err != nil {
		return nil, err
	}
	if p.DriverVersion, err = drv.Version(); err != nil {
		return nil, err
	}
	g := &gpu{drv: drv, props: p, fns: map[string]cudart.Function{}}
	if g.ctx, err = drv.PrimaryContext(dev); err != nil {
		return nil, err
	}
	if g.stream, err = drv.StreamCreate(); err != nil {
		return nil, err
	}
	if err := g.loadKernels(); err != nil {
		return nil, err
	}
	if g.lt, err = cudart.NewBlasLt(); err != nil {
		return nil, err
	}
	if g.ws, err = drv.MemAlloc(workspaceBytes); err != nil {
		return nil, err
	}
	g.wsBytes = workspaceBytes
	return g, nil
}

// loadKernels compiles the embedded kernels for this GPU (or takes them
// from the cache) and loads the module. The context is current.
func (g *gpu) loadKernels() error {
	nv, err := cudart.LoadNVRTC()
	if err != nil {
		return err
	}
	maj, min, err := nv.Version()
	if err != nil {
		return err
	}
	arch := fmt.Sprintf("sm_%d%d", g.props.Major, g.props.Minor)
	key := cacheKey(arch, g.props.DriverVersion, [2]int{maj, min})
	cubin, hit, err := cachedCubin(key, func() ([]byte, error) {
		return nv.CompileCUBIN("titan_kernels.cu", KernelSource(),
			[]cudart.Header{{Name: "common.cuh", Source: kernels.Read("common.cuh")}},
			[]string{"--gpu-architecture=" + arch, "--std=c++17", "--fmad=true"})
	})
	if err != nil {
		return err
	}
	g.props.KernelsCached, g.props.KernelCacheKey = hit, key
	g.mod, err = g.drv.ModuleLoad(cubin)
	return err
}

func (g *gpu) Name() string { return g.props.Name }

func (g *gpu) Malloc(bytes int) (uintptr, error) {
	defer g.bind()()
	p, err := g.drv.MemAlloc(max(bytes, 1))
	return uintptr(p), err
}

func (g *gpu) Free(p uintptr) error {
	defer g.bind()()
	return g.drv.MemFree(cudart.DevPtr(p))
}

// CopyHtoD waits for the stream first: the synchronous copy runs on the
// legacy stream, which does not wait for a non-blocking one.
func (g *gpu) CopyHtoD(dst uintptr, src unsafe.Pointer, bytes int) error {
	defer g.bind()()
	if err := g.drv.StreamSynchronize(g.stream); err != nil {
		return err
	}
	return g.drv.HtoD(cudart.DevPtr(dst), src, bytes)
}

func (g *gpu) CopyDtoH(dst unsafe.Pointer, src uintptr, bytes int) error {
	defer g.bind()()
	if err := g.drv.StreamSynchronize(g.stream); err != nil {
		return err
	}
	return g.drv.DtoH(dst, cudart.DevPtr(src), bytes)
}

func (g *gpu) CopyDtoD(dst, src uintptr, bytes int) error {
	defer g.bind()()
	return g.drv.DtoDAsync(cudart.DevPtr(dst), cudart.DevPtr(src), bytes, g.stream)
}

func (g *gpu) Memset(dst uintptr, bytes int) error {
	defer g.bind()()
	return g.drv.MemsetAsync(cudart.DevPtr(dst), 0, bytes, g.stream)
}

func (g *gpu) function(name string) (cudart.Function, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f, ok := g.fns[name]; ok {
		return f, nil
	}
	f, err := g.drv.Function(g.mod, name)
	if err != nil {
		return 0, err
	}
	g.fns[name] = f
	return f, nil
}

func (g *gpu) Launch(name string, grid, block Dim3, args ...any) error {
	defer g.bind()()
	f, err := g.function(name)
	if err != nil {
		return err
	}
	return g.drv.Launch(f, name, grid, block, g.stream, args...)
}

func (g *gpu) Sync() error {
	defer g.bind()()
	return g.drv.StreamSynchronize(g.stream)
}

// Matmul runs one product on cuBLASLt.
func (g *gpu) Matmul(a MatmulArgs) error {
	defer g.bind()()
	ab, compute := cudart.DataFloat32, cudart.Compute32F
	if a.BF16 {
		ab = cudart.DataBFloat16
	} else if a.TF32 {
		compute = cudart.Compute32FTF32
	}
	return g.lt.Matmul(cudart.MatmulArgs{
		TransA: a.TransA, TransB: a.TransB, M: a.M, N: a.N, K: a.K, Alpha: a.Alpha, Beta: a.Beta,
		A: cudart.DevPtr(a.A), B: cudart.DevPtr(a.B), C: cudart.DevPtr(a.C), Lda: a.Lda, Ldb: a.Ldb, Ldc: a.Ldc,
		SA: a.SA, SB: a.SB, SC: a.SC, Batch: a.Batch, ABType: ab, Compute: compute,
		Workspace: g.ws, WorkspaceBytes: g.wsBytes, Stream: g.stream,
	})
}

// Stream is the stream every operation of b is queued on (0 for the
// emulator), for collectives that must order against it.
func (b *Backend) Stream() uintptr {
	if g, ok := b.dev.(*gpu); ok {
		return uintptr(g.stream)
	}
	return 0
}
