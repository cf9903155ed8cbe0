package certs

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The Installer's reading of HAProxy's answers, run in unit tests against
// what HAProxy 2.6, 3.0 and 3.2 really answered: TestRecordTranscript
// (with -record, against $SEAMLESS_HAPROXY_BIN or the host's haproxy)
// drives an Installer through every kind of change against a real HAProxy
// and writes the commands and answers to testdata/transcripts; the replay
// gives a fresh Installer those answers for the same changes.

var record = flag.Bool("record", false, "record testdata/transcripts/haproxy-VERSION.json from the real HAProxy")

const transcripts = "testdata/transcripts"

// exchange is one command to the master CLI and its answer, with the
// state directory written as $DIR and a certificate payload as $PEM.
type exchange struct {
	Step   string `json:"step"`
	Cmd    string `json:"cmd"`
	Answer string `json:"answer"`
}

// transcriptCerts are two certificates for a.example that stay valid for a
// century, so that a recorded transcript can be replayed with them.
func transcriptCerts(t *testing.T) (a1, a2 []byte) {
	t.Helper()
	var out [2][]byte
	for i := range out {
		p := filepath.Join(transcripts, fmt.Sprintf("a%d.pem", i+1))
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) && *record {
			ca := newCA(t)
			c, k := ca.leaf(t, []string{"a.example"}, time.Now().Add(-time.Hour), time.Now().AddDate(100, 0, 0))
			b = join(certPEM(c), keyPEM(t, k))
			if err = os.MkdirAll(transcripts, 0o755); err == nil {
				err = os.WriteFile(p, b, 0o644)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out[0], out[1]
}

func setOf(t *testing.T, bundles ...[]byte) Set {
	t.Helper()
	s := Set{Certs: map[string]*Entry{}}
	for _, b := range bundles {
		c, err := Check(b, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.Certs["a"] = &Entry{Name: "a", Source: SourceDir, File: "a.pem", Cert: c}
	}
	return s
}

// transcriptSteps are the changes, each with what it must go through:
// added, replaced, removed; removed where the worker never had it (a
// reload in between); added where the worker has it already.
func transcriptSteps(t *testing.T, dir string, cli CLI, step *string) {
	t.Helper()
	a1, a2 := transcriptCerts(t)
	ctx := context.Background()
	newInst := func() *Installer {
		i, err := NewInstaller(InstallerOptions{Dir: dir, CLI: cli, Reload: func(r string) { t.Errorf("step %s: reload asked for: %s", *step, r) }})
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	inst := newInst()
	for _, s := range []struct {
		name string
		inst *Installer
		set  Set
	}{
		{"add", inst, setOf(t, a1)},
		{"replace", inst, setOf(t, a2)},
		{"remove", inst, setOf(t)},
		{"add again", inst, setOf(t, a1)},
	} {
		*step = s.name
		if err := s.inst.Install(ctx, s.set); err != nil {
			t.Fatalf("step %s: %v", s.name, err)
		}
	}
	// A new Installer over the same files (a restart of seamless whose
	// HAProxy kept running) finds a.pem in the worker already.
	*step = "add, the worker has it"
	if err := newInst().Install(ctx, setOf(t, a2)); err != nil {
		t.Fatalf("step %s: %v", *step, err)
	}
	*step = "remove"
	if err := inst.Install(ctx, setOf(t)); err != nil {
		t.Fatalf("step %s: %v", *step, err)
	}
	// One that believes a.pem installed, in a worker that never had it.
	*step = "remove, the worker lacks it"
	stale := newInst()
	stale.installed = setOf(t, a1).Certs
	if err := stale.Install(ctx, setOf(t)); err != nil {
		t.Fatalf("step %s: %v", *step, err)
	}
}

var payload = regexp.MustCompile(`(?s) <<\n.*`)

func normalise(s, dir string) string {
	return payload.ReplaceAllLiteralString(strings.ReplaceAll(s, dir, "$DIR"), " <<\n$PEM")
}

func TestRecordTranscript(t *testing.T) {
	if !*record {
		t.Skip("-record records the transcripts")
	}
	dir := filepath.Join(t.TempDir(), "certs")
	inst, err := NewInstaller(InstallerOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Prepare(Set{}); err != nil {
		t.Fatal(err)
	}
	_, real := startHAProxy(t, inst.CrtList())
	procs, err := real.ShowProc(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	version := regexp.MustCompile(`^\d+\.\d+`).FindString(procs.Master.Version)
	var (
		log  []exchange
		step string
	)
	transcriptSteps(t, dir, cliFunc(func(ctx context.Context, cmd string) (string, error) {
		ans, err := real.Do(ctx, cmd)
		if err != nil {
			t.Fatalf("step %s: %s: %v", step, cmd, err)
		}
		log = append(log, exchange{Step: step, Cmd: normalise(cmd, dir), Answer: normalise(ans, dir)})
		return ans, nil
	}), &step)
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(log); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(transcripts, "haproxy-"+version+".json")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %d exchanges with HAProxy %s in %s", len(log), procs.Master.Version, p)
}

func TestReplayTranscripts(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(transcripts, "haproxy-*.json"))
	if len(files) < 3 {
		t.Fatalf("transcripts: %v, want 2.6, 3.0 and 3.2 (go test -run TestRecordTranscript -record)", files)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var want []exchange
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "certs")
			var (
				n    int
				step string
			)
			transcriptSteps(t, dir, cliFunc(func(ctx context.Context, cmd string) (string, error) {
				if n >= len(want) {
					t.Fatalf("step %s: %s: past the end of the transcript", step, cmd)
				}
				w := want[n]
				n++
				if got := normalise(cmd, dir); got != w.Cmd || step != w.Step {
					t.Fatalf("exchange %d: step %q sends %q; HAProxy was sent %q in step %q", n, step, got, w.Cmd, w.Step)
				}
				return strings.ReplaceAll(w.Answer, "$DIR", dir), nil
			}), &step)
			if n != len(want) {
				t.Errorf("%d of the transcript's %d exchanges were used", n, len(want))
			}
		})
	}
}
