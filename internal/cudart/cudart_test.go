package cudart

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestErrorNamesTheCall(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{cuErr("cuMemAlloc_v2", 2), "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)"},
		{cuErr("cuInit", 100), "cuInit: CUDA_ERROR_NO_DEVICE (100)"},
		{cuErr("cuInit", 12345), "cuInit: unknown status (12345)"},
		{nvrtcErr("nvrtcCompileProgram", 6), "nvrtcCompileProgram: NVRTC_ERROR_COMPILATION (6)"},
		{cublasErr("cublasLtMatmul", 15), "cublasLtMatmul: CUBLAS_STATUS_NOT_SUPPORTED (15)"},
		{ncclErr("ncclAllReduce", 5), "ncclAllReduce: ncclInvalidUsage (5)"},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("got %v, want %q", tc.err, tc.want)
		}
	}
	if cuErr("cuInit", 0) != nil {
		t.Error("status 0 is not an error")
	}
}

func TestSearchDirs(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	site := filepath.Join(root, "site")
	for _, d := range []string{a, b, filepath.Join(site, "nvidia", "nccl", "lib"), filepath.Join(site, "nvidia", "cublas", "lib")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(LibPathEnv, a+string(os.PathListSeparator)+filepath.Join(root, "missing")+string(os.PathListSeparator)+b+string(os.PathListSeparator)+a)
	t.Setenv(SitePackagesEnv, site)
	got := SearchDirs()
	want := []string{a, b, filepath.Join(site, "nvidia", "cublas", "lib"), filepath.Join(site, "nvidia", "nccl", "lib")}
	if len(got) < len(want) || !reflect.DeepEqual(got[:len(want)], want) {
		t.Fatalf("SearchDirs = %q, want it to start with %q", got, want)
	}
}

func TestCandidatesVersioned(t *testing.T) {
	d := t.TempDir()
	for _, f := range []string{"libnvrtc.so.12", "libnvrtc.so.12.4.99", "libnvrtc.so.11.2"} {
		if err := os.WriteFile(filepath.Join(d, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := candidates([]string{"libnvrtc.so.12", "libnvrtc.so"}, []string{d})
	if got[0] != filepath.Join(d, "libnvrtc.so.12") || got[len(got)-2] != "libnvrtc.so.12" || got[len(got)-1] != "libnvrtc.so" {
		t.Fatalf("candidates = %q", got)
	}
	has := map[string]bool{}
	for _, p := range got {
		has[p] = true
	}
	for _, p := range []string{filepath.Join(d, "libnvrtc.so.12.4.99"), filepath.Join(d, "libnvrtc.so.11.2")} {
		if !has[p] {
			t.Errorf("candidates %q lack %s", got, p)
		}
	}
}

func TestMissingLibraryListsThePathsSearched(t *testing.T) {
	d1, d2 := t.TempDir(), t.TempDir()
	_, err := OpenIn([]string{d1, d2}, "libtitan_absent.so.1")
	if errors.Is(err, ErrNoCgo) {
		t.Skip("built without cgo")
	}
	var le *LibraryError
	if !errors.As(err, &le) {
		t.Fatalf("OpenIn = %v, want a *LibraryError", err)
	}
	msg := err.Error()
	for _, p := range []string{filepath.Join(d1, "libtitan_absent.so.1"), filepath.Join(d2, "libtitan_absent.so.1"), "libtitan_absent.so.1: ", LibPathEnv} {
		if !contains(msg, p) {
			t.Errorf("error does not mention %q:\n%s", p, msg)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}
