package docker

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/internal/testenv"
)

func TestNew(t *testing.T) {
	t.Setenv("DOCKER_HOST", "")
	s, err := New(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name() != "docker" || s.rescan != DefaultRescan || !s.own ||
		s.host != "unix:///var/run/docker.sock (the default socket: DOCKER_HOST is unset)" {
		t.Errorf("Name %q, rescan %s, own %v, host %q", s.Name(), s.rescan, s.own, s.host)
	}
	if st := s.Status(); st.Up || st.Name != "docker" {
		t.Errorf("status before Run %+v", st)
	}
	if _, err := New(Config{Rescan: -time.Second}, nil); err == nil {
		t.Error("a negative rescan is accepted")
	}
	t.Setenv("DOCKER_HOST", "no-scheme")
	if _, err := New(Config{}, nil); err == nil || !strings.Contains(err.Error(), "building the Docker client (DOCKER_HOST=no-scheme)") {
		t.Errorf("a DOCKER_HOST that does not parse: %v", err)
	}
}

func TestRelevant(t *testing.T) {
	labelled := map[string]string{LabelEnable: "true", "name": "web-1"}
	known := map[string]bool{"abc": true}
	for _, tc := range []struct {
		name    string
		m       events.Message
		network string
		want    bool
	}{
		{"a labelled container starts", ev(events.ContainerEventType, "start", labelled), "", true},
		{"its healthcheck changes", ev(events.ContainerEventType, "health_status: healthy", labelled), "", true},
		{"an unlabelled container starts", ev(events.ContainerEventType, "start", map[string]string{"name": "x"}), "", false},
		{"a container labelled otherwise", ev(events.ContainerEventType, "start", map[string]string{LabelEnable: "yes"}), "", false},
		{"a listed container joins a network", ev(events.NetworkEventType, "connect", map[string]string{"container": "abc", "name": "shop"}), "", true},
		{"a listed container joins the network", ev(events.NetworkEventType, "connect", map[string]string{"container": "abc", "name": "shop"}), "shop", true},
		{"a listed container joins another network", ev(events.NetworkEventType, "connect", map[string]string{"container": "abc", "name": "other"}), "shop", false},
		{"another container joins the network", ev(events.NetworkEventType, "connect", map[string]string{"container": "def", "name": "shop"}), "shop", false},
		{"an image event", ev(events.ImageEventType, "pull", labelled), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := relevant(tc.m, tc.network, known); got != tc.want {
				t.Errorf("relevant = %v", got)
			}
		})
	}
}

func ev(typ events.Type, action string, attrs map[string]string) events.Message {
	return events.Message{Type: typ, Action: events.Action(action), Actor: events.Actor{ID: "abc", Attributes: attrs}}
}

func TestBackoffStopsAtTheRescan(t *testing.T) {
	if d := newBackoff(50 * time.Millisecond).Next(); d > 50*time.Millisecond {
		t.Errorf("waits %s, longer than the rescan", d)
	}
}

// socketPath is a path for a unix socket short enough for sun_path.
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sl-docker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "docker.sock")
}

// An engine that was never there: nothing is sent, and Status says what to
// check, naming DOCKER_HOST.
func TestEngineNeverReachable(t *testing.T) {
	sock := socketPath(t)
	t.Setenv("DOCKER_HOST", "unix://"+sock)
	r := start(t, Config{Rescan: time.Hour}, "")
	testenv.Eventually(t, wait, "status reports the engine", func() bool { return r.Status().LastError != "" })
	st := r.Status()
	for _, want := range []string{"listing containers: cannot reach the Docker engine at unix://" + sock + " (DOCKER_HOST)",
		"or set DOCKER_HOST", "the containers listed before stay in use"} {
		if !strings.Contains(st.LastError, want) {
			t.Errorf("LastError %q does not say %q", st.LastError, want)
		}
	}
	if st.Up || !st.LastSuccess.IsZero() || st.LastErrorAt.IsZero() {
		t.Errorf("status %+v", st)
	}
	first := st.LastErrorAt
	testenv.Eventually(t, wait, "a retry", func() bool { return r.Status().LastErrorAt.After(first) })
	r.quiet(t, "without an engine")
	if n := r.logs.Count("cannot list Docker containers"); n != 1 {
		t.Errorf("the failure was logged %d times, want once per series:\n%s", n, r.logs)
	}
}

// fakeEngine answers the four endpoints the source uses, over a unix
// socket, to provoke what a real engine will not do on demand.
type fakeEngine struct {
	path string

	mu           sync.Mutex
	containers   []container.InspectResponse
	listStatus   int // the answer to a list: 0 is 200
	eventsStatus int // the answer to /events: 0 holds it open
	eventsCalls  int
}

var apiPrefix = regexp.MustCompile(`^/v[0-9.]+`)

