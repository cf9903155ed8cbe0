package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// The README's `docker run` for the image publishes ports of the sample
// conf/; every one of them but seamless's own (8405) must be bound there,
// and HAProxy must load the file.
func TestTheImagesSampleConfBindsWhatTheReadmePublishes(t *testing.T) {
	bin := testenv.HAProxy(t)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## The image\n")
	if !ok {
		t.Fatal("README has no section The image")
	}
	run, _, _ := strings.Cut(section[strings.Index(section, "docker run"):], "seamless:haproxy")
	ports := regexp.MustCompile(`-p 127\.0\.0\.1:\d+:(\d+)`).FindAllStringSubmatch(run, -1)
	if len(ports) < 2 {
		t.Fatalf("the docker run publishes %v", ports)
	}
	conf, err := os.ReadFile("../../conf/haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if p[1] == "8405" {
			continue // SEAMLESS_STATUS_ADDR
		}
		if !regexp.MustCompile(`(?m)^\s*bind\s+:` + p[1] + `\b`).Match(conf) {
			t.Errorf("the README publishes %s, which conf/haproxy.cfg does not bind", p[1])
		}
	}
	// And the other way round: what the sample binds (its stats page) is
	// reachable.
	published := map[string]bool{}
	for _, p := range ports {
		published[p[1]] = true
	}
	for _, b := range regexp.MustCompile(`(?m)^\s*bind\s+:(\d+)`).FindAllStringSubmatch(string(conf), -1) {
		if !published[b[1]] {
			t.Errorf("conf/haproxy.cfg binds %s, which the README's docker run does not publish", b[1])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A copy under the test's temporary directory: the version matrix's
	// HAProxy runs in a root filesystem that sees only /tmp of the host.
	sample := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(sample, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, bin, "-c", "-f", sample).CombinedOutput(); err != nil {
		t.Errorf("haproxy -c conf/haproxy.cfg: %v\n%s", err, out)
	}
}
