package certs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestARuntimeFailureFallsBackToAReloadWithTheFilesWritten(t *testing.T) {
	ca := newCA(t)
	state := filepath.Join(t.TempDir(), "certs")
	var reasons []string
	var sent []string
	inst, err := NewInstaller(InstallerOptions{Dir: state,
		CLI: cliFunc(func(_ context.Context, cmd string) (string, error) {
			sent = append(sent, cmd)
			return "", errors.New("master CLI: connection refused")
		}),
		Reload: func(reason string) { reasons = append(reasons, reason) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Prepare(Set{}); err != nil {
		t.Fatal(err)
	}
	c, err := Check(ca.bundle(t, "a.example"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	err = inst.Install(context.Background(), Set{Certs: map[string]*Entry{"a": {Name: "a", Source: SourceDir, File: "/src/a.pem", Cert: c}}})
	if err == nil || len(reasons) != 1 {
		t.Fatalf("Install = %v, reloads asked %v: want an error and one reload", err, reasons)
	}
	if len(sent) == 0 || !strings.HasPrefix(sent[0], "@1 new ssl cert ") {
		t.Fatalf("sent %q", sent)
	}
	// The reload loads the files: they must already hold the new set.
	list, err := os.ReadFile(inst.CrtList())
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(state, "default.pem") + "\n" + filepath.Join(state, "live", "a.pem") + "\n"
	if string(list) != want {
		t.Fatalf("crt-list = %q, want %q", list, want)
	}
	if b, err := os.ReadFile(filepath.Join(state, "live", "a.pem")); err != nil || string(b) != string(c.PEM) {
		t.Fatalf("the certificate file does not hold the bundle: %v", err)
	}
	// Removed: the file goes, the crt-list holds the default alone.
	reasons = nil
	_ = inst.Install(context.Background(), Set{})
	if _, err := os.Stat(filepath.Join(state, "live", "a.pem")); !os.IsNotExist(err) || len(reasons) != 1 {
		t.Fatalf("after removal: stat %v, reloads %v", err, reasons)
	}
}

func TestDirNamesAreSafeForACrtList(t *testing.T) {
	for _, stem := range []string{"web", "a b", "x;y", "é", strings.Repeat("l", 200)} {
		n := installName(stem)
		if !safePath.MatchString("/" + n) {
			t.Errorf("installName(%q) = %q", stem, n)
		}
	}
	if installName("a b") == installName("a_b") {
		t.Error("two names map to one file")
	}
}
