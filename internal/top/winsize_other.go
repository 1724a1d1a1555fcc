//go:build !linux

package top

import "os"

// TerminalRows is the height of the terminal f in lines (0: unknown).
func TerminalRows(f *os.File) int { return 0 }
