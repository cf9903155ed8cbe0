package testenv

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Chromium returns Debian's headless browser, which the status page tests
// render with; without it a test is skipped, or fails under CI, where
// `make deps` installs it.
func Chromium(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		if CI() {
			t.Fatalf("chromium not found under CI (make deps installs it): %v", err)
		}
		t.Skipf("chromium not found: %v (apt-get install chromium)", err)
	}
	return bin
}

// RunChromium runs headless Chromium on url with args and returns its
// standard output. Chromium exits by itself once the page has loaded and
// the screenshot or the DOM is written.
func RunChromium(t testing.TB, bin, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--no-first-run", "--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, bin, append(argv, url)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}