func newFakeEngine(t *testing.T) *fakeEngine {
	t.Helper()
	f := &fakeEngine{path: socketPath(t)}
	l, err := net.Listen("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(f.serve)}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return f
}

func (f *fakeEngine) set(fn func(f *fakeEngine)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Api-Version", "1.41")
	path := apiPrefix.ReplaceAllString(r.URL.Path, "")
	fail := func(code int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]string{"message": http.StatusText(code) + " (fake engine)"})
	}
	f.mu.Lock()
	cs, listStatus, eventsStatus := f.containers, f.listStatus, f.eventsStatus
	if path == "/events" {
		f.eventsCalls++
	}
	f.mu.Unlock()
	switch {
	case path == "/_ping":
		w.Write([]byte("OK"))
	case path == "/containers/json" && listStatus != 0:
		fail(listStatus)
	case path == "/containers/json":
		var out []container.Summary
		for _, c := range cs {
			out = append(out, container.Summary{ID: c.ID, Labels: c.Config.Labels})
		}
		json.NewEncoder(w).Encode(out)
	case strings.HasPrefix(path, "/containers/") && strings.HasSuffix(path, "/json"):
		id := strings.TrimSuffix(strings.TrimPrefix(path, "/containers/"), "/json")
		for _, c := range cs {
			if c.ID == id {
				json.NewEncoder(w).Encode(c)
				return
			}
		}
		fail(http.StatusNotFound)
	case path == "/events" && eventsStatus != 0:
		fail(eventsStatus)
	case path == "/events":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	default:
		fail(http.StatusNotFound)
	}
}

func (f *fakeEngine) config(rescan time.Duration) Config {
	return Config{Rescan: rescan, ClientOptions: []client.Opt{client.WithHost("unix://" + f.path)}}
}

// A proxy that refuses /events: the containers are still listed and sent,
// but Status says the source is not healthy, and why.
func TestEventsRefused(t *testing.T) {
	f := newFakeEngine(t)
	f.set(func(f *fakeEngine) {
		f.containers = []container.InspectResponse{inspected()}
		f.eventsStatus = http.StatusForbidden
	})
	r := start(t, f.config(time.Hour), "")
	r.until(t, "shop-web-1:8080")
	testenv.Eventually(t, wait, "status reports the events", func() bool { return strings.Contains(r.Status().LastError, "events") })
	st := r.Status()
	if want := "watching container events: the Docker engine at unix://" + f.path + " refused"; st.Up || !strings.Contains(st.LastError, want) ||
		!strings.Contains(st.LastError, "must allow GET /_ping, /version, /containers and /events") {
		t.Errorf("status %+v, want LastError with %q", st, want)
	}
	testenv.Eventually(t, wait, "subscribing is retried", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.eventsCalls >= 3
	})
	if n := r.logs.Count("Docker event stream failed;"); n != 1 {
		t.Errorf("logged %d times, want once per series:\n%s", n, r.logs)
	}

	f.set(func(f *fakeEngine) { f.eventsStatus = 0 })
	testenv.Eventually(t, wait, "status up once events flow", func() bool { return r.Status().Up })
}

// A re-list that fails keeps what was sent: nothing is sent until the
// engine answers again and something changed.
func TestFailedListKeepsTheLastAnswer(t *testing.T) {
	f := newFakeEngine(t)
	f.set(func(f *fakeEngine) { f.containers = []container.InspectResponse{inspected()} })
	r := start(t, f.config(20*time.Millisecond), "")
	r.until(t, "shop-web-1:8080")
	testenv.Eventually(t, wait, "status up", func() bool { return r.Status().Up })

	f.set(func(f *fakeEngine) { f.listStatus = http.StatusInternalServerError })
	testenv.Eventually(t, wait, "status down", func() bool { return !r.Status().Up })
	st := r.Status()
	if !strings.Contains(st.LastError, "listing containers: Docker engine at unix://"+f.path+": Error response from daemon: Internal Server Error (fake engine)") {
		t.Errorf("LastError %q", st.LastError)
	}
	first := st.LastErrorAt
	testenv.Eventually(t, wait, "a retry", func() bool { return r.Status().LastErrorAt.After(first) })
	r.quiet(t, "while the list fails")

	f.set(func(f *fakeEngine) { f.listStatus = 0 })
	testenv.Eventually(t, wait, "status up again", func() bool { return r.Status().Up })
	before := r.Status().LastSuccess
	testenv.Eventually(t, wait, "listed again", func() bool { return r.Status().LastSuccess.After(before) })
	r.quiet(t, "though nothing changed")

	f.set(func(f *fakeEngine) { f.containers = nil })
	r.until(t, "")
}

func TestCancelReturnsPromptly(t *testing.T) {
	for _, tc := range []struct {
		name string
		read bool
	}{
		{"while a snapshot waits for its reader", false},
		{"while idle", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeEngine(t)
			f.set(func(f *fakeEngine) { f.containers = []container.InspectResponse{inspected()} })
			r := start(t, f.config(time.Hour), "")
			if tc.read {
				r.until(t, "shop-web-1:8080")
			} else {
				testenv.Eventually(t, wait, "listed", func() bool { return !r.Status().LastSuccess.IsZero() })
			}
			r.stop()
			select {
			case <-r.done:
			case <-time.After(wait):
				t.Fatal("Run did not return")
			}
		})
	}
}

// A reader that does not read gets, when it reads, the newest snapshot and
// none of those before it.
func TestSlowReaderGetsOnlyTheNewest(t *testing.T) {
	f := newFakeEngine(t)
	f.set(func(f *fakeEngine) { f.containers = []container.InspectResponse{inspected("seamless.port=80")} })
	r := start(t, f.config(20*time.Millisecond), "")
	testenv.Eventually(t, wait, "listed", func() bool { return r.logs.Count("Docker containers listed") == 1 })
	for i, port := range []string{"81", "82", "83"} {
		f.set(func(f *fakeEngine) { f.containers = []container.InspectResponse{inspected("seamless.port=" + port)} })
		testenv.Eventually(t, wait, "the change is listed", func() bool { return r.logs.Count("service changed") == i+1 })
	}
	if got := summary(r.next(t), ""); got != "shop-web-1:83" {
		t.Errorf("the slow reader got %q first", got)
	}
	r.quiet(t, "after the newest")
}
