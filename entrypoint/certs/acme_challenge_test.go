package certs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// HAProxy is still starting when the first hosts are ordered: a master CLI
// that cannot be dialled yet is tried again, and the map file is written
// either way.
func TestChallengeWaitsForTheMasterCLI(t *testing.T) {
	t.Run("not listening yet", func(t *testing.T) {
		challengeWaitsFor(t, func() (string, error) {
			return "", fmt.Errorf("master CLI /run/master.sock: %w",
				&net.OpError{Op: "dial", Net: "unix", Err: errors.New("connect: no such file or directory")})
		})
	})
	// The master answers before its first worker runs (seen on HAProxy
	// 3.2 in CI: the order failed and was retried a minute later).
	t.Run("no worker yet", func(t *testing.T) {
		challengeWaitsFor(t, func() (string, error) {
			return "Can't find the target PID matching the prefix '@1'\n", nil
		})
	})
	// Before 3.1 the master re-executes itself once its first worker
	// runs, and resets the connections it had accepted (seen on HAProxy
	// 3.0 in CI: the order failed and was retried a minute later).
	t.Run("reset as the master re-executes", func(t *testing.T) {
		challengeWaitsFor(t, func() (string, error) {
			return "", fmt.Errorf("master CLI \"@1 add map\": %w",
				&net.OpError{Op: "read", Net: "unix", Err: os.NewSyscallError("read", syscall.ECONNRESET)})
		})
	})
	t.Run("closed as the master re-executes", func(t *testing.T) {
		challengeWaitsFor(t, func() (string, error) {
			return "", fmt.Errorf("master CLI \"@1 add map\": %w",
				&net.OpError{Op: "write", Net: "unix", Err: os.NewSyscallError("write", syscall.EPIPE)})
		})
	})
}

// challengeWaitsFor: the first three commands get starting's answer.
func challengeWaitsFor(t *testing.T, starting func() (string, error)) {
	var cmds []string
	cli := cliFunc(func(_ context.Context, cmd string) (string, error) {
		cmds = append(cmds, cmd)
		if len(cmds) <= 3 {
			return starting()
		}
		return "\n", nil
	})
	file := filepath.Join(t.TempDir(), "challenges.map")
	c, err := NewChallenges(file, cli)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Present(context.Background(), "app.test", "tok-1", "tok-1.thumb"); err != nil {
		t.Fatalf("Present: %v (commands %q)", err, cmds)
	}
	if len(cmds) != 4 || cmds[3] != "@1 add map "+file+" tok-1 tok-1.thumb" {
		t.Fatalf("commands = %q", cmds)
	}
	if b, _ := os.ReadFile(file); string(b) != "tok-1 tok-1.thumb\n" {
		t.Fatalf("map file = %q", b)
	}
	// A token that is not base64url never reaches HAProxy.
	if err := c.Present(context.Background(), "app.test", "a b", "a b.x"); err == nil || !strings.Contains(err.Error(), "app.test") {
		t.Fatalf("bad token: %v", err)
	}
	if err := c.CleanUp(context.Background(), "app.test", "tok-1", "tok-1.thumb"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); len(b) != 0 || cmds[len(cmds)-1] != "@1 del map "+file+" tok-1" {
		t.Fatalf("after CleanUp: map file %q, last command %q", b, cmds[len(cmds)-1])
	}
}
