package file

import (
	"bytes"
	"crypto/sha256"
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
	// sum is of the content as last read, so that an unchanged file is not
	// parsed again; the content itself is not kept. read is false until
	// a content was read (sum is then meaningless).
	sum  [sha256.Size]byte
	read bool
	err  error // the problem with the file as last read; nil when it parsed
	// parsed is the service of the content last read, nil when it did not
	// parse; good is the one last in use, kept while the file is broken or
	// rejected; nil when none has been in use yet.
	parsed, good *service
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
	names, err := listDir(sc.dir)
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
	sc.read(names)
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

// read brings sc.files up to date with the services files named (sorted),
// parsing those whose content changed; it drops the names that are gone.
// Files past maxTotalSize, in order, are not read.
func (sc *scanner) read(names []string) {
	var total int64 // bytes of the files read
	for _, name := range names {
		path := filepath.Join(sc.dir, name)
		data, ok, err := readFile(path, maxTotalSize-total)
		if !ok { // vanished since the listing, or a dangling symlink: deleted
			delete(sc.files, name)
			continue
		}
		total += int64(len(data))
		e := sc.files[name]
		if e == nil {
			e = &entry{}
			sc.files[name] = e
		}
		sum := sha256.Sum256(data)
		switch {
		case err != nil:
			e.read, e.err, e.parsed = false, err, nil
		case e.read && sum == e.sum:
		default:
			e.sum, e.read = sum, true
			e.parsed, e.err = parseSafely(path, data)
		}
	}
	for name := range sc.files {
		if _, ok := slices.BinarySearch(names, name); !ok {
			delete(sc.files, name)
		}
	}
}

// build gathers the services of the files named, in order: each file's
// current service, or its last good one while it is broken or would take
// the instances past maxInstances; a service name declared again is
// reported and left out. problems are by file.
func (sc *scanner) build(names []string) (cat *model.Catalog, services map[string]*service, declared, problems map[string]string) {
	cat = &model.Catalog{}
	services = map[string]*service{}
	declared = map[string]string{} // service name → file
	problems = map[string]string{}
	for _, name := range sc.present(names) {
		e := sc.files[name]
		svc := e.parsed
		if e.err == nil && len(cat.Instances)+len(svc.instances) > maxInstances {
			e.err = &fileError{File: filepath.Join(sc.dir, name), Line: svc.line, Msg: fmt.Sprintf(
				"service %s has %d instance(s), which would take the services files past %d instances together (files are taken in lexical order of their names)",
				svc.name, len(svc.instances), maxInstances)}
			e.read = false // read it again: it may fit once others shrink
		}
		if e.err != nil {
			svc = e.good
			if svc != nil && len(cat.Instances)+len(svc.instances) > maxInstances {
				svc = nil
			}
			keeps := "it contributes nothing until it parses"
			if svc != nil {
				keeps = fmt.Sprintf("until then its last good content stays in use (service %s with %d instance(s))", svc.name, len(svc.instances))
			}
			problems[name] = fmt.Sprintf("%v; fix the file: %s", e.err, keeps)
		}
		e.good = svc
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

// present returns the names that read kept: those still there.
func (sc *scanner) present(names []string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return sc.files[n] == nil })
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

// readFile reads a regular file (through symlinks) of at most maxFileSize
// and budget bytes; a larger one is an error, and is not read. ok is false
// when there is no file at path: it vanished, or a symlink dangles, as
// happens while a Kubernetes ConfigMap volume swaps its data.
func readFile(path string, budget int64) (data []byte, ok bool, err error) {
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
	tooBig := func(size int64) error {
		return &fileError{File: path, Msg: fmt.Sprintf("%d bytes, larger than %d KiB, the most a services file may hold; it is not read (one file declares one service: shorten it)", size, maxFileSize>>10)}
	}
	overBudget := func() error {
		return &fileError{File: path, Msg: fmt.Sprintf("not read: with it the services files would hold more than %d MiB together (files are taken in lexical order of their names)", maxTotalSize>>20)}
	}
	switch { // checked before reading: the size is all it takes
	case fi.Size() > maxFileSize:
		return nil, true, tooBig(fi.Size())
	case fi.Size() > budget:
		return nil, true, overBudget()
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, &fileError{File: path, Msg: err.Error()}
	}
	defer f.Close()
	// The file may have grown since Stat: read one byte past the limit to
	// tell, into a buffer of the size Stat gave (no doubling).
	limit := min(int64(maxFileSize), budget)
	buf := bytes.NewBuffer(make([]byte, 0, min(fi.Size(), limit)+bytes.MinRead))
	if _, err := buf.ReadFrom(io.LimitReader(f, limit+1)); err != nil {
		return nil, true, &fileError{File: path, Msg: err.Error()}
	}
	if n := int64(buf.Len()); n > limit {
		if n > maxFileSize {
			return nil, true, tooBig(n)
		}
		return nil, true, overBudget()
	}
	return buf.Bytes(), true, nil
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

// logChanges logs what changed between two scans: one info line with the
// counts and the first few names (a directory of 5,000 services, or one
// file written a thousand times, must not flood the log), and a line per
// service at debug: "service changed service=web added=1 removed=0
// changed=2 instances=4".
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
	var added, removed, changed []string
	for _, n := range names {
		b, a := before[n], after[n]
		switch {
		case b == nil:
			added = append(added, n)
			log.Debug("service added", "service", n, "file", files[n], "instances", len(a.instances))
		case a == nil:
			removed = append(removed, n)
			log.Debug("service removed", "service", n, "instances_before", len(b.instances))
		default:
			add, rm, ch := model.DiffInstances(b.instances, a.instances)
			if add+rm+ch > 0 {
				changed = append(changed, n)
				log.Debug("service changed", "service", n, "file", files[n], "added", add, "removed", rm, "changed", ch, "instances", len(a.instances))
			}
		}
	}
	if len(added)+len(removed)+len(changed) == 0 {
		return
	}
	log.Info("services files changed", "added", len(added), "removed", len(removed), "changed", len(changed),
		"services", firstFew(slices.Concat(added, removed, changed)))
}

// firstFew names up to five services and counts the rest.
func firstFew(names []string) string {
	const few = 5
	if len(names) <= few {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s (+%d more)", strings.Join(names[:few], ", "), len(names)-few)
}
