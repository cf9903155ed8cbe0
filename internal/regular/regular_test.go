package regular

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestReadFileRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, kind := range map[string]string{fifo: "a FIFO", dir: "a directory"} {
		_, err := ReadFile(path) // would block for ever on the FIFO without O_NONBLOCK
		var re *Error
		if !errors.As(err, &re) || Kind(re.Mode) != kind || re.Path != path {
			t.Errorf("%s: %v, want an *Error naming %s", path, err, kind)
		}
	}
	if b, err := ReadFile(file); err != nil || string(b) != "data" {
		t.Errorf("regular file: %q, %v", b, err)
	}
}
