package file

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestNew(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	write(t, notDir, "")
	for _, tc := range []struct {
		name, dir, msg string
	}{
		{"empty", "", "SEAMLESS_SERVICES_DIR is empty"},
		{"missing", filepath.Join(dir, "nope"), "SEAMLESS_SERVICES_DIR " + filepath.Join(dir, "nope") + " does not exist"},
		{"not a directory", notDir, "SEAMLESS_SERVICES_DIR " + notDir + " is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Dir: tc.dir}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %q", err, tc.msg)
			}
		})
	}
	s, err := New(Config{Dir: dir + "/"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name() != "file" || s.rescan != DefaultRescan || s.dir != dir {
		t.Errorf("Name %q, rescan %s, dir %q", s.Name(), s.rescan, s.dir)
	}
}

func TestIsServicesFile(t *testing.T) {
	for name, want := range map[string]bool{
		"web.yaml": true, "web.yml": true, "web.json": true, "Web.YAML": true,
		"web.txt": false, "web": false, "README.md": false,
		".web.yaml": false, ".web.yaml.swp": false, "web.yaml~": false, "#web.yaml#": false,
		".#web.yaml": false, "..data": false, "web.yaml.tmp": false,
	} {
		if got := isServicesFile(name); got != want {
			t.Errorf("isServicesFile(%q) = %v", name, got)
		}
	}
}

func TestFirstSnapshotIsTheWholeDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "web.yaml"), svc("web", 80, 81))
	write(t, filepath.Join(dir, "api.json"), `{"name": "api", "instances": [{"address": "10.0.0.1", "port": 90}]}`)
	// Ignored: hidden, backups, other extensions, subdirectories.
	for _, name := range []string{".web.yaml.swp", "web.yaml~", "#web.yaml#", "notes.txt", ".hidden.yaml"} {
		write(t, filepath.Join(dir, name), svc("ignored", 1))
	}
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "..data", "x.yaml"), svc("ignored", 1))

	r := start(t, dir, time.Hour)
	s := r.next(t)
	if got := summary(s); got != "api:90 web:80,81" {
		t.Errorf("first snapshot %q", got)
	}
	if s.Source != "file" || len(s.Results) != 1 || s.Local() == nil {
		t.Errorf("snapshot %+v", s)
	}
	st := r.Status()
	if !st.Up || st.LastSuccess.IsZero() || st.Name != "file" {
		t.Errorf("status %+v", st)
	}
}

// A FIFO is not opened (that would block until a writer comes), and a
// directory is not read as a file: both are problems to report.
func TestEntriesThatAreNotFiles(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "web.yaml"), svc("web", 80))
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := start(t, dir, time.Hour)
	r.until(t, "web:80")
	testenv.Eventually(t, wait, "status reports the entries", func() bool { return !r.Status().Up })
	st := r.Status()
	if want := filepath.Join(dir, "fifo.yaml") + ": not a regular file"; !strings.Contains(st.LastError, want) ||
		!strings.Contains(st.LastError, "and 1 more file(s)") {
		t.Errorf("LastError %q, want %q and one more", st.LastError, want)
	}
}

func TestEmptyDirectorySendsAnEmptyCatalog(t *testing.T) {
	r := start(t, t.TempDir(), time.Hour)
	if s := r.next(t); s.Local() == nil || len(s.Local().Instances) != 0 {
		t.Errorf("first snapshot %+v", s)
	}
}

// Every change below is seen through inotify: the rescan is an hour.
func TestChangesAreSeen(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	write(t, web, svc("web", 80))
	r := start(t, dir, time.Hour)
	r.until(t, "web:80")

	t.Run("a file added", func(t *testing.T) {
		write(t, filepath.Join(dir, "api.yaml"), svc("api", 90))
		r.until(t, "api:90 web:80")
	})
	t.Run("a file written in place", func(t *testing.T) {
		write(t, web, svc("web", 80, 81))
		r.until(t, "api:90 web:80,81")
	})
	t.Run("a file renamed over", func(t *testing.T) {
		writeAtomic(t, web, svc("web", 82))
		r.until(t, "api:90 web:82")
	})
	t.Run("vim's backup, write, delete", func(t *testing.T) {
		if err := os.Rename(web, web+"~"); err != nil {
			t.Fatal(err)
		}
		write(t, web, svc("web", 83))
		if err := os.Remove(web + "~"); err != nil {
			t.Fatal(err)
		}
		r.until(t, "api:90 web:83")
	})
	t.Run("a file deleted", func(t *testing.T) {
		if err := os.Remove(filepath.Join(dir, "api.yaml")); err != nil {
			t.Fatal(err)
		}
		r.until(t, "web:83")
	})
	t.Run("a file renamed to a name that is not read", func(t *testing.T) {
		if err := os.Rename(web, web+".disabled"); err != nil {
			t.Fatal(err)
		}
		r.until(t, "")
	})
}

