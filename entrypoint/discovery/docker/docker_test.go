//go:build docker

package docker

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// Containers come and go; every change after the first list is seen
// through events (the rescan is an hour).
func TestContainers(t *testing.T) {
	l := newLab(t)
	net := l.network("net")
	web := l.run("web", box{network: net, labels: enabled(
		"seamless.http.host", "a.example, b.example", "seamless.http.path", "/api",
		"seamless.weight", "7", "seamless.http.hots", "typo.example")})
	two := l.run("two", box{network: net, labels: enabled("seamless.service", "api", "seamless.port", "9090"), ports: []string{"8080", "9090"}})
	l.run("plain", box{network: net, labels: map[string]string{"seamless.http.host": "plain.example"}})
	l.run("ambiguous", box{network: net, labels: enabled(), ports: []string{"8080", "9090"}})
	p := newProxy(t, l.c)
	r := start(t, p.config(net, time.Hour), l.prefix)

	s := r.until(t, "api:9090 web:8080")
	want := model.Instance{
		Source: "docker", ID: web[:12], Name: l.prefix + "web", Address: l.ip(web, net), Port: 8080, Weight: 7,
		Tags: []string{"seamless.http.host=a.example", "seamless.http.host=b.example", "seamless.http.path=/api",
			"seamless.http.hots=typo.example"},
		Meta:       map[string]string{"container": l.prefix + "web", "image": l.image, "network": net},
		Status:     model.StatusPassing,
		Registered: l.created(web),
	}
	if got := find(s, l.prefix+"web"); got == nil || !reflect.DeepEqual(*got, want) {
		t.Errorf("web:\ngot  %+v\nwant %+v", got, want)
	}
	if got := find(s, l.prefix+"two"); got == nil || got.Address != l.ip(two, net) || got.ID != two[:12] {
		t.Errorf("api: %+v", got)
	}
	if s.Source != "docker" || len(s.Results) != 1 || len(s.Local().Nodes) != 0 {
		t.Errorf("snapshot %+v", s)
	}
	testenv.Eventually(t, wait, "the ambiguous container's reason logged", func() bool {
		return r.logs.Count("WARN container left out", "container="+l.prefix+"ambiguous",
			"exposes several TCP ports (8080, 9090): choose one with the label seamless.port") == 1
	})
	testenv.Eventually(t, wait, "status up", func() bool { return r.Status().Up })

	late := ""
	t.Run("a container started later", func(t *testing.T) {
		late = l.run("late", box{network: net, labels: enabled()})
		r.until(t, "api:9090 late:8080 web:8080")
	})
	t.Run("a container stopped", func(t *testing.T) {
		l.stop(web)
		r.until(t, "api:9090 late:8080")
	})
	t.Run("a container renamed", func(t *testing.T) {
		if _, err := l.c.ContainerRename(context.Background(), late, client.ContainerRenameOptions{NewName: l.prefix + "renamed"}); err != nil {
			t.Fatal(err)
		}
		r.until(t, "api:9090 renamed:8080")
	})
	t.Run("a container removed", func(t *testing.T) {
		if _, err := l.c.ContainerRemove(context.Background(), two, client.ContainerRemoveOptions{Force: true}); err != nil {
			t.Fatal(err)
		}
		r.until(t, "renamed:8080")
	})
	if n := r.logs.Count("container left out", "container="+l.prefix+"ambiguous"); n != 1 {
		t.Errorf("the ambiguous container was logged %d times, want once", n)
	}
}

// A failing healthcheck is critical, with a log line; a passing one is
// critical until its first check passes, then passing. The health_status
// events carry the changes (the rescan is an hour).
func TestHealthchecks(t *testing.T) {
	l := newLab(t)
	net := l.network("net")
	l.run("failing", box{network: net, labels: enabled(), exit: "1"})
	l.run("passing", box{network: net, labels: enabled(), exit: "0"})
	p := newProxy(t, l.c)
	r := start(t, p.config(net, time.Hour), l.prefix)

	s := r.until(t, "failing:8080(critical) passing:8080")
	if c := find(s, l.prefix+"passing").Checks; len(c) != 1 || c[0].CheckID != CheckHealth || c[0].Status != model.StatusPassing {
		t.Errorf("the passing container's checks: %+v", c)
	}
	testenv.Eventually(t, wait, "the failing container logged", func() bool {
		return r.logs.Count(`WARN container's healthcheck says "unhealthy"; reported critical`, "container="+l.prefix+"failing") == 1
	})
	if in := find(s, l.prefix+"failing"); len(in.Checks) != 1 || in.Checks[0].Status != model.StatusCritical {
		t.Errorf("the failing container: %+v", in)
	}
}

