package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/hf"
	"github.com/titan-go/titan/internal/modelfile"
)

// addHFCommands adds checkpoint import and export (Hugging Face format).
func addHFCommands(cmd *cobra.Command) {
	var hfDir, output string
	importCmd := &cobra.Command{
		Use:   "import",
		Short: "Convert a Hugging Face Llama folder into a titan checkpoint",
		Long: `Read config.json and model.safetensors (or sharded safetensors with an
index) of a Hugging Face Llama model and write a titan checkpoint. Tokenizer
files in the folder are carried along; without them the checkpoint uses the
byte-level tokenizer.`,
		Example: `  titan checkpoint import --hf ~/models/Llama-3.1-8B --output ckpt/llama8b
  titan eval --checkpoint ckpt/llama8b --text notes.txt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, params, err := hf.Import(hfDir)
			if err != nil {
				return err
			}
			if err := modelfile.Save(output, 0, modelfile.Description{Name: "llama3", Config: cfg}, params, hfDir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "imported %d parameters into %s\n", len(params), output)
			return nil
		},
	}
	importCmd.Flags().StringVar(&hfDir, "hf", "", "Hugging Face model folder")
	importCmd.Flags().StringVar(&output, "output", "", "titan checkpoint folder to write")
	importCmd.MarkFlagRequired("hf")
	importCmd.MarkFlagRequired("output")

	var ckpt, out, dtype string
	var shard int64
	exportCmd := &cobra.Command{
		Use:   "export",
		Short: "Write a titan checkpoint as a Hugging Face Llama folder",
		Long: `Write config.json, generation_config.json and safetensors weights that
transformers' LlamaForCausalLM loads, plus the checkpoint's tokenizer files.`,
		Example: `  titan checkpoint export --checkpoint outputs/llama3_debug/checkpoint --hf /tmp/hf-debug
  titan checkpoint export --checkpoint ckpt/step-1000 --hf out --dtype bfloat16`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := modelfile.Load(ckpt)
			if err != nil {
				return err
			}
			if err := hf.ExportModel(m, out, dtype, shard); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "exported %s to %s (%s)\n", m.Dir, out, dtype)
			return nil
		},
	}
	exportCmd.Flags().StringVar(&ckpt, "checkpoint", "", "titan checkpoint folder")
	exportCmd.Flags().StringVar(&out, "hf", "", "Hugging Face folder to write")
	exportCmd.Flags().StringVar(&dtype, "dtype", "float32", "float32 or bfloat16")
	exportCmd.Flags().Int64Var(&shard, "max-shard-bytes", 0, "split weights into shards of at most this size (0: one file)")
	exportCmd.MarkFlagRequired("checkpoint")
	exportCmd.MarkFlagRequired("hf")
	cmd.AddCommand(importCmd, exportCmd)
}
