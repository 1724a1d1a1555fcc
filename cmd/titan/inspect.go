package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/titan-go/titan/internal/bytesize"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/modelfile"
)

// inspectCheckpoint writes what titan checkpoint inspect shows of arg, a
// step folder or a folder of step folders, and verifies checksums unless
// verify is false.
func inspectCheckpoint(out io.Writer, arg string, verify bool) error {
	if _, err := os.Stat(filepath.Join(arg, "metadata.json")); errors.Is(err, os.ErrNotExist) {
		infos, problems, err := checkpoint.Scan(arg)
		if err != nil {
			return err
		}
		if len(infos)+len(problems) > 0 {
			fmt.Fprintf(out, "%s:\n", arg)
		}
		rows := map[int]string{}
		var steps []int
		for _, in := range infos {
			rows[in.Step] = fmt.Sprintf("  %-12s %s", filepath.Base(in.Dir), in.Meta.Kind())
			steps = append(steps, in.Step)
		}
		for _, p := range problems {
			rows[p.Step] = fmt.Sprintf("  %-12s damaged: %v", filepath.Base(p.Dir), p.Err)
			steps = append(steps, p.Step)
		}
		sort.Ints(steps)
		for _, s := range steps {
			fmt.Fprintln(out, rows[s])
		}
	}
	dir, err := modelfile.Resolve(arg)
	if err != nil {
		return err
	}
	r, err := checkpoint.Open(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	m := r.Meta
	what := "full: model, optimizer, data loader and training state (a run resumes from it exactly)"
	if !m.Full() {
		what = "model-only: weights and model description, no training state (use it as checkpoint.initial_load_path)"
	}
	commit := "committed (marker " + checkpoint.CommitMarker + " matches metadata.json)"
	if m.Version < 2 {
		commit = "complete (format version 1: metadata.json marks it)"
	}
	fmt.Fprintf(out, "%s: step %d, format version %d, %s\ncontents: %s\n", dir, m.Step, m.Version, commit, what)
	if raw, err := r.Blob(modelfile.ConfigBlob); err == nil {
		fmt.Fprintf(out, "model: %s\n", raw)
	}
	names := make([]string, 0, len(m.Tensors))
	var elems int64
	files := map[string]int{}
	for n, t := range m.Tensors {
		names = append(names, n)
		c := int64(1)
		for _, s := range t.Shape {
			c *= int64(s)
		}
		elems += c
		for _, ch := range t.Chunks {
			files[ch.File]++
		}
	}
	sort.Strings(names)
	if m.Layout != nil {
		fmt.Fprintf(out, "saved under: %s\n", m.Layout)
	} else {
		fmt.Fprintln(out, "saved under: an unrecorded layout (format version 1: one writer)")
	}
	if len(m.Ranks) > 0 {
		fmt.Fprintf(out, "shards: %d rank(s) wrote their own data files\n", len(m.Ranks))
		for _, p := range m.Ranks {
			file := p.File
			if file == "" {
				file = "(none: a replica)"
			}
			fmt.Fprintf(out, "  rank %-5d %-20s %d chunks, %s\n", p.Rank, file, p.Chunks, humanBytes(p.Bytes))
		}
	} else {
		fileNames := make([]string, 0, len(files))
		for f := range files {
			fileNames = append(fileNames, f)
		}
		sort.Strings(fileNames)
		fmt.Fprintf(out, "shards: %d data file(s)\n", len(fileNames))
		for _, f := range fileNames {
			size := int64(-1)
			if st, err := os.Stat(filepath.Join(dir, f)); err == nil {
				size = st.Size()
			}
			fmt.Fprintf(out, "  %-20s %d chunks, %s\n", f, files[f], humanBytes(size))
		}
	}
	for _, n := range names {
		t := m.Tensors[n]
		c := int64(1)
		for _, s := range t.Shape {
			c *= int64(s)
		}
		fmt.Fprintf(out, "  %-55s %-8s %-14s %d chunk(s), %s\n", n, t.DType, fmt.Sprint(t.Shape), len(t.Chunks), humanBytes(4*c))
	}
	blobs := make([]string, 0, len(m.Blobs))
	var blobBytes int64
	for n, b := range m.Blobs {
		blobs = append(blobs, n)
		blobBytes += b.Size
	}
	sort.Strings(blobs)
	fmt.Fprintf(out, "%d tensors, %d elements (%s); %d states (%s): %v\n", len(names), elems, humanBytes(4*elems), len(blobs), humanBytes(blobBytes), blobs)
	if !verify {
		fmt.Fprintln(out, "checksums: not verified (--verify=false)")
		return nil
	}
	if err := r.Verify(); err != nil {
		return err
	}
	fmt.Fprintln(out, "checksums: ok (every chunk and state)")
	return nil
}

// humanBytes formats a byte count (negative: unknown).
func humanBytes(n int64) string {
	if n < 0 {
		return "? bytes"
	}
	return bytesize.Human(n)
}