func TestPause(t *testing.T) {
	l := newLab(t)
	net := l.network("net")
	id := l.run("x", box{network: net, labels: enabled()})
	p := newProxy(t, l.c)
	r := start(t, p.config(net, time.Hour), l.prefix)
	r.until(t, "x:8080")
	if _, err := l.c.ContainerPause(context.Background(), id, client.ContainerPauseOptions{}); err != nil {
		t.Fatal(err)
	}
	r.until(t, "x:8080(maintenance)")
	if _, err := l.c.ContainerUnpause(context.Background(), id, client.ContainerUnpauseOptions{}); err != nil {
		t.Fatal(err)
	}
	r.until(t, "x:8080")
}

// Joining and leaving networks, with and without SEAMLESS_DOCKER_NETWORK.
func TestNetworkChanges(t *testing.T) {
	l := newLab(t)
	one, two := l.network("one"), l.network("two")
	id := l.run("x", box{network: one, labels: enabled()})
	connect := func(net string) {
		t.Helper()
		if _, err := l.c.NetworkConnect(context.Background(), net, client.NetworkConnectOptions{Container: id}); err != nil {
			t.Fatal(err)
		}
	}
	disconnect := func(net string) {
		t.Helper()
		if _, err := l.c.NetworkDisconnect(context.Background(), net, client.NetworkDisconnectOptions{Container: id}); err != nil {
			t.Fatal(err)
		}
	}
	p := newProxy(t, l.c)

	t.Run("no network configured: the only one", func(t *testing.T) {
		r := start(t, p.config("", time.Hour), l.prefix)
		if s := r.until(t, "x:8080"); find(s, l.prefix+"x").Address != l.ip(id, one) {
			t.Errorf("address %s, want the one on %s", find(s, l.prefix+"x").Address, one)
		}
		connect(two)
		r.until(t, "")
		testenv.Eventually(t, wait, "the reason logged", func() bool {
			return r.logs.Count("container left out", "container="+l.prefix+"x", "attached to several networks") == 1
		})
		disconnect(one)
		if s := r.until(t, "x:8080"); find(s, l.prefix+"x").Address != l.ip(id, two) {
			t.Errorf("address %s, want the one on %s", find(s, l.prefix+"x").Address, two)
		}
		testenv.Eventually(t, wait, "the end of it logged", func() bool {
			return r.logs.Count("container routed as labelled again", "container="+l.prefix+"x") == 1
		})
	})
	t.Run("a network configured", func(t *testing.T) {
		r := start(t, p.config(one, time.Hour), l.prefix)
		r.until(t, "") // on two only
		connect(one)
		if s := r.until(t, "x:8080"); find(s, l.prefix+"x").Address != l.ip(id, one) {
			t.Errorf("address %s, want the one on %s", find(s, l.prefix+"x").Address, one)
		}
		disconnect(one)
		r.until(t, "")
	})
}

// The proxy swallows every event: only the periodic re-list can see the
// new container, and this test fails if it does not.
func TestRescanSeesWhatEventsMiss(t *testing.T) {
	l := newLab(t)
	net := l.network("net")
	p := newProxy(t, l.c)
	p.blind.Store(true)
	r := start(t, p.config(net, 200*time.Millisecond), l.prefix)
	r.until(t, "")
	l.run("x", box{network: net, labels: enabled()})
	r.until(t, "x:8080")
}

