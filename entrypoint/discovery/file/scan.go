package file

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// maxFileSize bounds what one services file may hold.
const maxFileSize = 16 << 20

// isServicesFile reports whether a directory entry's name is one the source
// reads: *.yaml, *.yml or *.json in any case, and not hidden or an editor's
// backup, swap or lock file (.web.yaml.swp, web.yaml~, #web.yaml#, .#web.yaml).
func isServicesFile(name string) bool {
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "#") || strings.HasSuffix(name, "~") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// entry is what the source knows of one file.
type entry struct {
	data []byte // as last read, so that an unchanged file is not parsed again
	err  error  // the problem with the file as last read; nil when it parsed
	// good is the service from the last content that parsed, kept while the
	// file is broken; nil when no content has parsed yet.
	good *service
}

// scanner re-reads the directory. Only Run's goroutine uses it.
type scanner struct {
	dir   string
	log   *slog.Logger
	files map[string]*entry // by base name
	// problems are those last logged, by file base name ("" for the
	// directory), so that each is logged once rather than every rescan.
	problems map[string]string
	// services are those of the last successful scan, for logging changes.
	services map[string]*service
	order    *firstSeen // nil: no registration order
}

func newScanner(dir string, log *slog.Logger) *scanner {
	return &scanner{dir: dir, log: log, files: map[string]*entry{}, problems: map[string]string{}}
}

// scan re-reads the whole directory and returns the catalog of every
// service and the problems with files (malformed, unreadable, duplicate
// names) for the operator, each naming the file. err is a failure to read
// the directory itself; the caller then keeps what it had.
func (sc *scanner) scan() (cat *model.Catalog, problems []string, err error) {
	entries, err := os.ReadDir(sc.dir)
	if err != nil {
		err = fmt.Errorf("reading SEAMLESS_SERVICES_DIR %s: %w", sc.dir, err)
		msg := err.Error() + " (the services read before stay in use; check that the directory exists and is readable)"
		if sc.problems[""] != msg {
			sc.log.Error("cannot read the services directory; keeping the services read before", "dir", sc.dir, "err", err)
			sc.problems[""] = msg
		}
		return nil, nil, errors.New(msg)
	}
	if _, had := sc.problems[""]; had {
		sc.log.Info("services directory readable again", "dir", sc.dir)
		delete(sc.problems, "")
	}
	names := sc.read(entries)
	cat, services, declared, fileProblems := sc.build(names)
	if sc.order != nil {
		sc.order.stamp(cat)
	}

	sc.logProblems(fileProblems)
	for _, name := range names {
		if p := fileProblems[name]; p != "" {
			problems = append(problems, p)
		}
	}
	if sc.services == nil {
		sc.log.Info("services files read", "dir", sc.dir, "files", len(names), "services", len(services), "instances", len(cat.Instances))
	} else {
		logChanges(sc.log, sc.services, services, declared)
	}
	sc.services = services
	return cat, problems, nil
}

// read brings sc.files up to date with the directory's entries, parsing
// the files whose content changed, and returns the names of the services
// files in lexical order.
func (sc *scanner) read(entries []os.DirEntry) []string {
	var names []string // os.ReadDir sorts them
	for _, de := range entries {
		name := de.Name()
		if !isServicesFile(name) {
			continue
		}
		path := filepath.Join(sc.dir, name)
		data, ok, err := readFile(path)
		if !ok { // vanished since ReadDir, or a dangling symlink: deleted
			continue
		}
		names = append(names, name)
		e := sc.files[name]
		if e == nil {
			e = &entry{}
			sc.files[name] = e
		}
		switch {
		case err != nil:
			e.data, e.err = nil, err
		case e.data != nil && bytes.Equal(data, e.data):
		default:
			e.data = data
			svc, err := parseSafely(path, data)
			if e.err = err; err == nil {
				e.good = svc
			}
		}
	}
	for name := range sc.files {
		if _, ok := slices.BinarySearch(names, name); !ok {
			delete(sc.files, name)
		}
	}
	return names
}