// A Kubernetes ConfigMap volume: each file is a symlink into ..data, a
// symlink to a timestamped directory that an update replaces.
func TestConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name string, files map[string]string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		for f, data := range files {
			write(t, filepath.Join(dir, name, f), data)
		}
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_01_01_00_00_00.1", map[string]string{"web.yaml": svc("web", 80)})
	if err := os.Symlink("..data/web.yaml", filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	r := start(t, dir, time.Hour)
	r.until(t, "web:80")

	version("..2026_01_01_00_00_00.2", map[string]string{"web.yaml": svc("web", 81)})
	if err := os.RemoveAll(filepath.Join(dir, "..2026_01_01_00_00_00.1")); err != nil {
		t.Fatal(err)
	}
	r.until(t, "web:81")

	// A key removed from the ConfigMap: its symlink dangles, then goes.
	version("..2026_01_01_00_00_00.3", map[string]string{})
	r.until(t, "")
	if st := r.Status(); !st.Up {
		t.Errorf("a dangling symlink is a removed file, not a problem: %+v", st)
	}
}

func TestMalformedFileKeepsItsLastGoodContent(t *testing.T) {
	dir := t.TempDir()
	web, api := filepath.Join(dir, "web.yaml"), filepath.Join(dir, "api.yaml")
	write(t, web, svc("web", 80))
	write(t, api, svc("api", 90))
	r := start(t, dir, time.Hour)
	r.until(t, "api:90 web:80")

	writeAtomic(t, web, svc("web", 80)+"  - address: 10.0.0.2\n    port: 70000\n")
	testenv.Eventually(t, wait, "status reports the malformed file", func() bool { return !r.Status().Up })
	st := r.Status()
	for _, want := range []string{web + ":6: port 70000 is outside 1-65535", "fix the file", "last good content stays in use (service web with 1 instance(s))"} {
		if !strings.Contains(st.LastError, want) {
			t.Errorf("LastError %q does not say %q", st.LastError, want)
		}
	}
	if st.LastErrorAt.IsZero() {
		t.Errorf("status %+v", st)
	}
	if n := r.logs.Count("services file rejected"); n != 1 {
		t.Errorf("logged the rejection %d times", n)
	}

	// Another file's change still applies, with web as it last parsed.
	writeAtomic(t, api, svc("api", 91))
	r.until(t, "api:91 web:80")

	// A file that never parsed contributes nothing.
	writeAtomic(t, filepath.Join(dir, "new.yaml"), "name: new\ninstances: [{address: h}]\n")
	testenv.Eventually(t, wait, "status reports the new file", func() bool {
		return strings.Contains(r.Status().LastError, "(and 1 more file(s) with problems")
	})
	if st := r.Status(); !strings.Contains(st.LastError, "new.yaml:2: instance 1 has no port; fix the file: it contributes nothing until it parses") {
		t.Errorf("LastError %q", st.LastError)
	}

	// Fixed, both apply and the status is clean again.
	writeAtomic(t, web, svc("web", 81))
	if err := os.Remove(filepath.Join(dir, "new.yaml")); err != nil {
		t.Fatal(err)
	}
	r.until(t, "api:91 web:81")
	testenv.Eventually(t, wait, "status up again", func() bool { return r.Status().Up })
}

// A file that breaks before Run has read it good once has nothing to keep;
// a deleted malformed file takes its last good service with it.
func TestDeletedMalformedFileRemovesItsService(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	write(t, web, svc("web", 80))
	r := start(t, dir, time.Hour)
	r.until(t, "web:80")
	writeAtomic(t, web, "name: [")
	testenv.Eventually(t, wait, "status reports the file", func() bool { return !r.Status().Up })
	if err := os.Remove(web); err != nil {
		t.Fatal(err)
	}
	r.until(t, "")
	testenv.Eventually(t, wait, "status up again", func() bool { return r.Status().Up })
}

