package haproxy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestExpandConfigFiles(t *testing.T) {
	dir := t.TempDir()
	touch := func(p string) string {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := func(p string) string {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	file := touch(filepath.Join(dir, "a.cfg"))
	confd := filepath.Join(dir, "conf.d")
	b, c := touch(filepath.Join(confd, "b.cfg")), touch(filepath.Join(confd, "a.cfg"))
	touch(filepath.Join(confd, "notes.txt"))
	empty := filepath.Join(dir, "empty")
	touch(filepath.Join(empty, "README"))
	pipe := fifo(filepath.Join(dir, "pipe.cfg"))
	withPipe := filepath.Join(dir, "withpipe")
	pipeEntry := fifo(filepath.Join(withPipe, "x.cfg"))
	missing := filepath.Join(dir, "missing.cfg")
	hidden := filepath.Join(dir, "hidden")
	shown := touch(filepath.Join(hidden, "a.cfg"))
	touch(filepath.Join(hidden, ".old.cfg"))
	if err := os.Symlink("nowhere", filepath.Join(hidden, ".#a.cfg")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(hidden, ".pipe.cfg"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(hidden, "sub.cfg"), 0o755); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name      string
		paths     []string
		files     []string
		emptyDirs []string
		refused   string
	}{
		{"a file as given", []string{file}, []string{file}, nil, ""},
		{"a directory as its *.cfg files in lexical order", []string{confd}, []string{c, b}, nil, ""},
		{"a directory without *.cfg loads nothing", []string{file, empty}, []string{file}, []string{empty}, ""},
		{"a missing file is left for HAProxy to report", []string{missing}, []string{missing}, nil, ""},
		{"names beginning with a dot and directories are skipped, as HAProxy does", []string{hidden}, []string{shown}, nil, ""},
		{"a FIFO given as a file is refused", []string{file, pipe}, nil, nil, pipe},
		{"a FIFO found in a directory is refused", []string{withPipe}, nil, nil, pipeEntry},
		{"a device is refused", []string{"/dev/null"}, nil, nil, "/dev/null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ExpandConfigFiles(tc.paths)
			if tc.refused != "" {
				var nr *NotRegularError
				if !errors.As(err, &nr) || nr.Path != tc.refused || !strings.Contains(err.Error(), "not a regular file") {
					t.Fatalf("got %v, want a refusal of %s", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Files, tc.files) || !slices.Equal(got.EmptyDirs, tc.emptyDirs) {
				t.Errorf("got %q, empty %q; want %q, empty %q", got.Files, got.EmptyDirs, tc.files, tc.emptyDirs)
			}
		})
	}
}

// A FIFO is refused before haproxy runs: Run is never called.
func TestValidatorRefusesAFIFOWithoutReadingIt(t *testing.T) {
	pipe := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Fatal(err)
	}
	v := &Validator{Bin: "haproxy", Args: []string{"-c", "-W", "-f", pipe}, Run: nil}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := v.Check(ctx)
	var ce *ConfigError
	if !errors.As(err, &ce) || !strings.Contains(ce.Error(), pipe) || !strings.Contains(ce.Error(), "a FIFO") {
		t.Fatalf("got %v, want a *ConfigError naming %s as a FIFO", err, pipe)
	}
}
