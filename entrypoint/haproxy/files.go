package haproxy

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ConfigFiles are the files a list of -f arguments loads, as HAProxy
// expands them.
type ConfigFiles struct {
	// Files in load order: a file as given, a directory as its *.cfg
	// entries in lexical order.
	Files []string
	// EmptyDirs are directories with no *.cfg entry: alone on a command
	// line they load nothing, which HAProxy reports only with its usage.
	EmptyDirs []string
}

// NotRegularError is a configuration path that is not a regular file: a
// FIFO blocks every reader until a writer appears, a device never ends.
type NotRegularError struct {
	Path string
	Mode fs.FileMode
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("%s is %s, not a regular file: HAProxy would block or fail reading it; replace it with a file", e.Path, kind(e.Mode))
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

// ExpandConfigFiles lists what paths load, without opening anything but
// directories. Anything that is not a regular file, given as a file or
// found as a *.cfg entry of a directory, is a *NotRegularError (HAProxy
// itself skips such entries of a directory, but their presence is a
// mistake worth stopping at). A path that does not exist is listed as it
// is, for HAProxy to report.
func ExpandConfigFiles(paths []string) (ConfigFiles, error) {
	var out ConfigFiles
	for _, p := range paths {
		fi, err := os.Stat(p) // follows links, as HAProxy does
		if err != nil {
			out.Files = append(out.Files, p)
			continue
		}
		if !fi.IsDir() {
			if !fi.Mode().IsRegular() {
				return out, &NotRegularError{Path: p, Mode: fi.Mode()}
			}
			out.Files = append(out.Files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return out, fmt.Errorf("configuration directory %s: %w", p, err)
		}
		var names []string
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".cfg") {
				names = append(names, e.Name())
			}
		}
		sort.Strings(names)
		if len(names) == 0 {
			out.EmptyDirs = append(out.EmptyDirs, p)
		}
		for _, n := range names {
			f := filepath.Join(p, n)
			fi, err := os.Stat(f)
			if err != nil {
				out.Files = append(out.Files, f)
				continue
			}
			if !fi.Mode().IsRegular() {
				return out, &NotRegularError{Path: f, Mode: fi.Mode()}
			}
			out.Files = append(out.Files, f)
		}
	}
	return out, nil
}

// emptyDirNote explains a directory that loads nothing.
func emptyDirNote(dir string) string {
	return fmt.Sprintf("%s is a directory with no *.cfg file, so it loads nothing (HAProxy loads the *.cfg files of a directory given to -f; a bind mount of a missing file creates an empty directory)", dir)
}
