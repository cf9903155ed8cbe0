package file

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// hostile are inputs meant to exhaust the memory of PID 1. Each writes
// itself into dir, streaming, so that making it costs the writer no memory.
var hostile = map[string]struct {
	write func(t *testing.T, dir string)
	// want is in the problem with web.yaml, or in the scan's error.
	want string
	// tmpfs asks for a directory in memory, where making many entries is
	// quick.
	tmpfs bool
}{
	"a 15 MiB file": {
		write: func(t *testing.T, dir string) {
			stream(t, filepath.Join(dir, "web.yaml"), func(w *bufio.Writer) {
				w.WriteString("name: web\ninstances:\n")
				for i := 0; i < 15<<20/48; i++ {
					fmt.Fprintf(w, "  - {address: 10.%d.%d.%d, port: %5d}\n", i>>16&255, i>>8&255, i&255, i%65535+1)
				}
			})
		},
		want: "larger than 256 KiB",
	},
	"one huge line": {
		write: func(t *testing.T, dir string) {
			stream(t, filepath.Join(dir, "web.yaml"), func(w *bufio.Writer) {
				w.WriteString("{name: web, tags: [")
				for range 15 << 20 / 2 {
					w.WriteString("x,")
				}
				w.WriteString("x]}")
			})
		},
		want: "larger than 256 KiB",
	},
	"many tiny instances": {
		write: func(t *testing.T, dir string) {
			stream(t, filepath.Join(dir, "web.yaml"), func(w *bufio.Writer) {
				w.WriteString("name: web\ninstances:\n")
				for i := range 9000 {
					fmt.Fprintf(w, "- {address: h, port: %d}\n", i+1)
				}
			})
		},
		want: "web.yaml:3: 9000 instances; a services file holds at most 5000",
	},
	"a file at the limit, of one-byte values": {
		write: func(t *testing.T, dir string) {
			stream(t, filepath.Join(dir, "web.yaml"), func(w *bufio.Writer) {
				w.WriteString("name: web\ntags: [")
				for range maxFileSize/2 - 20 {
					w.WriteString("x,")
				}
				w.WriteString("x]\nbogus: 1\n")
			})
		},
		want: "web.yaml:3: unknown field \"bogus\"",
	},
	"a JSON file at the limit, of one-byte values": {
		write: func(t *testing.T, dir string) {
			stream(t, filepath.Join(dir, "web.json"), func(w *bufio.Writer) {
				w.WriteString(`{"name": "web", "tags": [`)
				for range maxFileSize/2 - 20 {
					w.WriteString("1,")
				}
				w.WriteString(`1], "bogus": 1}`)
			})
			if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
				t.Fatal(err)
			}
		},
		want: "web.json:1: unknown field \"bogus\"",
	},
	"deep nesting": {
		write: func(t *testing.T, dir string) {
			stream(t, filepath.Join(dir, "web.yaml"), func(w *bufio.Writer) {
				w.WriteString("name: web\ntags: " + strings.Repeat("[", maxFileSize/2) + strings.Repeat("]", maxFileSize/2-20))
			})
		},
		want: "web.yaml:2: YAML: exceeded max depth",
	},
	"billion laughs": {
		write: func(t *testing.T, dir string) {
			stream(t, filepath.Join(dir, "web.yaml"), func(w *bufio.Writer) {
				w.WriteString("name: web\na: &a [x, x, x, x, x, x, x, x, x, x]\n")
				prev := "a"
				for _, n := range []string{"b", "c", "d", "e", "f", "g", "h"} {
					fmt.Fprintf(w, "%s: &%s [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n", n, n, prev, prev, prev, prev, prev, prev, prev, prev, prev, prev)
					prev = n
				}
				w.WriteString("tags: *h\n")
			})
		},
		want: "web.yaml:2: unknown field \"a\"",
	},
	"aliased tags on every instance": {
		write: func(t *testing.T, dir string) {
			stream(t, filepath.Join(dir, "web.yaml"), func(w *bufio.Writer) {
				w.WriteString("name: web\ntags: &t [" + strings.Repeat("x, ", 2000) + "x]\ninstances:\n")
				for i := range 4000 {
					fmt.Fprintf(w, "  - {address: h, port: %d, tags: *t}\n", i+1)
				}
			})
		},
		want: "too many values once YAML aliases are expanded",
	},
	"100,000 files": {
		write: func(t *testing.T, dir string) {
			// Symbolic links to one file: ten times quicker to make than
			// files, and read the same.
			write(t, filepath.Join(dir, "x"), svc("x", 80))
			for i := range 100_000 {
				if err := os.Symlink("x", filepath.Join(dir, fmt.Sprintf("s%06d.yaml", i))); err != nil {
					t.Fatal(err)
				}
			}
		},
		want:  "holds more than 2000 services files",
		tmpfs: true,
	},
}

