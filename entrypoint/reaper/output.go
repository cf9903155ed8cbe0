package reaper

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

const drainTime = 200 * time.Millisecond

// Output runs argv to completion and returns its combined stdout and stderr.
// It is the reaper-safe replacement for exec.Cmd.CombinedOutput. When ctx
// ends first the child is killed and ctx's error is returned.
func (r *Reaper) Output(ctx context.Context, argv []string, env []string) ([]byte, Status, error) {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, Status{}, err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, Status{}, err
	}
	defer devnull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, Status{}, err
	}
	defer pr.Close()
	c, err := r.Start(path, argv, &syscall.ProcAttr{
		Env:   env,
		Files: []uintptr{devnull.Fd(), pw.Fd(), pw.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	pw.Close()
	if err != nil {
		return nil, Status{}, err
	}

	var buf bytes.Buffer
	read := make(chan error, 1)
	// A grandchild may keep the pipe open after the child exits, so the
	// read is bounded by the child's exit, not by EOF alone.
	go func() { _, err := io.Copy(&buf, pr); read <- err }()
	select {
	case <-c.Done():
	case <-ctx.Done():
		_ = syscall.Kill(-c.Pid, syscall.SIGKILL)
		<-c.Done()
		pr.Close()
		<-read
		return buf.Bytes(), c.Status(), fmt.Errorf("%s: %w", argv[0], ctx.Err())
	}
	// What the child wrote is already in the pipe; a grandchild that keeps
	// the pipe open must not hold us beyond a short drain.
	_ = pr.SetReadDeadline(time.Now().Add(drainTime))
	<-read
	return buf.Bytes(), c.Status(), nil
}
