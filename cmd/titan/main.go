// Command titan trains Llama 3 style models. Each subcommand parses its
// flags and calls one function of an internal package.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "titan:", err)
		os.Exit(1)
	}
}
