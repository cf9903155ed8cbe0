// Package regular opens files that must be regular files (configurations,
// templates, files a template reads) without ever blocking on a FIFO or a
// device put in their place.
package regular

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Error is a path that is not a regular file.
type Error struct {
	Path string
	Mode fs.FileMode
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s is %s, not a regular file", e.Path, Kind(e.Mode))
}

// Kind names a file type in words: "a FIFO", "a directory", ...
func Kind(m fs.FileMode) string {
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

// Open opens path for reading, or returns an *Error when it is not a
// regular file. O_NONBLOCK: opening a FIFO for reading would otherwise
// wait for a writer, for ever.
func Open(path string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, &Error{Path: path, Mode: fi.Mode()}
	}
	return f, fi, nil
}

// ReadFile reads a regular file whole; see Open.
func ReadFile(path string) ([]byte, error) {
	f, _, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
