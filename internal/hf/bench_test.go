package hf

import (
	"testing"

	"github.com/titan-go/titan/internal/model/llama"
)

// BenchmarkExportImport writes the debug flavor (6.2 M parameters) as a
// Hugging Face checkpoint and reads it back; b.SetBytes counts the float32
// parameter bytes of one export plus one import.
func BenchmarkExportImport(b *testing.B) {
	cfg, err := llama.Flavor("debug")
	if err != nil {
		b.Fatal(err)
	}
	flat := make([]float32, cfg.NumParams())
	llama.InitParams(cfg, 1, flat, 0)
	for _, dtype := range []string{"float32", "bfloat16"} {
		b.Run(dtype, func(b *testing.B) {
			dir := b.TempDir()
			b.SetBytes(2 * 4 * int64(len(flat)))
			for b.Loop() {
				if err := Export(dir, cfg, flat, dtype, ExportOptions{}); err != nil {
					b.Fatal(err)
				}
				if _, _, err := Import(dir); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
