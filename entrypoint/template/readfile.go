package template

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// readRegular reads a regular file. Anything else is refused without
// reading: a FIFO would block the render, and the apply loop with it, until
// a writer comes; a device may never end.
func readRegular(path string) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO for reading does not wait for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is %s, not a regular file: reading it could block rendering for ever; use a file", path, kind(fi.Mode()))
	}
	return io.ReadAll(f)
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	default:
		return "of type " + m.Type().String()
	}
}
