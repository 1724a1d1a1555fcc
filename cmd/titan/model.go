package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/evaluate"
	"github.com/titan-go/titan/internal/generate"
	"github.com/titan-go/titan/internal/generate/hyenagen"
	"github.com/titan-go/titan/internal/longconv"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/modelfile"
)

func newEvalCmd() *cobra.Command {
	var ckpt, textFile, tokensFile string
	var seqLen, threads int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Mean next-token loss and perplexity of a checkpoint",
		Long: `Evaluate a checkpoint on text (tokenized with the checkpoint's tokenizer,
BOS first) or on token ids: one sequence per line, whitespace-separated.
The loss is the mean over every predicted token of every sequence.`,
		Example: `  titan eval --checkpoint outputs/checkpoint --text notes.txt
  titan eval --checkpoint outputs/checkpoint/step-200 --tokens ids.txt --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (textFile == "") == (tokensFile == "") {
				return fmt.Errorf("give exactly one of --text FILE or --tokens FILE")
			}
			m, err := modelfile.Load(ckpt)
			if err != nil {
				return err
			}
			if m.Desc.Name == "hyena" {
				return fmt.Errorf("%s holds a hyena model: %s is not supported for hyena yet", ckpt, cmd.Name())
			}
			var seqs [][]int32
			if textFile != "" {
				raw, err := os.ReadFile(textFile)
				if err != nil {
					return err
				}
				ids := m.Tokenizer.Encode(string(raw))
				if b := m.Tokenizer.BOS(); b >= 0 {
					ids = append([]int{b}, ids...)
				}
				seq := make([]int32, len(ids))
				for i, id := range ids {
					seq[i] = int32(id)
				}
				seqs = [][]int32{seq}
			} else {
				f, err := os.Open(tokensFile)
				if err != nil {
					return err
				}
				seqs, err = evaluate.ReadTokenLines(f, m.Desc.Config.VocabSize)
				f.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", tokensFile, err)
				}
			}
			be := cpu.New(threads)
			defer be.Close()
			if seqLen <= 0 {
				seqLen = 1
				for _, s := range seqs {
					seqLen = max(seqLen, len(s)-1)
				}
				seqLen = min(seqLen, 2048, m.Desc.Config.MaxSeqLen)
			}
			ev, err := evaluate.New(be, m.Desc.Config, m.Params, seqLen)
			if err != nil {
				return err
			}
			for _, s := range seqs {
				if err := ev.Add(s); err != nil {
					return err
				}
			}
			res, err := ev.Result()
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "loss %.6f  perplexity %.4f  tokens %d\n", res.Loss, res.Perplexity, res.Tokens)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&ckpt, "checkpoint", "", "checkpoint folder (a step-N folder, or a folder of them: the newest is used)")
	f.StringVar(&textFile, "text", "", "text file to score")
	f.StringVar(&tokensFile, "tokens", "", "token-id file to score: one sequence per line")
	f.IntVar(&seqLen, "seq-len", 0, "window length (0: the longest sequence, at most 2048)")
	f.IntVar(&threads, "threads", 0, "CPU threads (0: all)")
	f.BoolVar(&asJSON, "json", false, `print {"loss", "tokens", "perplexity"} as JSON`)
	cmd.MarkFlagRequired("checkpoint")
	return cmd
}

func newGenerateCmd() *cobra.Command {
	var ckpt, prompt, mode string
	var maxNew, topK, threads, batch int
	var temperature, topP float64
	var seed uint64
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Sample text from a checkpoint",
		Long: `Sample a continuation of a prompt, printing tokens as they come.

A llama3 checkpoint generates with a key/value cache. A hyena checkpoint
prefills the prompt (BOS first) in one parallel pass and then runs one
position at a time, its long convolutions computed online by --mode: lazy
(a dot product over the history per token), eager (each input pushed into
every later position) or flash (Flash Inference's relaxed tiling,
O(L log² L)); all three give the same text up to float32 rounding.
--batch N samples N continuations of the prompt together, sequence i with
seed --seed + i, and prints each when all are done.`,
		Example: `  titan generate --checkpoint outputs/checkpoint --prompt "func main() {"
  titan generate --checkpoint outputs/checkpoint --prompt "package" --temperature 0.8 --top-k 40 --seed 3
  titan generate --checkpoint outputs/hyena_debug/checkpoint --prompt "package" --mode flash --batch 4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if maxNew < 1 {
				return fmt.Errorf("--max-new-tokens %d: generate at least one token", maxNew)
			}
			if batch < 1 {
				return fmt.Errorf("--batch %d must be positive", batch)
			}
			m, err := modelfile.Load(ckpt)
			if err != nil {
				return err
			}
			if m.Desc.Name == "hyena" {
				lmode, err := hyenagen.ParseMode(mode)
				if err != nil {
					return fmt.Errorf("--mode: %w", err)
				}
				return hyenaGenerate(cmd, m, hyenaGenOptions{prompt: prompt, mode: lmode, batch: batch, maxNew: maxNew, threads: threads,
					temperature: temperature, topK: topK, topP: topP, seed: seed})
			}
			if mode != "flash" {
				return fmt.Errorf("--mode %q: %s holds a %s model, which generates with a key/value cache; --mode applies to hyena checkpoints", mode, ckpt, m.Desc.Name)
			}
			if batch != 1 {
				return fmt.Errorf("--batch %d: %s holds a %s model, which generates one sequence at a time; --batch applies to hyena checkpoints", batch, ckpt, m.Desc.Name)
			}
			s, err := generate.NewSampler(temperature, topK, topP, seed)
			if err != nil {
				return err
			}
			be := cpu.New(threads)
			defer be.Close()
			promptLen := len(m.Tokenizer.Encode(prompt)) + 1
			maxT := min(promptLen+maxNew, m.Desc.Config.MaxSeqLen)
			if promptLen >= maxT {
				return fmt.Errorf("prompt of %d tokens leaves no room under max_seq_len %d", promptLen, m.Desc.Config.MaxSeqLen)
			}
			model, err := llama.New(be, m.Desc.Config, 1, 1, llama.Plan{})
			if err != nil {
				return err
			}
			be.Upload(model.Params, m.Params)
			in, err := llama.NewInference(model, maxT)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprint(out, prompt)
			_, err = generate.Run(in, m.Tokenizer, prompt, maxT-promptLen, s, func(text string) { fmt.Fprint(out, text) })
			fmt.Fprintln(out)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&ckpt, "checkpoint", "", "checkpoint folder")
	f.StringVar(&prompt, "prompt", "", "text to continue")
	f.IntVar(&maxNew, "max-new-tokens", 200, "most tokens to generate")
	f.Float64Var(&temperature, "temperature", 0.8, "sampling temperature (0: greedy)")
	f.IntVar(&topK, "top-k", 0, "sample among the k most likely tokens (0: all)")
	f.Float64Var(&topP, "top-p", 0.95, "nucleus sampling threshold (1: off)")
	f.Uint64Var(&seed, "seed", 0, "sampling seed (sequence i of a batch uses seed+i)")
	f.IntVar(&threads, "threads", 0, "CPU threads (0: all)")
	f.StringVar(&mode, "mode", "flash", "hyena only: how the long convolutions run, lazy, eager or flash")
	f.IntVar(&batch, "batch", 1, "hyena only: continuations of the prompt sampled together")
	cmd.MarkFlagRequired("checkpoint")
	return cmd
}

