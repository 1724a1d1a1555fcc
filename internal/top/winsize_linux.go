package top

import (
	"os"

	"golang.org/x/sys/unix"
)

// TerminalRows is the height of the terminal f in lines (0: unknown).
func TerminalRows(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Row)
}
