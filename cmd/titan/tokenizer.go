package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/tokenizer"
)

func newTokenizerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tokenizer",
		Short: "Train a BPE tokenizer or encode text",
		Example: `  titan tokenizer train --vocab-size 2000 --output my.model corpus.txt
  titan tokenizer encode --tokenizer my.model "hello world"`,
	}
	var vocab int
	var output, format string
	trainCmd := &cobra.Command{
		Use:   "train CORPUS...",
		Short: "Learn a byte-level BPE vocabulary from text files",
		Example: `  titan tokenizer train --vocab-size 2000 --output my.model corpus.txt
  titan tokenizer train --vocab-size 4096 --format huggingface --output tok.json docs/*.md`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var readers []io.Reader
			for _, p := range args {
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				defer f.Close()
				readers = append(readers, f, strings.NewReader("\n"))
			}
			bpe, err := tokenizer.Train(io.MultiReader(readers...), vocab, tokenizer.TrainOptions{})
			if err != nil {
				return err
			}
			tmp, err := os.CreateTemp(filepath.Dir(output), ".tokenizer-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			w := bufio.NewWriter(tmp)
			switch format {
			case "tiktoken":
				err = bpe.SaveTiktoken(w)
			case "huggingface":
				err = bpe.SaveHuggingFace(w)
			default:
				err = fmt.Errorf("--format %q: want tiktoken or huggingface", format)
			}
			if err == nil {
				err = w.Flush()
			}
			if err == nil {
				err = tmp.Sync()
			}
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), output); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d tokens\n", output, bpe.VocabSize())
			return nil
		},
	}
	trainCmd.Flags().IntVar(&vocab, "vocab-size", 2000, "mergeable tokens to learn (256 bytes included; specials are added on top)")
	trainCmd.Flags().StringVar(&output, "output", "tokenizer.model", "file to write")
	trainCmd.Flags().StringVar(&format, "format", "tiktoken", "tiktoken or huggingface")

	var tokPath string
	var specials, decode bool
	encodeCmd := &cobra.Command{
		Use:   "encode [TEXT]",
		Short: "Print the token ids of TEXT (or standard input)",
		Example: `  titan tokenizer encode --tokenizer my.model "hello world"
  echo "1 2 3" | titan tokenizer encode --tokenizer my.model --decode`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tok, err := tokenizer.Load(tokPath)
			if err != nil {
				return err
			}
			text := ""
			if len(args) == 1 {
				text = args[0]
			} else {
				raw, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return err
				}
				text = string(raw)
			}
			out := cmd.OutOrStdout()
			if decode {
				var ids []int
				for _, f := range strings.Fields(text) {
					var id int
					if _, err := fmt.Sscan(f, &id); err != nil || id < 0 || id >= tok.VocabSize() {
						return fmt.Errorf("%q is not a token id of this tokenizer (vocabulary %d)", f, tok.VocabSize())
					}
					ids = append(ids, id)
				}
				fmt.Fprint(out, tok.Decode(ids))
				return nil
			}
			ids := tok.Encode(text)
			if specials {
				ids = tok.EncodeWithSpecials(text)
			}
			strs := make([]string, len(ids))
			for i, id := range ids {
				strs[i] = fmt.Sprint(id)
			}
			fmt.Fprintln(out, strings.Join(strs, " "))
			return nil
		},
	}
	encodeCmd.Flags().StringVar(&tokPath, "tokenizer", "byte", "tokenizer file or folder (tiktoken .model, tokenizer.json, or byte)")
	encodeCmd.Flags().BoolVar(&specials, "specials", false, "recognise special tokens' text")
	encodeCmd.Flags().BoolVar(&decode, "decode", false, "read token ids and print their text")
	cmd.AddCommand(trainCmd, encodeCmd)
	return cmd
}
