package template

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// within runs f and fails the test when it has not returned in time: a
// FIFO read blocks until a writer comes, that is for ever.
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("%s blocks on a FIFO", what)
		return nil
	}
}

// A FIFO as SEAMLESS_TEMPLATE, or as the argument of `file`, is refused at
// once with its path: reading it would block the apply loop.
func TestAFIFOIsRefusedNotRead(t *testing.T) {
	dir := t.TempDir()
	pipe := filepath.Join(dir, "pipe")
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Fatal(err)
	}

	err := within(t, "Parse", func() error { _, err := Parse(pipe, testOptions()); return err })
	if err == nil || !strings.Contains(err.Error(), pipe) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("Parse of a FIFO: %v, want an error naming %s as not a regular file", err, pipe)
	}

	opts := testOptions()
	opts.Dir = dir
	err = within(t, "file", func() error {
		_, err := renderText(t, "t.tmpl", `{{ file "pipe" }}`, opts, model.NewState(nil))
		return err
	})
	if err == nil || !strings.Contains(err.Error(), pipe) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("file of a FIFO: %v, want an error naming %s as not a regular file", err, pipe)
	}
}
