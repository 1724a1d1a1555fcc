package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/backend/cuda"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/devices"
	"github.com/titan-go/titan/internal/train"
)

func newDevicesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "devices",
		Short: "List the machine's GPUs: memory, utilization, clocks, NVLink, peak FLOP/s",
		Long: "devices lists the NVIDIA GPUs NVML sees. Without a GPU or driver it says\n" +
			"why none was found and exits 0.",
		Example: "  titan devices",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := devices.Detect()
			devices.Print(cmd.OutOrStdout(), r, err)
			if _, ok := err.(*devices.NoGPUError); ok || err == nil {
				return nil
			}
			return err
		},
	}
}

// trainDevice resolves training.device and opens it: the CPU backend, or
// GPU 0 through the CUDA backend with its own peak (bfloat16 tensor cores
// when parameters are bfloat16, plain float32 otherwise) as the MFU
// reference.
func trainDevice(job *config.Job, threads int, distributed bool) (train.Device, error) {
	kind, err := devices.Resolve(job.Training.Device, devices.Detect)
	if err != nil {
		return train.Device{}, err
	}
	if kind == devices.CPU {
		return cpuDevice(threads, job.Training.MixedPrecisionParam == "bfloat16"), nil
	}
	if distributed {
		return train.Device{}, fmt.Errorf("training.device = %q: distributed training on the CUDA backend is not wired yet (run one worker, or training.device = \"cpu\")", kind)
	}
	be, err := cuda.Open(0, cuda.Options{})
	if err != nil {
		return train.Device{}, fmt.Errorf("training.device = %q: %w", kind, err)
	}
	p, _ := be.Properties()
	bf16, f32, err := devices.Peak(p.Major, p.Minor, p.SMs, p.ClockKHz/1000)
	if err != nil {
		return train.Device{}, fmt.Errorf("training.device = %q: MFU reference of %s: %w", kind, p.Name, err)
	}
	peak := f32
	if job.Training.MixedPrecisionParam == "bfloat16" {
		peak = bf16
	}
	return train.Device{
		Backend:   be,
		Name:      fmt.Sprintf("cuda: %s (sm_%d%d, %d SMs at %d MHz)", p.Name, p.Major, p.Minor, p.SMs, p.ClockKHz/1000),
		PeakFLOPS: peak,
	}, nil
}
