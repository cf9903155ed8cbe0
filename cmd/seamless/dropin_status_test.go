package main

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/internal/testenv"
)

func getStatus(t *testing.T, in *instance) status.Report {
	t.Helper()
	r, err := tryStatus(in)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryStatus is GET /status; an error while seamless starts.
func tryStatus(in *instance) (status.Report, error) {
	var r status.Report
	resp, err := http.Get("http://" + in.status + "/status")
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&r)
	return r, err
}

// A refused SIGHUP in drop-in mode is on /status with HAProxy's alert, and
// the configuration's digest is that of what runs, not of the refused file
// on disk, which is flagged as differing.
func TestDropInRefusedReloadIsOnStatus(t *testing.T) {
	_, s, in := serving(t, 1, startOpts{})
	started := sha(t, s.path)
	r := getStatus(t, in)
	if len(r.ConfigFiles) != 1 || r.ConfigFiles[0].RunningSHA256 != started || r.ConfigFiles[0].DiffersReason != "" {
		t.Fatalf("at start: %+v, want running %s", r.ConfigFiles, started)
	}

	// A good reload first: what runs follows.
	s.write(t, 2)
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 20*time.Second, "the reload is listed", func() bool { return len(getStatus(t, in).Reloads) == 1 })
	r = getStatus(t, in)
	good := sha(t, s.path)
	if rl := r.Reloads[0]; rl.Result != status.ReloadOK || rl.Trigger != "SIGHUP" || rl.Time.IsZero() {
		t.Errorf("reload %+v", rl)
	}
	if f := r.ConfigFiles[0]; f.RunningSHA256 != good || f.SHA256 != good {
		t.Errorf("after the reload: %+v, want %s running and on disk", f, good)
	}

	// Then a file HAProxy refuses.
	b, err := os.ReadFile(s.path)
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, s.path, strings.Replace(string(b), "timeout connect 2s", "timeout connect 2s\n    tiemout server 3s", 1))
	in.signal(syscall.SIGHUP)
	testenv.Eventually(t, 20*time.Second, "the refusal is listed", func() bool { return len(getStatus(t, in).Reloads) == 2 })
	r = getStatus(t, in)
	rl := r.Reloads[0]
	if rl.Result != status.ReloadRefused || rl.Trigger != "SIGHUP" || len(rl.Alerts) == 0 || !strings.Contains(strings.Join(rl.Alerts, "\n"), "tiemout") {
		t.Errorf("refused reload %+v, want HAProxy's alert naming the bad keyword", rl)
	}
	f := r.ConfigFiles[0]
	if f.RunningSHA256 != good || f.SHA256 != sha(t, s.path) || f.SHA256 == good {
		t.Errorf("after the refusal: running %s on disk %s, want running %s (what runs) and the refused file's digest on disk", f.RunningSHA256, f.SHA256, good)
	}
	if !f.DiffersSince.Equal(rl.Time) || !strings.Contains(f.DiffersReason, "tiemout") {
		t.Errorf("the difference is flagged since %v because %q, want since %v with the alert", f.DiffersSince, f.DiffersReason, rl.Time)
	}
	if served(s) != "v2" {
		t.Errorf("serving %q, want v2 still", served(s))
	}
}
