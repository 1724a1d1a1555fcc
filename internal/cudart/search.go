package cudart

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// LibPathEnv names the environment variable of extra library folders.
const LibPathEnv = "TITAN_CUDA_LIB_PATH"

// SitePackagesEnv names the environment variable of extra Python
// site-packages folders searched for NVIDIA wheels.
const SitePackagesEnv = "TITAN_PYTHON_SITE_PACKAGES"

// SearchDirs returns the folders searched for the NVIDIA libraries, in
// order, without duplicates (see the package documentation). The bare
// name lookup of the system loader comes after them and is not listed.
func SearchDirs() []string {
	var dirs []string
	seen := map[string]bool{}
	add := func(d string) {
		if d == "" || seen[d] {
			return
		}
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return
		}
		seen[d] = true
		dirs = append(dirs, d)
	}
	for _, d := range filepath.SplitList(os.Getenv(LibPathEnv)) {
		add(d)
	}
	for _, sp := range sitePackages() {
		libs, _ := filepath.Glob(filepath.Join(sp, "nvidia", "*", "lib"))
		sort.Strings(libs)
		for _, l := range libs {
			add(l)
		}
	}
	return dirs
}

// sitePackages lists candidate Python site-packages folders.
func sitePackages() []string {
	var out []string
	out = append(out, filepath.SplitList(os.Getenv(SitePackagesEnv))...)
	var globs []string
	if venv := os.Getenv("VIRTUAL_ENV"); venv != "" {
		globs = append(globs, filepath.Join(venv, "lib", "python3*", "site-packages"))
	}
	if conda := os.Getenv("CONDA_PREFIX"); conda != "" {
		globs = append(globs, filepath.Join(conda, "lib", "python3*", "site-packages"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		globs = append(globs, filepath.Join(home, ".local", "lib", "python3*", "site-packages"))
	}
	globs = append(globs,
		"/usr/local/lib/python3*/dist-packages",
		"/usr/local/lib/python3*/site-packages",
		"/usr/lib/python3/dist-packages",
		"/usr/lib/python3*/site-packages",
		"/opt/conda/lib/python3*/site-packages",
	)
	for _, g := range globs {
		m, _ := filepath.Glob(g)
		sort.Strings(m)
		out = append(out, m...)
	}
	return out
}

// candidates returns the paths tried for a library known by names (most
// specific first, such as "libnvrtc.so.12", "libnvrtc.so"): every name in
// every search folder, plus versioned files matching name* there, then
// the bare names for the system loader.
func candidates(names []string, dirs []string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, d := range dirs {
		for _, n := range names {
			add(filepath.Join(d, n))
		}
		for _, n := range names {
			m, _ := filepath.Glob(filepath.Join(d, n+".*"))
			sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest version first
			for _, p := range m {
				if !strings.HasSuffix(p, ".alt") {
					add(p)
				}
			}
		}
	}
	for _, n := range names {
		add(n)
	}
	return out
}
