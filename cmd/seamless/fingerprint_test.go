package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/internal/testenv"
)

const slotted = `backend http-web
    balance roundrobin
    server s1 %s weight 1
    server s2 %s weight 1
    server s3 127.0.0.1:1 weight 1 disabled

backend http-api
    server s1 10.0.0.9:80 weight 1
`

func TestMembersDigest(t *testing.T) {
	a := fmt.Sprintf(slotted, "10.0.0.1:80", "10.0.0.2:80")
	for _, tt := range []struct {
		name  string
		other string
		equal bool
	}{
		{"the same servers in other slots", fmt.Sprintf(slotted, "10.0.0.2:80", "10.0.0.1:80"), true},
		{"other spacing", strings.ReplaceAll(fmt.Sprintf(slotted, "10.0.0.2:80", "10.0.0.1:80"), "server s1 ", "server\ts1   "), true},
		{"another server", fmt.Sprintf(slotted, "10.0.0.1:80", "10.0.0.3:80"), false},
		{"another weight", fmt.Sprintf(slotted, "10.0.0.1:80 weight 2 #", "10.0.0.2:80"), false},
		{"a server moved to another backend", "backend http-web\n    balance roundrobin\n    server s1 10.0.0.1:80 weight 1\n" +
			"    server s3 127.0.0.1:1 weight 1 disabled\n\nbackend http-api\n    server s1 10.0.0.9:80 weight 1\n    server s2 10.0.0.2:80 weight 1\n", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := membersDigest([]byte(a)) == membersDigest([]byte(tt.other)); got != tt.equal {
				t.Errorf("digests equal = %v, want %v:\n%s\n--\n%s", got, tt.equal, canonical(a), canonical(tt.other))
			}
		})
	}
}

// canonical is the form MembersSHA256 digests, written the plain way:
// replicas of earlier versions hashed exactly these bytes, and a fleet in
// the middle of an upgrade compares their digests with this one's.
func canonical(cfg string) string {
	var out, run []string
	flush := func() {
		slices.Sort(run)
		out = append(out, run...)
		run = run[:0]
	}
	for line := range strings.Lines(cfg) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "server" {
			run = append(run, "server "+strings.Join(f[2:], " ")+"\n")
			continue
		}
		flush()
		out = append(out, line)
	}
	flush()
	return strings.Join(out, "")
}

// The digest is of the canonical form, and is made without a copy of the
// configuration: at 10,000 backends of 16 slots, one scrape of the
// metrics allocated some 60 MB to make it.
func TestMembersDigestIsTheCanonicalFormsWithoutACopy(t *testing.T) {
	var b strings.Builder
	for i := range 10_000 {
		fmt.Fprintf(&b, "backend http-svc-%05d\n    balance roundrobin\n", i)
		for s := 16; s >= 1; s-- {
			fmt.Fprintf(&b, "    server s%d 10.%d.%d.%d:%d weight 1 check\n", s, i>>8, i&255, s, 8000+s)
		}
		b.WriteString("\n")
	}
	for _, cfg := range []string{b.String(), fmt.Sprintf(slotted, "10.0.0.1:80", "10.0.0.2:80"),
		"server\nserver s1\n  server  s2  a\u00a0b \n\xff server x\nserver s3 z", ""} {
		if got, want := membersDigest([]byte(cfg)), sha256.Sum256([]byte(canonical(cfg))); got != want {
			t.Errorf("digest %x, want %x, the canonical form's, of %.60q…", got, want, cfg)
		}
	}
	cfg := []byte(b.String())
	if n := testing.AllocsPerRun(3, func() { membersDigest(cfg) }); n > 100 {
		t.Errorf("the digest of a %d MiB configuration made %.0f allocations; want at most 100", len(cfg)>>20, n)
	}
}

func TestFingerprintUnknownIsEmpty(t *testing.T) {
	for _, tt := range []struct {
		name  string
		files []status.ConfigFile
	}{
		{"no file", nil},
		{"a file that cannot be read", []status.ConfigFile{{Path: "/x", Error: "permission denied"}}},
		{"a file whose running digest is unknown", []status.ConfigFile{{Path: "/x", SHA256: "ab"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if fp := fingerprint(tt.files, true); fp != (status.Fingerprint{}) {
				t.Errorf("fingerprint = %+v, want none", fp)
			}
		})
	}
}

var configInfoRe = regexp.MustCompile(`(?m)^seamless_config_info\{members_sha256="([0-9a-f]*)",sha256="([0-9a-f]+)"\} 1$`)

// configInfo reads seamless_config_info: the running file's digest and
// its members' digest.
func configInfo(status string) (sha, members string) {
	_, body := testenv.Get("http://" + status + "/metrics")
	m := configInfoRe.FindStringSubmatch(body)
	if m == nil {
		return "", ""
	}
	return m[2], m[1]
}

// The fingerprint a fleet compares is the digest of the file HAProxy
// runs, in /metrics and /status alike, and it follows every change.
func TestFingerprintIsTheRunningFile(t *testing.T) {
	testenv.HAProxy(t)
	dir := t.TempDir()
	web1, web2 := namedBackend(t, "web1"), namedBackend(t, "web2")
	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(web1)))
	r := &discoveryRig{http: testenv.Addr(testenv.FreePort(t)), stateDir: filepath.Join(t.TempDir(), "state")}
	env := []string{"SEAMLESS_SOURCES=file", "SEAMLESS_SERVICES_DIR=" + dir, "SEAMLESS_HTTP_BIND=" + r.http,
		"SEAMLESS_STATS_BIND=", "SEAMLESS_STATE_DIR=" + r.stateDir, "SEAMLESS_WAIT=0"}
	in := startSeamless(t, nil, startOpts{args: []string{"haproxy"}, env: env})
	r.eventuallyServedBy(t, "127.0.0.1", "web1")

	rendered := filepath.Join(r.stateDir, renderedName)
	// check waits until the metric and /status name the rendered file's
	// digest, and it is not was: HAProxy serves a runtime change before
	// the file and the metric follow it, so right after web2 answers
	// both may still name the file before it.
	check := func(step, was string) string {
		t.Helper()
		var sha, members, onDisk string
		var st status.Report
		testenv.Eventually(t, 10*time.Second, step+": the metric and /status name the rendered file's digest", func() bool {
			b, err := os.ReadFile(rendered)
			if err != nil {
				return false
			}
			h := sha256.Sum256(b)
			onDisk = hex.EncodeToString(h[:])
			sha, members = configInfo(in.status)
			_, body := testenv.Get("http://" + in.status + "/status")
			st = status.Report{}
			_ = json.Unmarshal([]byte(body), &st)
			return sha == onDisk && sha != was && st.Config.SHA256 == onDisk && st.Config.MembersSHA256 == members
		})
		if members == "" || members == sha {
			t.Errorf("%s: members digest %q: want one of its own", step, members)
		}
		return sha
	}
	first := check("start", "")
	writeAtomic(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(webService, instancesYAML(web1, web2)))
	r.eventuallyServedBy(t, "127.0.0.1", "web1", "web2")
	check("web2 added", first) // fails unless the digest changes with the membership
	t.Logf("web2 added by %v runtime updates and %v reloads", in.metric(`seamless_runtime_updates_total{result="success"}`),
		in.metric(successes))
}
