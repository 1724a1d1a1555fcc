//go:build unix

package comm

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// InstallFlightDumpOnSignal makes SIGUSR1 dump the flight recorders of
// this process to dir (flight-rank<R>.json), as the launcher asks when a
// rank is lost (a hang); with dir empty it only says it cannot (SIGUSR1
// would otherwise end the process). It returns a function that removes
// the handler.
func InstallFlightDumpOnSignal(dir string) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				if dir == "" {
					fmt.Fprintln(os.Stderr, "comm: SIGUSR1: the flight recorders are not dumped (comm.save_traces_folder is empty)")
					continue
				}
				if err := DumpFlight(dir, "SIGUSR1"); err != nil {
					fmt.Fprintln(os.Stderr, err)
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
