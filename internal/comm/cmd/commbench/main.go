// Command commbench measures titan's collectives with N local processes,
// the way nccl-tests does, until the launcher's `titan bench comm` exists.
//
//	commbench -op allreduce -size 64MiB -nproc 4 -transport shm -json
//
// It starts N copies of itself that meet through a file store in a
// temporary directory; rank 0 prints one line per operation.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/titan-go/titan/internal/comm"
)

func main() {
	ops := flag.String("op", "allreduce", "comma-separated operations: "+strings.Join(comm.BenchOps, ", "))
	size := flag.String("size", "64MiB", "message size")
	nproc := flag.Int("nproc", 2, "number of processes")
	transport := flag.String("transport", "auto", "auto, tcp or shm")
	iters := flag.Int("iters", 20, "timed iterations")
	warmup := flag.Int("warmup", 5, "untimed iterations")
	asJSON := flag.Bool("json", false, "print JSON lines")
	segment := flag.String("segment", "", "TCP pipelining segment (Options.SegmentBytes)")
	slot := flag.String("slot", "", "shared-memory slot size (Options.ShmSlotBytes)")
	sockbuf := flag.String("sockbuf", "", "socket buffer size (Options.SocketBuffer)")
	cpuprofile := flag.String("cpuprofile", "", "write rank 0's CPU profile to this file")
	flag.Parse()

	if rs := os.Getenv("COMMBENCH_RANK"); rs != "" {
		if *cpuprofile != "" && rs == "0" {
			f, err := os.Create(*cpuprofile)
			if err == nil {
				pprof.StartCPUProfile(f)
				defer pprof.StopCPUProfile()
			}
		}
		if err := child(rs, *ops, *size, *nproc, *transport, *iters, *warmup, *asJSON, *segment, *slot, *sockbuf); err != nil {
			fmt.Fprintf(os.Stderr, "rank %s: %v\n", rs, err)
			pprof.StopCPUProfile()
			os.Exit(1)
		}
		return
	}
	if err := parent(*nproc); err != nil {
		fmt.Fprintln(os.Stderr, "commbench:", err)
		os.Exit(1)
	}
}

func parent(nproc int) error {
	if nproc < 1 {
		return fmt.Errorf("-nproc %d", nproc)
	}
	dir, err := os.MkdirTemp("", "commbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmds := make([]*exec.Cmd, nproc)
	for r := range nproc {
		c := exec.Command(exe, os.Args[1:]...)
		c.Env = append(os.Environ(), "COMMBENCH_RANK="+strconv.Itoa(r), "COMMBENCH_STORE="+dir)
		c.Stderr = os.Stderr
		if r == 0 {
			c.Stdout = os.Stdout
		}
		if err := c.Start(); err != nil {
			return err
		}
		cmds[r] = c
	}
	var first error
	for r, c := range cmds {
		if err := c.Wait(); err != nil && first == nil {
			first = fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return first
}

func child(rs, ops, size string, nproc int, transport string, iters, warmup int, asJSON bool, segment, slot, sockbuf string) error {
	rank, err := strconv.Atoi(rs)
	if err != nil {
		return err
	}
	bytes, err := comm.ParseSize(size)
	if err != nil {
		return err
	}
	store, err := comm.NewFileStore(os.Getenv("COMMBENCH_STORE"))
	if err != nil {
		return err
	}
	opts := comm.Options{Transport: transport, Timeout: 120 * time.Second}
	for _, p := range []struct {
		s   string
		dst *int
	}{{segment, &opts.SegmentBytes}, {slot, &opts.ShmSlotBytes}, {sockbuf, &opts.SocketBuffer}} {
		if p.s != "" {
			if *p.dst, err = comm.ParseSize(p.s); err != nil {
				return err
			}
		}
	}
	ctx := context.Background()
	g, err := comm.NewWorld(ctx, store, rank, nproc, opts)
	if err != nil {
		return err
	}
	defer g.Close()
	for _, op := range strings.Split(ops, ",") {
		res, err := comm.BenchCollective(ctx, g, op, bytes, iters, warmup)
		if err != nil {
			return err
		}
		if rank != 0 {
			continue
		}
		if asJSON {
			b, _ := json.Marshal(res)
			fmt.Println(string(b))
		} else {
			fmt.Printf("%-15s %10d bytes  nproc %d  %-5s  time %9.3f ms  algbw %7.3f GB/s  busbw %7.3f GB/s\n",
				res.Op, res.SizeBytes, res.NProc, res.Transport, res.TimeS*1e3, res.AlgBW, res.BusBW)
		}
	}
	return nil
}
