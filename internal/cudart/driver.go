//go:build cgo

package cudart

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

// The CUDA driver API as titan declares it (cuda.h, CUDA 12): handles are
// opaque pointers, device pointers 64-bit integers, statuses ints.
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;

typedef CUresult (*pfn_cuInit)(unsigned);
typedef CUresult (*pfn_cuDriverGetVersion)(int *);
typedef CUresult (*pfn_cuDeviceGetCount)(int *);
typedef CUresult (*pfn_cuDeviceGet)(CUdevice *, int);
typedef CUresult (*pfn_cuDeviceGetName)(char *, int, CUdevice);
typedef CUresult (*pfn_cuDeviceGetAttribute)(int *, int, CUdevice);
typedef CUresult (*pfn_cuDeviceTotalMem)(size_t *, CUdevice);
typedef CUresult (*pfn_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
typedef CUresult (*pfn_cuCtxSetCurrent)(CUcontext);
typedef CUresult (*pfn_cuCtxSynchronize)(void);
typedef CUresult (*pfn_cuMemAlloc)(CUdeviceptr *, size_t);
typedef CUresult (*pfn_cuMemFree)(CUdeviceptr);
typedef CUresult (*pfn_cuMemGetInfo)(size_t *, size_t *);
typedef CUresult (*pfn_cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
typedef CUresult (*pfn_cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
typedef CUresult (*pfn_cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*pfn_cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*pfn_cuStreamCreate)(CUstream *, unsigned);
typedef CUresult (*pfn_cuStreamDestroy)(CUstream);
typedef CUresult (*pfn_cuStreamSynchronize)(CUstream);
typedef CUresult (*pfn_cuStreamWaitEvent)(CUstream, CUevent, unsigned);
typedef CUresult (*pfn_cuEventCreate)(CUevent *, unsigned);
typedef CUresult (*pfn_cuEventRecord)(CUevent, CUstream);
typedef CUresult (*pfn_cuEventSynchronize)(CUevent);
typedef CUresult (*pfn_cuEventElapsedTime)(float *, CUevent, CUevent);
typedef CUresult (*pfn_cuEventDestroy)(CUevent);
typedef CUresult (*pfn_cuModuleLoadData)(CUmodule *, const void *);
typedef CUresult (*pfn_cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
typedef CUresult (*pfn_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				       unsigned, CUstream, void **, void **);

static CUresult c_cuInit(void *f, unsigned fl) { return ((pfn_cuInit)f)(fl); }
static CUresult c_cuDriverGetVersion(void *f, int *v) { return ((pfn_cuDriverGetVersion)f)(v); }
static CUresult c_cuDeviceGetCount(void *f, int *n) { return ((pfn_cuDeviceGetCount)f)(n); }
static CUresult c_cuDeviceGet(void *f, CUdevice *d, int o) { return ((pfn_cuDeviceGet)f)(d, o); }
static CUresult c_cuDeviceGetName(void *f, char *s, int n, CUdevice d) { return ((pfn_cuDeviceGetName)f)(s, n, d); }
static CUresult c_cuDeviceGetAttribute(void *f, int *v, int a, CUdevice d) { return ((pfn_cuDeviceGetAttribute)f)(v, a, d); }
static CUresult c_cuDeviceTotalMem(void *f, size_t *b, CUdevice d) { return ((pfn_cuDeviceTotalMem)f)(b, d); }
static CUresult c_cuDevicePrimaryCtxRetain(void *f, CUcontext *c, CUdevice d) { return ((pfn_cuDevicePrimaryCtxRetain)f)(c, d); }
static CUresult c_cuCtxSetCurrent(void *f, uintptr_t c) { return ((pfn_cuCtxSetCurrent)f)((CUcontext)c); }
static CUresult c_cuCtxSynchronize(void *f) { return ((pfn_cuCtxSynchronize)f)(); }
static CUresult c_cuMemAlloc(void *f, CUdeviceptr *p, size_t n) { return ((pfn_cuMemAlloc)f)(p, n); }
static CUresult c_cuMemFree(void *f, CUdeviceptr p) { return ((pfn_cuMemFree)f)(p); }
static CUresult c_cuMemGetInfo(void *f, size_t *fr, size_t *t) { return ((pfn_cuMemGetInfo)f)(fr, t); }
static CUresult c_cuMemcpyHtoD(void *f, CUdeviceptr d, const void *s, size_t n) { return ((pfn_cuMemcpyHtoD)f)(d, s, n); }
static CUresult c_cuMemcpyDtoH(void *f, void *d, CUdeviceptr s, size_t n) { return ((pfn_cuMemcpyDtoH)f)(d, s, n); }
static CUresult c_cuMemcpyDtoDAsync(void *f, CUdeviceptr d, CUdeviceptr s, size_t n, uintptr_t st) { return ((pfn_cuMemcpyDtoDAsync)f)(d, s, n, (CUstream)st); }
static CUresult c_cuMemsetD8Async(void *f, CUdeviceptr d, unsigned char v, size_t n, uintptr_t st) { return ((pfn_cuMemsetD8Async)f)(d, v, n, (CUstream)st); }
static CUresult c_cuStreamCreate(void *f, CUstream *s, unsigned fl) { return ((pfn_cuStreamCreate)f)(s, fl); }
static CUresult c_cuStreamDestroy(void *f, uintptr_t s) { return ((pfn_cuStreamDestroy)f)((CUstream)s); }
static CUresult c_cuStreamSynchronize(void *f, uintptr_t s) { return ((pfn_cuStreamSynchronize)f)((CUstream)s); }
static CUresult c_cuStreamWaitEvent(void *f, uintptr_t s, uintptr_t e, unsigned fl) { return ((pfn_cuStreamWaitEvent)f)((CUstream)s, (CUevent)e, fl); }
static CUresult c_cuEventCreate(void *f, CUevent *e, unsigned fl) { return ((pfn_cuEventCreate)f)(e, fl); }
static CUresult c_cuEventRecord(void *f, uintptr_t e, uintptr_t s) { return ((pfn_cuEventRecord)f)((CUevent)e, (CUstream)s); }
static CUresult c_cuEventSynchronize(void *f, uintptr_t e) { return ((pfn_cuEventSynchronize)f)((CUevent)e); }
static CUresult c_cuEventElapsedTime(void *f, float *ms, uintptr_t a, uintptr_t b) { return ((pfn_cuEventElapsedTime)f)(ms, (CUevent)a, (CUevent)b); }
static CUresult c_cuEventDestroy(void *f, uintptr_t e) { return ((pfn_cuEventDestroy)f)((CUevent)e); }
static CUresult c_cuModuleLoadData(void *f, CUmodule *m, const void *img) { return ((pfn_cuModuleLoadData)f)(m, img); }
static CUresult c_cuModuleGetFunction(void *f, CUfunction *fn, uintptr_t m, const char *n) { return ((pfn_cuModuleGetFunction)f)(fn, (CUmodule)m, n); }
static CUresult c_cuLaunchKernel(void *f, uintptr_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				 unsigned bz, unsigned shm, uintptr_t s, void **params) {
	return ((pfn_cuLaunchKernel)f)((CUfunction)fn, gx, gy, gz, bx, by, bz, shm, (CUstream)s, params, NULL);
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Device attributes (CUdevice_attribute) titan reads.
const (
	AttrMultiprocessorCount  = 16
	AttrClockRate            = 13 // kHz
	AttrMemoryClockRate      = 36 // kHz
	AttrGlobalMemoryBusWidth = 37 // bits
	AttrComputeCapMajor      = 75
	AttrComputeCapMinor      = 76
	AttrPCIBusID             = 33
)

// Handles of the driver API.
type (
	Context  uintptr
	Module   uintptr
	Function uintptr
	Stream   uintptr
	Event    uintptr
	DevPtr   uint64
)

// driverSyms are the functions Driver resolves, with the versioned names
// cuda.h maps the plain ones to.
var driverSyms = []string{
	"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
	"cuDeviceGetAttribute", "cuDeviceTotalMem_v2", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
	"cuCtxSynchronize", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuMemcpyHtoD_v2",
	"cuMemcpyDtoH_v2", "cuMemcpyDtoDAsync_v2", "cuMemsetD8Async", "cuStreamCreate", "cuStreamDestroy_v2",
	"cuStreamSynchronize", "cuStreamWaitEvent", "cuEventCreate", "cuEventRecord", "cuEventSynchronize",
	"cuEventElapsedTime", "cuEventDestroy_v2", "cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel",
}

// Driver is the loaded CUDA driver API.
type Driver struct {
	Lib *Library
	fn  map[string]unsafe.Pointer
}

var (
	driverOnce sync.Once
	driver     *Driver
	driverErr  error
)

// LoadDriver loads libcuda.so.1 once, resolves every function titan uses
// and calls cuInit(0).
func LoadDriver() (*Driver, error) {
	driverOnce.Do(func() { driver, driverErr = loadDriver() })
	return driver, driverErr
}

func loadDriver() (*Driver, error) {
	lib, err := Open("libcuda.so.1", "libcuda.so")
	if err != nil {
		return nil, err
	}
	d, err := bindDriver(lib)
	if err != nil {
		return nil, err
	}
	if err := cuErr("cuInit", int(C.c_cuInit(d.fn["cuInit"], 0))); err != nil {
		return nil, err
	}
	return d, nil
}

// bindDriver resolves driverSyms in lib.
func bindDriver(lib *Library) (*Driver, error) {
	d := &Driver{Lib: lib, fn: map[string]unsafe.Pointer{}}
	for _, s := range driverSyms {
		p, err := lib.Sym(s)
		if err != nil {
			return nil, err
		}
		d.fn[s] = p
	}
	return d, nil
}

// Version is the driver's CUDA version (12040 for 12.4).
func (d *Driver) Version() (int, error) {
	var v C.int
	err := cuErr("cuDriverGetVersion", int(C.c_cuDriverGetVersion(d.fn["cuDriverGetVersion"], &v)))
	return int(v), err
}

// DeviceCount is the number of CUDA devices.
func (d *Driver) DeviceCount() (int, error) {
	var n C.int
	err := cuErr("cuDeviceGetCount", int(C.c_cuDeviceGetCount(d.fn["cuDeviceGetCount"], &n)))
	return int(n), err
}

// Device returns the handle of device ordinal i.
func (d *Driver) Device(i int) (int, error) {
	var h C.CUdevice
	err := cuErr("cuDeviceGet", int(C.c_cuDeviceGet(d.fn["cuDeviceGet"], &h, C.int(i))))
	return int(h), err
}

// DeviceName is the product name of device dev.
func (d *Driver) DeviceName(dev int) (string, error) {
	buf := (*C.char)(C.calloc(256, 1))
	defer C.free(unsafe.Pointer(buf))
	if err := cuErr("cuDeviceGetName", int(C.c_cuDeviceGetName(d.fn["cuDeviceGetName"], buf, 255, C.CUdevice(dev)))); err != nil {
		return "", err
	}
	return C.GoString(buf), nil
}

// Attribute reads one CUdevice_attribute of dev.
func (d *Driver) Attribute(dev, attr int) (int, error) {
	var v C.int
	err := cuErr(fmt.Sprintf("cuDeviceGetAttribute(%d)", attr), int(C.c_cuDeviceGetAttribute(d.fn["cuDeviceGetAttribute"], &v, C.int(attr), C.CUdevice(dev))))
	return int(v), err
}

// TotalMem is the memory of dev in bytes.
func (d *Driver) TotalMem(dev int) (int64, error) {
	var b C.size_t
	err := cuErr("cuDeviceTotalMem_v2", int(C.c_cuDeviceTotalMem(d.fn["cuDeviceTotalMem_v2"], &b, C.CUdevice(dev))))
	return int64(b), err
}

// PrimaryContext retains dev's primary context and makes it current on
// the calling OS thread.
func (d *Driver) PrimaryContext(dev int) (Context, error) {
	var c C.CUcontext
	if err := cuErr("cuDevicePrimaryCtxRetain", int(C.c_cuDevicePrimaryCtxRetain(d.fn["cuDevicePrimaryCtxRetain"], &c, C.CUdevice(dev)))); err != nil {
		return 0, err
	}
	return Context(uintptr(c)), d.SetCurrent(Context(uintptr(c)))
}

// SetCurrent binds ctx to the calling OS thread.
func (d *Driver) SetCurrent(ctx Context) error {
	return cuErr("cuCtxSetCurrent", int(C.c_cuCtxSetCurrent(d.fn["cuCtxSetCurrent"], C.uintptr_t(ctx))))
}

// Synchronize waits for all work of the current context.
func (d *Driver) Synchronize() error {
	return cuErr("cuCtxSynchronize", int(C.c_cuCtxSynchronize(d.fn["cuCtxSynchronize"])))
}

// MemAlloc allocates n bytes of device memory.
func (d *Driver) MemAlloc(n int) (DevPtr, error) {
	var p C.CUdeviceptr
	err := cuErr("cuMemAlloc_v2", int(C.c_cuMemAlloc(d.fn["cuMemAlloc_v2"], &p, C.size_t(n))))
	return DevPtr(p), err
}

// MemFree frees device memory.
func (d *Driver) MemFree(p DevPtr) error {
	return cuErr("cuMemFree_v2", int(C.c_cuMemFree(d.fn["cuMemFree_v2"], C.CUdeviceptr(p))))
}

// MemInfo returns the free and total memory of the current device.
func (d *Driver) MemInfo() (free, total int64, err error) {
	var f, t C.size_t
	err = cuErr("cuMemGetInfo_v2", int(C.c_cuMemGetInfo(d.fn["cuMemGetInfo_v2"], &f, &t)))
	return int64(f), int64(t), err
}

// HtoD copies n bytes from host memory src (pinned for the call by cgo)
// to dst.
func (d *Driver) HtoD(dst DevPtr, src unsafe.Pointer, n int) error {
	return cuErr("cuMemcpyHtoD_v2", int(C.c_cuMemcpyHtoD(d.fn["cuMemcpyHtoD_v2"], C.CUdeviceptr(dst), src, C.size_t(n))))
}

// DtoH copies n bytes from src to host memory dst.
func (d *Driver) DtoH(dst unsafe.Pointer, src DevPtr, n int) error {
	return cuErr("cuMemcpyDtoH_v2", int(C.c_cuMemcpyDtoH(d.fn["cuMemcpyDtoH_v2"], dst, C.CUdeviceptr(src), C.size_t(n))))
}

// DtoDAsync queues a device-to-device copy on s.
func (d *Driver) DtoDAsync(dst, src DevPtr, n int, s Stream) error {
	return cuErr("cuMemcpyDtoDAsync_v2", int(C.c_cuMemcpyDtoDAsync(d.fn["cuMemcpyDtoDAsync_v2"], C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), C.uintptr_t(s))))
}

// MemsetAsync queues setting n bytes at p to v on s.
func (d *Driver) MemsetAsync(p DevPtr, v byte, n int, s Stream) error {
	return cuErr("cuMemsetD8Async", int(C.c_cuMemsetD8Async(d.fn["cuMemsetD8Async"], C.CUdeviceptr(p), C.uchar(v), C.size_t(n), C.uintptr_t(s))))
}

// StreamCreate creates a non-blocking stream (CU_STREAM_NON_BLOCKING).
func (d *Driver) StreamCreate() (Stream, error) {
	var s C.CUstream
	err := cuErr("cuStreamCreate", int(C.c_cuStreamCreate(d.fn["cuStreamCreate"], &s, 1)))
	return Stream(uintptr(s)), err
}

// StreamDestroy destroys s.
func (d *Driver) StreamDestroy(s Stream) error {
	return cuErr("cuStreamDestroy_v2", int(C.c_cuStreamDestroy(d.fn["cuStreamDestroy_v2"], C.uintptr_t(s))))
}

// StreamSynchronize waits for the work queued on s.
func (d *Driver) StreamSynchronize(s Stream) error {
	return cuErr("cuStreamSynchronize", int(C.c_cuStreamSynchronize(d.fn["cuStreamSynchronize"], C.uintptr_t(s))))
}

// StreamWaitEvent makes later work of s wait for e.
func (d *Driver) StreamWaitEvent(s Stream, e Event) error {
	return cuErr("cuStreamWaitEvent", int(C.c_cuStreamWaitEvent(d.fn["cuStreamWaitEvent"], C.uintptr_t(s), C.uintptr_t(e), 0)))
}

// EventCreate creates an event; timing false disables timing (cheaper).
func (d *Driver) EventCreate(timing bool) (Event, error) {
	var e C.CUevent
	fl := C.uint(2) // CU_EVENT_DISABLE_TIMING
	if timing {
		fl = 0
	}
	err := cuErr("cuEventCreate", int(C.c_cuEventCreate(d.fn["cuEventCreate"], &e, fl)))
	return Event(uintptr(e)), err
}

// EventRecord records e on s.
func (d *Driver) EventRecord(e Event, s Stream) error {
	return cuErr("cuEventRecord", int(C.c_cuEventRecord(d.fn["cuEventRecord"], C.uintptr_t(e), C.uintptr_t(s))))
}

// EventSynchronize waits for e.
func (d *Driver) EventSynchronize(e Event) error {
	return cuErr("cuEventSynchronize", int(C.c_cuEventSynchronize(d.fn["cuEventSynchronize"], C.uintptr_t(e))))
}

// EventElapsed is the time in milliseconds between two recorded events.
func (d *Driver) EventElapsed(a, b Event) (float32, error) {
	var ms C.float
	err := cuErr("cuEventElapsedTime", int(C.c_cuEventElapsedTime(d.fn["cuEventElapsedTime"], &ms, C.uintptr_t(a), C.uintptr_t(b))))
	return float32(ms), err
}

// EventDestroy destroys e.
func (d *Driver) EventDestroy(e Event) error {
	return cuErr("cuEventDestroy_v2", int(C.c_cuEventDestroy(d.fn["cuEventDestroy_v2"], C.uintptr_t(e))))
}

// ModuleLoad loads a cubin image.
func (d *Driver) ModuleLoad(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, fmt.Errorf("cuModuleLoadData: empty image")
	}
	img := C.CBytes(image)
	defer C.free(img)
	var m C.CUmodule
	err := cuErr("cuModuleLoadData", int(C.c_cuModuleLoadData(d.fn["cuModuleLoadData"], &m, img)))
	return Module(uintptr(m)), err
}

// Function looks a kernel up by name.
func (d *Driver) Function(m Module, name string) (Function, error) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	var f C.CUfunction
	err := cuErr("cuModuleGetFunction("+name+")", int(C.c_cuModuleGetFunction(d.fn["cuModuleGetFunction"], &f, C.uintptr_t(m), cn)))
	return Function(uintptr(f)), err
}

// Launch queues kernel f on s with the given arguments (see PackParams).
func (d *Driver) Launch(f Function, name string, grid, block [3]uint32, s Stream, args ...any) error {
	p, err := PackParams(args)
	if err != nil {
		return fmt.Errorf("cuLaunchKernel(%s): %w", name, err)
	}
	defer p.Free()
	return cuErr("cuLaunchKernel("+name+")", int(C.c_cuLaunchKernel(d.fn["cuLaunchKernel"], C.uintptr_t(f),
		C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]), C.uint(block[0]), C.uint(block[1]), C.uint(block[2]),
		0, C.uintptr_t(s), p.Ptr())))
}
