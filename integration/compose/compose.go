// Package compose drives the compose CLI for tests: whichever of
// `docker compose` (v2) and `docker-compose` (v1) answers, one project per
// test under a unique name, taken down with its volumes when the test
// ends.
package compose

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// commandTimeout bounds one compose command: `up` of a few small
// containers, or a scale-down whose containers drain for seconds.
const commandTimeout = 2 * time.Minute

var (
	findOnce sync.Once
	found    []string
	findErr  error
)

// Command returns the compose command line prefix: ["docker", "compose"]
// when the Docker CLI has the compose plugin, else ["docker-compose"].
func Command() ([]string, error) {
	findOnce.Do(func() {
		for _, c := range [][]string{{"docker", "compose"}, {"docker-compose"}} {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := exec.CommandContext(ctx, c[0], append(c[1:], "version")...).Run()
			cancel()
			if err == nil {
				found = c
				return
			}
		}
		findErr = errors.New("neither `docker compose version` nor `docker-compose version` answers")
	})
	return found, findErr
}

// Project is one compose project of a test.
type Project struct {
	t    testing.TB
	cmd  []string
	Name string // the unique project name (-p)
	File string // absolute path of the compose file
	env  []string
}

// New prepares a project for file (relative to the test's directory) under
// a unique name; env is added to the environment of every compose command
// (image names, published ports). It needs the compose CLI: without it the
// test is skipped, or fails under CI. The project is taken down with its
// volumes when the test ends, after its logs are shown if the test failed.
func New(t testing.TB, file string, env map[string]string) *Project {
	t.Helper()
	cmd, err := Command()
	if err != nil {
		if testenv.CI() {
			t.Fatalf("no compose CLI under CI: %v", err)
		}
		t.Skipf("no compose CLI: %v", err)
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	p := &Project{t: t, cmd: cmd, Name: "seamlesstest" + hex.EncodeToString(b), File: abs}
	for k, v := range env {
		p.env = append(p.env, k+"="+v)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := p.Run("logs", "--no-color", "--tail", "150")
			t.Logf("compose logs of %s:\n%s", p.Name, out)
		}
		if out, err := p.Run("down", "-v", "--remove-orphans", "--timeout", "10"); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
	})
	return p
}

// Run runs one compose command of the project and returns its combined
// output.
func (p *Project) Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	full := append(append(append([]string{}, p.cmd[1:]...), "-p", p.Name, "-f", p.File), args...)
	c := exec.CommandContext(ctx, p.cmd[0], full...)
	c.Dir = filepath.Dir(p.File)
	// Variables that would change the project under test are left out.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COMPOSE_") {
			c.Env = append(c.Env, kv)
		}
	}
	c.Env = append(c.Env, p.env...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w", p.cmd[0], strings.Join(full, " "), err)
	}
	return out.String(), err
}

// Must runs a compose command and fails the test if it fails.
func (p *Project) Must(args ...string) string {
	p.t.Helper()
	out, err := p.Run(args...)
	if err != nil {
		p.t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// Up starts the project in the background.
func (p *Project) Up() {
	p.t.Helper()
	p.Must("up", "-d", "--no-build")
}

// Scale sets the number of containers of service, leaving the others (and
// the service's remaining containers) as they are. A scale-down returns
// once the removed containers have stopped.
func (p *Project) Scale(service string, n int) {
	p.t.Helper()
	p.Must("up", "-d", "--no-build", "--no-recreate", "--scale", service+"="+strconv.Itoa(n))
}
