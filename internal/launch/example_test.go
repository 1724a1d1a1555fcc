package launch_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/launch"
)

// This is how a command such as `titan train` takes part in a run: as a
// launcher, as a worker, or alone.
func Example() {
	ctx := context.Background()
	flags := launch.Flags{NProc: 4} // from --nproc, --nnodes, --node-rank, --rdzv-endpoint
	spec, err := launch.Detect(os.Environ(), flags)
	if err != nil {
		fmt.Fprintln(os.Stderr, "titan:", err)
		os.Exit(2)
	}
	switch spec.Mode {
	case launch.ModeLauncher:
		// Spawn the workers; they re-run this command with the same
		// arguments and come back here as ModeWorker.
		err := launch.Launch(ctx, spec, os.Args[1:], os.Stdout)
		var we *launch.WorkerError
		if errors.As(err, &we) {
			fmt.Fprintln(os.Stderr, "titan:", err)
			os.Exit(we.ExitCode())
		}
	case launch.ModeWorker:
		w, err := launch.Join(ctx, spec)
		if err != nil {
			fmt.Fprintln(os.Stderr, "titan:", err)
			os.Exit(1)
		}
		// Train with w.Threads CPU threads, reducing gradients over w.World.
		grads := make([]float32, 1024)
		err = w.World.AllReduce(ctx, comm.F32(grads), comm.Avg)
		w.Close(err) // reports the exit (and its error) to the control plane
	case launch.ModeStandalone:
		// Train in this process, as without a launcher.
	}
}