func stream(t *testing.T, path string, fn func(w *bufio.Writer)) {
	t.Helper()
	f, err := os.Create(path + ".tmp")
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fn(w)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// boundsReport is what the child process of TestHostileInputsStayBounded
// reports.
type boundsReport struct {
	PeakRSS   int64 // bytes, the kernel's VmHWM
	Instances []string
	Problems  []string
	Err       string
}

// Each hostile input is read by a scanner in a child process that read a
// good web.yaml first; its peak RSS (the kernel's high-water mark, so no
// sampling misses the peak) stays under 64 MiB, the input is refused with
// a message naming the file, and web keeps its last good instance.
func TestHostileInputsStayBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 100,000 files")
	}
	for name, h := range hostile {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if h.tmpfs {
				dir = memDir(t)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestHostileChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), "SEAMLESS_TEST_HOSTILE="+name, "SEAMLESS_TEST_HOSTILE_DIR="+dir)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("child: %v\n%s%s", err, out, stderr.String())
			}
			i := bytes.LastIndex(out, []byte("REPORT "))
			if i < 0 {
				t.Fatalf("child reported nothing:\n%s", out)
			}
			var r boundsReport
			if err := json.Unmarshal(bytes.SplitN(out[i+len("REPORT "):], []byte("\n"), 2)[0], &r); err != nil {
				t.Fatal(err)
			}
			t.Logf("peak RSS %.1f MiB", float64(r.PeakRSS)/(1<<20))
			if r.PeakRSS >= 64<<20 {
				t.Errorf("peak RSS %.1f MiB, over 64 MiB", float64(r.PeakRSS)/(1<<20))
			}
			all := r.Err + strings.Join(r.Problems, "\n")
			if !strings.Contains(all, h.want) {
				t.Errorf("problems %q, error %q: none says %q", r.Problems, r.Err, h.want)
			}
			if r.Err == "" && !strings.Contains(name, "JSON") && strings.Join(r.Instances, " ") != "web:10.0.0.1:80" {
				t.Errorf("instances %v, want web's last good one", r.Instances)
			}
		})
	}
}

// TestHostileChild is the child process of TestHostileInputsStayBounded.
func TestHostileChild(t *testing.T) {
	name, dir := os.Getenv("SEAMLESS_TEST_HOSTILE"), os.Getenv("SEAMLESS_TEST_HOSTILE_DIR")
	if name == "" {
		t.Skip("the child process of TestHostileInputsStayBounded")
	}
	write(t, filepath.Join(dir, "web.yaml"), svc("web", 80))
	sc := newScanner(dir, slog.New(slog.DiscardHandler))
	if _, problems, err := sc.scan(); err != nil || len(problems) > 0 {
		t.Fatalf("good directory: %v %v", problems, err)
	}
	hostile[name].write(t, dir)
	cat, problems, err := sc.scan()
	r := boundsReport{Problems: problems, PeakRSS: peakRSS(t)}
	if err != nil {
		r.Err = err.Error()
	}
	if cat != nil {
		for _, in := range cat.Instances {
			r.Instances = append(r.Instances, in.Name+":"+in.Address+":"+strconv.Itoa(in.Port))
		}
	}
	b, _ := json.Marshal(r)
	fmt.Printf("REPORT %s\n", b)
}

// peakRSS is the process's peak resident set size (VmHWM).
func peakRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// memDir is a temporary directory in /dev/shm when there is one, else in
// the usual place.
func memDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/dev/shm", "seamless-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// instances returns a services file declaring name with n instances.
func instances(name string, n int) string {
	var b strings.Builder
	b.WriteString("name: " + name + "\ninstances:\n")
	for i := range n {
		fmt.Fprintf(&b, "- {address: 10.0.%d.%d, port: 80}\n", i/250, i%250+1)
	}
	return b.String()
}

// count is the instances of a catalog by service, as "a:5000 z:1".
func count(t *testing.T, sc *scanner) (string, []string) {
	t.Helper()
	cat, problems, err := sc.scan()
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	var names []string
	for _, in := range cat.Instances {
		if n[in.Name] == 0 {
			names = append(names, in.Name)
		}
		n[in.Name]++
	}
	var parts []string
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s:%d", name, n[name]))
	}
	return strings.Join(parts, " "), problems
}