// The engine goes away: nothing is sent while it is (no snapshot that
// loses the containers), Status says why, and when it is back everything
// is listed again, so a change made meanwhile is seen.
func TestEngineGoesAwayAndComesBack(t *testing.T) {
	l := newLab(t)
	net := l.network("net")
	l.run("x", box{network: net, labels: enabled()})
	y := l.run("y", box{network: net, labels: enabled()})
	p := newProxy(t, l.c)
	r := start(t, p.config(net, time.Hour), l.prefix)
	r.until(t, "x:8080 y:8080")
	testenv.Eventually(t, wait, "status up", func() bool { return r.Status().Up })

	p.down()
	testenv.Eventually(t, wait, "status down", func() bool { return !r.Status().Up })
	testenv.Eventually(t, wait, "the list's error reported", func() bool {
		return strings.HasPrefix(r.Status().LastError, "listing containers: cannot reach the Docker engine at unix://"+p.path)
	})
	l.stop(y) // unseen while the engine is away
	first := r.Status().LastErrorAt
	testenv.Eventually(t, wait, "a retry", func() bool { return r.Status().LastErrorAt.After(first) })
	r.quiet(t, "while the engine is away")

	p.up()
	r.until(t, "x:8080")
	testenv.Eventually(t, wait, "status up again", func() bool { return r.Status().Up })
}

// A relevant event whose re-list finds what was sent sends nothing.
func TestNoSnapshotWhenNothingChanged(t *testing.T) {
	l := newLab(t)
	net, other := l.network("net"), l.network("other")
	l.run("x", box{network: net, labels: enabled()})
	p := newProxy(t, l.c)
	r := start(t, p.config(net, time.Hour), l.prefix)
	r.until(t, "x:8080")

	var (
		mu  sync.Mutex
		got []string
	)
	go func() {
		for {
			select {
			case s := <-r.out:
				mu.Lock()
				got = append(got, summary(s, l.prefix))
				mu.Unlock()
			case <-r.done:
				return
			}
		}
	}()
	before := r.Status().LastSuccess
	l.run("elsewhere", box{network: other, labels: enabled()}) // labelled, so re-listed; not on net, so left out
	testenv.Eventually(t, wait, "listed again", func() bool {
		return r.Status().LastSuccess.After(before) && r.logs.Count("container left out", "container="+l.prefix+"elsewhere") == 1
	})
	l.run("y", box{network: net, labels: enabled()})
	testenv.Eventually(t, wait, "the change arrives", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(got, "x:8080 y:8080")
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []string{"x:8080 y:8080"}) {
		t.Errorf("snapshots after the unchanged re-list: %q", got)
	}
}

// New with no options reads DOCKER_HOST, as the Docker CLI does.
func TestDockerHost(t *testing.T) {
	l := newLab(t)
	net := l.network("net")
	l.run("x", box{network: net, labels: enabled()})
	p := newProxy(t, l.c)
	t.Setenv("DOCKER_HOST", "unix://"+p.path)
	r := start(t, Config{Network: net}, l.prefix)
	r.until(t, "x:8080")
	if want := "unix://" + p.path + " (DOCKER_HOST)"; r.host != want {
		t.Errorf("host %q, want %q", r.host, want)
	}
}

// `docker stop` of a container that drains: it is in maintenance from the
// stop signal on, while it still runs (a container that has exited is not
// listed, so the maintenance snapshot can only come from the signal), and
// gone once it exits. A SIGHUP changes nothing.
func TestStopDrains(t *testing.T) {
	l := newLab(t)
	net := l.network("net")
	id := l.run("x", box{network: net, labels: enabled(), drain: "5s"})
	p := newProxy(t, l.c)
	r := start(t, p.config(net, time.Hour), l.prefix)
	r.until(t, "x:8080")

	ctx := context.Background()
	if _, err := l.c.ContainerKill(ctx, id, client.ContainerKillOptions{Signal: "HUP"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, wait, "the SIGHUP seen", func() bool {
		return r.logs.Count("Docker event", "action=kill", "id="+id[:12]) == 1
	})
	before := r.Status().LastSuccess
	testenv.Eventually(t, wait, "listed again", func() bool { return r.Status().LastSuccess.After(before) })
	r.quiet(t, "after a SIGHUP")

	stopped := make(chan error, 1)
	go func() {
		_, err := l.c.ContainerStop(ctx, id, client.ContainerStopOptions{})
		stopped <- err
	}()
	s := r.until(t, "x:8080(maintenance)")
	if c := find(s, l.prefix+"x").Checks; len(c) != 1 || c[0].Notes != "the container is stopping (SIGTERM)" {
		t.Errorf("checks %+v", c)
	}
	r.until(t, "")
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}
