// Command titan trains Llama 3 style models. Each subcommand parses its
// flags and calls one function of an internal package.
package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// errInterrupted is a run stopped by Ctrl-C or SIGTERM after saving; the
// process exits with status 128 + the signal's number (130 after SIGINT,
// 143 after SIGTERM), as a shell reports a command the signal ended, so
// that scripts and schedulers tell it from a failure and a preemption
// from a Ctrl-C (see signalStatus).
var errInterrupted = errors.New("interrupted; resume with the same command")

// errInterruptedUnsaved is an interrupted run that had nothing to save
// (checkpointing off); it exits the same way.
var errInterruptedUnsaved = errors.New("interrupted")

// signalStatus is an interruption and the status the process exits with.
type signalStatus struct {
	error
	code int
}

func (s signalStatus) Unwrap() error { return s.error }

// interruptedBy wraps err, an interruption, with the exit status of the
// signal sigs received (SIGINT when it has none).
func interruptedBy(err error, sigs <-chan os.Signal) error {
	code := 128 + int(syscall.SIGINT)
	select {
	case s := <-sigs:
		if n, ok := s.(syscall.Signal); ok {
			code = 128 + int(n)
		}
	default:
	}
	return signalStatus{err, code}
}

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "titan:", err)
		var st signalStatus
		if errors.As(err, &st) {
			os.Exit(st.code)
		}
		if errors.Is(err, errInterrupted) || errors.Is(err, errInterruptedUnsaved) {
			os.Exit(130)
		}
		os.Exit(1)
	}
}