// The files past maxInstances together, in lexical order, are rejected;
// a rejected file keeps its last good content while that fits.
func TestTotalInstancesBound(t *testing.T) {
	dir := memDir(t)
	for _, name := range []string{"a", "b", "c"} {
		write(t, filepath.Join(dir, name+".yaml"), instances(name, maxInstancesPerFile))
	}
	write(t, filepath.Join(dir, "d.yaml"), instances("d", maxInstances-3*maxInstancesPerFile-1))
	z := filepath.Join(dir, "z.yaml")
	write(t, z, instances("z", 1))
	sc := newScanner(dir, slog.New(slog.DiscardHandler))
	if got, problems := count(t, sc); got != "a:5000 b:5000 c:5000 d:4999 z:1" || len(problems) > 0 {
		t.Fatalf("got %s, problems %q", got, problems)
	}

	write(t, z, instances("z", 3))
	got, problems := count(t, sc)
	if got != "a:5000 b:5000 c:5000 d:4999 z:1" {
		t.Errorf("z grown past the bound: got %s, want its last good content", got)
	}
	want := z + ":1: service z has 3 instance(s), which would take the services files past 20000 instances together"
	if len(problems) != 1 || !strings.Contains(problems[0], want) || !strings.Contains(problems[0], "last good content stays in use (service z with 1 instance(s))") {
		t.Errorf("problems %q, want %q", problems, want)
	}

	write(t, filepath.Join(dir, "d.yaml"), instances("d", 10))
	if got, problems := count(t, sc); got != "a:5000 b:5000 c:5000 d:10 z:3" || len(problems) > 0 {
		t.Errorf("once room is made: got %s, problems %q", got, problems)
	}
}

// The files past maxTotalSize together, in lexical order, are not read;
// a rejected file keeps its last good content.
func TestTotalSizeBound(t *testing.T) {
	dir := memDir(t)
	padded := func(name string, ports ...int) string {
		s := svc(name, ports...)
		return s + "#" + strings.Repeat("x", maxFileSize-len(s)-2) + "\n"
	}
	// All but one of the files at the size limit that fit, a small file,
	// and z: there is room for z while it is small.
	n := maxTotalSize/maxFileSize - 1
	for i := range n {
		write(t, filepath.Join(dir, fmt.Sprintf("s%03d.yaml", i)), padded(fmt.Sprintf("s%03d", i), 80))
	}
	write(t, filepath.Join(dir, "t.yaml"), svc("t", 80))
	z := filepath.Join(dir, "z.yaml")
	write(t, z, svc("z", 80))
	sc := newScanner(dir, slog.New(slog.DiscardHandler))
	if got, problems := count(t, sc); !strings.HasSuffix(got, "z:1") || len(problems) > 0 {
		t.Fatalf("got %s, problems %q", got, problems)
	}

	write(t, z, padded("z", 80, 81))
	got, problems := count(t, sc)
	if !strings.HasSuffix(got, fmt.Sprintf("s%03d:1 t:1 z:1", n-1)) {
		t.Errorf("z grown past the bound: got ...%s, want its last good content", got[max(0, len(got)-40):])
	}
	want := z + ": not read: with it the services files would hold more than 16 MiB together"
	if len(problems) != 1 || !strings.Contains(problems[0], want) || !strings.Contains(problems[0], "last good content stays in use (service z with 1 instance(s))") {
		t.Errorf("problems %q, want %q", problems, want)
	}
}

// A directory of more services files than maxFiles is not read: every
// service read before stays in use.
func TestTooManyFiles(t *testing.T) {
	dir := memDir(t)
	write(t, filepath.Join(dir, "web.yaml"), svc("web", 80))
	sc := newScanner(dir, slog.New(slog.DiscardHandler))
	if got, _ := count(t, sc); got != "web:1" {
		t.Fatalf("got %s", got)
	}
	for i := range maxFiles {
		if err := os.Symlink("web.yaml", filepath.Join(dir, fmt.Sprintf("s%04d.yaml", i))); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := sc.scan()
	want := "reading SEAMLESS_SERVICES_DIR " + dir + ": holds more than 2000 services files"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "the services read before stay in use") {
		t.Errorf("got %v, want %q", err, want)
	}
}