// hyenaGenOptions are titan generate's settings for a hyena checkpoint.
type hyenaGenOptions struct {
	prompt                 string
	mode                   longconv.Mode
	batch, maxNew, threads int
	temperature, topP      float64
	topK                   int
	seed                   uint64
}

// hyenaGenerate samples o.batch continuations of the prompt from the
// hyena model m: one sequence streams as it comes, several are printed
// one after the other at the end.
func hyenaGenerate(cmd *cobra.Command, m *modelfile.Model, o hyenaGenOptions) error {
	cfg, tok := *m.Desc.Hyena, m.Tokenizer
	ids := tok.Encode(o.prompt)
	if b := tok.BOS(); b >= 0 {
		ids = append([]int{b}, ids...)
	}
	if len(ids) == 0 {
		return fmt.Errorf("--prompt is empty and the tokenizer has no BOS token to start from")
	}
	P := len(ids)
	L := min(P+o.maxNew, cfg.LMax)
	if P >= L {
		return fmt.Errorf("prompt of %d tokens leaves no room under the hyena model's l_max %d", P, cfg.LMax)
	}
	samplers := make([]*generate.Sampler, o.batch)
	for i := range samplers {
		s, err := generate.NewSampler(o.temperature, o.topK, o.topP, o.seed+uint64(i))
		if err != nil {
			return err
		}
		samplers[i] = s
	}
	be := cpu.New(o.threads)
	defer be.Close()
	params := be.Alloc(backend.Float32, len(m.Params))
	be.Upload(params, m.Params)
	g, err := hyenagen.New(be, cfg, params, hyenagen.Options{Mode: o.mode, B: o.batch, L: L, Threads: o.threads})
	if err != nil {
		return err
	}
	prompt := make([]int32, P)
	for i, id := range ids {
		prompt[i] = int32(id)
	}
	out := cmd.OutOrStdout()
	var emit func(row, token int)
	if o.batch == 1 {
		fmt.Fprint(out, o.prompt)
		ts := generate.NewTextStream(tok, func(text string) { fmt.Fprint(out, text) })
		defer func() { ts.Flush(); fmt.Fprintln(out) }()
		emit = func(_, token int) { ts.Add(token) }
	}
	rows, err := g.Sample(prompt, L-P, samplers, tok.EOS(), emit)
	if err != nil {
		return err
	}
	if o.batch > 1 {
		for i, r := range rows {
			fmt.Fprintf(out, "--- sequence %d (seed %d) ---\n%s%s\n", i, o.seed+uint64(i), o.prompt, tok.Decode(r))
		}
	}
	return nil
}

func newCheckpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Inspect, import and export checkpoints",
		Example: `  titan checkpoint inspect outputs/llama3_debug/checkpoint --verify
  titan checkpoint export --checkpoint outputs/llama3_debug/checkpoint --hf /tmp/hf
  titan checkpoint import --hf /tmp/hf --output ckpt/imported`,
	}
	var verify bool
	inspect := &cobra.Command{
		Use:   "inspect DIR",
		Short: "Show a checkpoint's contents (full or model-only), tensors, files and checksums",
		Long: `Show a checkpoint step folder: its step, whether it is full (the training
state a run resumes from) or model-only, its data files, every tensor with
its shape, chunks and bytes, and its states; then read everything back and
verify every checksum. Given a checkpoint folder, list every step folder
with its contents (naming the damaged ones and why) and show the newest.`,
		Example: `  titan checkpoint inspect outputs/checkpoint/step-200
  titan checkpoint inspect outputs/checkpoint --verify=false`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return inspectCheckpoint(cmd.OutOrStdout(), args[0], verify)
		},
	}
	inspect.Flags().BoolVar(&verify, "verify", true, "read every chunk and state and check its checksum (--verify=false: metadata only)")
	cmd.AddCommand(inspect)
	addHFCommands(cmd)
	return cmd
}
