package file

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// Bounds on what the directory may hold, so that no input can make PID 1
// (and HAProxy with it) run out of memory. yaml.v3 builds a tree of about
// 70 bytes per byte of a services file (up to 120 for a file of one-byte
// values), so the size of one file sets the peak of a parse: 256 KiB parses
// within ~30 MiB. Files are parsed one at a time and only their services
// are kept, so the totals bound what stays in memory and what a rescan
// reads. A rejected file keeps its last good content, as a malformed one
// does.
const (
	// maxFileSize bounds one services file: ample for one service (2,000
	// instances written out with ids and tags take ~200 KiB).
	maxFileSize = 256 << 10
	// maxInstancesPerFile bounds the instances of one service.
	maxInstancesPerFile = 5_000
	// maxFiles bounds the services files in the directory: more belong in
	// a catalog such as Consul. Beyond it the directory is not read and
	// every service read before stays in use.
	maxFiles = 2_000
	// maxTotalSize bounds the bytes of all services files together; the
	// files past it in lexical order are rejected.
	maxTotalSize = 16 << 20
	// maxInstances bounds the instances of all services files together;
	// the services past it in lexical order of file names are rejected.
	maxInstances = 20_000
)

// listChunk is how many directory entries are read at a time.
const listChunk = 256

// errTooManyFiles is a directory with more than maxFiles services files.
var errTooManyFiles = fmt.Errorf("holds more than %d services files; none of its changes is read until some are removed (one file declares one service; a catalog such as Consul suits more)", maxFiles)

// listDir returns the names of the services files in dir, sorted, reading
// the directory a chunk at a time so that a directory of many other
// entries costs no memory. More than maxFiles is errTooManyFiles.
func listDir(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	for {
		entries, err := f.ReadDir(listChunk)
		for _, de := range entries {
			if isServicesFile(de.Name()) {
				if len(names) == maxFiles {
					return nil, errTooManyFiles
				}
				names = append(names, de.Name())
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(names)
	return names, nil
}
