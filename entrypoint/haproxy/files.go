package haproxy

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/seamless-lb/seamless/internal/regular"
)

// ConfigFiles are the files a list of -f arguments loads, as HAProxy
// expands them.
type ConfigFiles struct {
	// Files in load order: a file as given, a directory as its *.cfg
	// entries in lexical order, but for names beginning with "." and
	// sub-directories, which HAProxy skips.
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
	return fmt.Sprintf("%s is %s, not a regular file: HAProxy would block or fail reading it; replace it with a file", e.Path, regular.Kind(e.Mode))
}

// ConfigEntry is one file a list of -f arguments loads.
type ConfigEntry struct {
	Path string
	// NotRegular is set when the path exists and is not a regular file.
	NotRegular *NotRegularError
}

// ListConfigFiles lists what paths load, without opening anything but
// directories, entries that are not regular files included (marked). A
// path that does not exist is listed as it is, for HAProxy to report.
func ListConfigFiles(paths []string) (entries []ConfigEntry, emptyDirs []string, err error) {
	entry := func(p string, fi fs.FileInfo) ConfigEntry {
		if fi != nil && !fi.Mode().IsRegular() {
			return ConfigEntry{Path: p, NotRegular: &NotRegularError{Path: p, Mode: fi.Mode()}}
		}
		return ConfigEntry{Path: p}
	}
	for _, p := range paths {
		fi, err := os.Stat(p) // follows links, as HAProxy does
		if err != nil {
			entries = append(entries, ConfigEntry{Path: p})
			continue
		}
		if !fi.IsDir() {
			entries = append(entries, entry(p, fi))
			continue
		}
		des, err := os.ReadDir(p)
		if err != nil {
			return entries, emptyDirs, fmt.Errorf("configuration directory %s: %w", p, err)
		}
		var names []string
		for _, e := range des {
			// As HAProxy: names beginning with "." (backups, an editor's
			// lock links) are not configuration.
			if n := e.Name(); strings.HasSuffix(n, ".cfg") && !strings.HasPrefix(n, ".") {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		if len(names) == 0 {
			emptyDirs = append(emptyDirs, p)
		}
		for _, n := range names {
			f := filepath.Join(p, n)
			fi, _ := os.Stat(f) // a dangling link is listed, for HAProxy to report
			if fi != nil && fi.IsDir() {
				continue // HAProxy skips it
			}
			entries = append(entries, entry(f, fi))
		}
	}
	return entries, emptyDirs, nil
}

// ExpandConfigFiles lists what paths load, as ListConfigFiles. Anything
// that is not a regular file, given as a file or found as a *.cfg entry of
// a directory, is a *NotRegularError (HAProxy itself skips such entries of
// a directory, but their presence is a mistake worth stopping at); Files
// then holds the files before it.
func ExpandConfigFiles(paths []string) (ConfigFiles, error) {
	entries, empty, err := ListConfigFiles(paths)
	out := ConfigFiles{EmptyDirs: empty}
	for _, e := range entries {
		if e.NotRegular != nil {
			return out, e.NotRegular
		}
		out.Files = append(out.Files, e.Path)
	}
	return out, err
}

// emptyDirNote explains a directory that loads nothing.
func emptyDirNote(dir string) string {
	return fmt.Sprintf("%s is a directory with no *.cfg file, so it loads nothing (HAProxy loads the *.cfg files of a directory given to -f; a bind mount of a missing file creates an empty directory)", dir)
}