// build gathers the services of the files named, in order: each file's
// current service, or its last good one while it is broken; a service
// name declared again is reported and left out. problems are by file.
func (sc *scanner) build(names []string) (cat *model.Catalog, services map[string]*service, declared, problems map[string]string) {
	cat = &model.Catalog{}
	services = map[string]*service{}
	declared = map[string]string{} // service name → file
	problems = map[string]string{}
	for _, name := range names {
		e := sc.files[name]
		if e.err != nil {
			keeps := "it contributes nothing until it parses"
			if e.good != nil {
				keeps = fmt.Sprintf("until then its last good content stays in use (service %s with %d instance(s))", e.good.name, len(e.good.instances))
			}
			problems[name] = fmt.Sprintf("%v; fix the file: %s", e.err, keeps)
		}
		svc := e.good
		if svc == nil {
			continue
		}
		if first, dup := declared[svc.name]; dup {
			p := fmt.Sprintf("%s:%d: service %q is already declared in %s:%d; this file is left out until one of them renames it or is removed",
				filepath.Join(sc.dir, name), svc.line, svc.name, filepath.Join(sc.dir, first), sc.files[first].good.line)
			if problems[name] != "" {
				p = problems[name] + "; and " + p
			}
			problems[name] = p
			continue
		}
		declared[svc.name] = name
		services[svc.name] = svc
		cat.Instances = append(cat.Instances, svc.instances...)
	}
	model.SortCatalog(cat)
	return cat, services, declared, problems
}

// logProblems logs each file's problem once, and that it is gone.
func (sc *scanner) logProblems(now map[string]string) {
	for name, p := range now {
		if sc.problems[name] != p {
			sc.log.Error("services file rejected", "file", filepath.Join(sc.dir, name), "err", p)
			sc.problems[name] = p
		}
	}
	for name := range sc.problems {
		if _, still := now[name]; !still && name != "" {
			sc.log.Info("services file problem resolved", "file", filepath.Join(sc.dir, name))
			delete(sc.problems, name)
		}
	}
}

// readFile reads a regular file (through symlinks). ok is false when there
// is no file at path: it vanished, or a symlink dangles, as happens while a
// Kubernetes ConfigMap volume swaps its data.
func readFile(path string) (data []byte, ok bool, err error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, &fileError{File: path, Msg: err.Error()}
	}
	if !fi.Mode().IsRegular() { // not opened: a FIFO would block
		return nil, true, &fileError{File: path, Msg: "not a regular file; give it a name that does not end in .yaml, .yml or .json"}
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, &fileError{File: path, Msg: err.Error()}
	}
	defer f.Close()
	data, err = io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, true, &fileError{File: path, Msg: err.Error()}
	}
	if len(data) > maxFileSize {
		return nil, true, &fileError{File: path, Msg: fmt.Sprintf("larger than %d MiB; split it", maxFileSize>>20)}
	}
	return data, true, nil
}

// parseSafely is parse that turns a panic into an error: a parser bug must
// not take PID 1, and HAProxy with it, down.
func parseSafely(file string, data []byte) (svc *service, err error) {
	defer func() {
		if r := recover(); r != nil {
			svc, err = nil, &fileError{File: file, Msg: fmt.Sprintf("the parser failed (%v); please report this with the file", r)}
		}
	}()
	return parse(file, data)
}

// logChanges logs what changed between two scans, service by service:
// "service changed service=web added=1 removed=0 changed=2 instances=4".
func logChanges(log *slog.Logger, before, after map[string]*service, files map[string]string) {
	var names []string
	for n := range before {
		names = append(names, n)
	}
	for n := range after {
		if before[n] == nil {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		b, a := before[n], after[n]
		switch {
		case b == nil:
			log.Info("service added", "service", n, "file", files[n], "instances", len(a.instances))
		case a == nil:
			log.Info("service removed", "service", n, "instances_before", len(b.instances))
		default:
			added, removed, changed := model.DiffInstances(b.instances, a.instances)
			if added+removed+changed > 0 {
				log.Info("service changed", "service", n, "file", files[n], "added", added, "removed", removed, "changed", changed, "instances", len(a.instances))
			}
		}
	}
}