func TestDuplicateServiceNames(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	write(t, a, svc("web", 80))
	write(t, b, "# b\n"+svc("web", 81))
	r := start(t, dir, time.Hour)
	r.until(t, "web:80") // the first in lexical order wins
	st := r.Status()
	if want := b + `:2: service "web" is already declared in ` + a + ":1"; st.Up || !strings.Contains(st.LastError, want) {
		t.Errorf("status %+v, want LastError with %q", st, want)
	}

	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	r.until(t, "web:81")
	testenv.Eventually(t, wait, "status up again", func() bool { return r.Status().Up })
}

// web.yaml is a symlink to a file outside the watched directory, so
// changing that file makes no inotify event there: only the periodic
// rescan can see it, and this test fails if it does not.
func TestRescanSeesWhatTheWatchMisses(t *testing.T) {
	dir, elsewhere := t.TempDir(), t.TempDir()
	target := filepath.Join(elsewhere, "web.yaml")
	write(t, target, svc("web", 80))
	if err := os.Symlink(target, filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	r := start(t, dir, 50*time.Millisecond)
	r.until(t, "web:80")
	writeAtomic(t, target, svc("web", 81))
	r.until(t, "web:81")
}

// A reader that does not read gets, when it reads, the newest snapshot and
// none of those before it.
func TestSlowReaderGetsOnlyTheNewest(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	write(t, web, svc("web", 80))
	r := start(t, dir, time.Hour)
	r.until(t, "web:80")

	for i, port := range []int{81, 82, 83} {
		writeAtomic(t, web, svc("web", port))
		testenv.Eventually(t, wait, "the change is read", func() bool { return r.logs.Count("service changed") == i+1 })
	}
	if got := summary(r.next(t)); got != "web:83" {
		t.Errorf("the slow reader got %q first", got)
	}
}

// A re-read that finds what was sent sends nothing.
func TestNoSnapshotWhenNothingChanged(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	write(t, web, svc("web", 80))
	r := start(t, dir, time.Hour)
	r.until(t, "web:80")

	var got []string
	var mu sync.Mutex
	go func() {
		for {
			select {
			case s := <-r.out:
				mu.Lock()
				got = append(got, summary(s))
				mu.Unlock()
			case <-r.done:
				return
			}
		}
	}()
	before := r.Status().LastSuccess
	writeAtomic(t, web, svc("web", 80))                // the same content
	write(t, filepath.Join(dir, ".web.yaml.swp"), "x") // an ignored file
	write(t, filepath.Join(dir, "notes.txt"), "x")     // another
	testenv.Eventually(t, wait, "the directory is read again", func() bool { return r.Status().LastSuccess.After(before) })
	writeAtomic(t, web, svc("web", 81))
	testenv.Eventually(t, wait, "the change arrives", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(got, "web:81")
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []string{"web:81"}) {
		t.Errorf("snapshots after the unchanged re-read: %q", got)
	}
}

// The directory removed and made again, and then replaced by another one:
// the services read before stay while it is missing, and the watch follows
// the path (the rescan is an hour, so only the watch can see the changes).
func TestDirectoryReplaced(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "services")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "web.yaml"), svc("web", 80))
	r := start(t, dir, time.Hour)
	r.until(t, "web:80")

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, wait, "status reports the missing directory", func() bool { return !r.Status().Up })
	if st := r.Status(); !strings.Contains(st.LastError, "reading SEAMLESS_SERVICES_DIR "+dir) {
		t.Errorf("LastError %q", st.LastError)
	}
	select {
	case s := <-r.out:
		t.Fatalf("a snapshot while the directory is missing: %q", summary(s))
	default:
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r.until(t, "") // read again: empty now
	testenv.Eventually(t, wait, "status up again", func() bool { return r.Status().Up })
	write(t, filepath.Join(dir, "api.yaml"), svc("api", 90))
	r.until(t, "api:90")

	// Another directory renamed into place.
	next := filepath.Join(parent, "next")
	if err := os.Mkdir(next, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(next, "web.yaml"), svc("web", 81))
	if err := os.Rename(dir, filepath.Join(parent, "old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, dir); err != nil {
		t.Fatal(err)
	}
	r.until(t, "web:81")
	write(t, filepath.Join(dir, "api.yaml"), svc("api", 91))
	r.until(t, "api:91 web:81")
}

func TestCancelReturnsPromptly(t *testing.T) {
	for _, tc := range []struct {
		name string
		read bool
	}{
		{"while a snapshot waits for its reader", false},
		{"while idle", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "web.yaml"), svc("web", 80))
			r := start(t, dir, time.Hour)
			if tc.read {
				r.until(t, "web:80")
			}
			r.stop()
			select {
			case <-r.done:
			case <-time.After(wait):
				t.Fatal("Run did not return")
			}
		})
	}
}
