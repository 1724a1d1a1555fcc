package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/backend/cpu/gemm"
	"github.com/titan-go/titan/internal/version"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "titan",
		Short: "Train Llama 3 style models with composable parallelism",
		Long: `titan trains Llama 3 style language models from TOML recipes.

Start with the built-in debug recipe, which needs no download:
  titan train --recipe recipes/llama3_debug.toml`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newTrainCmd(), newEvalCmd(), newGenerateCmd(), newCheckpointCmd(), newTokenizerCmd(), newConfigCmd(), newBenchCmd(), newRunsCmd(), newPlotCmd(), newTopCmd(), newDebugCmd(), newAggifyCmd(), newAnalyzeCmd(), newPlanCmd(), newDevicesCmd(), newVersionCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print titan's version, Go version and CPU kernel",
		Example: "  titan version",
		Args:    cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "titan %s (%s, %s/%s, gemm kernel %s)\n", version.String(), runtime.Version(), runtime.GOOS, runtime.GOARCH, gemm.Kernel())
		},
	}
}
