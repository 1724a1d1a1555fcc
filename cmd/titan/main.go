// Command titan trains Llama 3 style models. Each subcommand parses its
// flags and calls one function of an internal package.
package main

import (
	"errors"
	"fmt"
	"os"
)

// errInterrupted is a run stopped by Ctrl-C or SIGTERM after saving; the
// process exits with status 130, as a shell reports a command that
// SIGINT ended, so that scripts tell it from a failure.
var errInterrupted = errors.New("interrupted; resume with the same command")

// errInterruptedUnsaved is an interrupted run that had nothing to save
// (checkpointing off); it exits 130 too.
var errInterruptedUnsaved = errors.New("interrupted")

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "titan:", err)
		if errors.Is(err, errInterrupted) || errors.Is(err, errInterruptedUnsaved) {
			os.Exit(130)
		}
		os.Exit(1)
	}
}
