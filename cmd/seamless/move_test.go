package main

import (
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// An instance that re-registers at another port (same ID) is served there,
// also to a keep-alive client. HAProxy keeps sending a client's requests
// over the server connection its session holds for as long as the same
// server is picked: when the move changed the slot's address in place,
// this client stayed on the old port in 1 of 3 runs for more than 5 s.
// The moved instance now takes another slot and the old one drains.
func TestMoveOnKeepAlive(t *testing.T) {
	r := newDiscoveryRig(t)
	c := r.consul.Client()
	old, moved := namedBackend(t, "old"), namedBackend(t, "moved")
	registerExternal(t, c, "web1", "web", old, api.HealthPassing, r.hostTag)
	in := r.start(t)
	r.eventuallyServedBy(t, "127.0.0.1", "old")
	reloads := in.metric(successes)

	// One client connection, kept alive throughout.
	tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: 5 * time.Second, Transport: tr}
	reused := 0
	get := func() string {
		req, err := http.NewRequest(http.MethodGet, "http://"+r.http+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "127.0.0.1"
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) {
				if i.Reused {
					reused++
				}
			}}))
		resp, err := client.Do(req)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(b))
	}
	if got := get(); got != "old" {
		t.Fatalf("before the move: served by %q", got)
	}

	registerExternal(t, c, "web1", "web", moved, api.HealthPassing, r.hostTag)
	r.eventuallyServedBy(t, "127.0.0.1", "moved")
	reused = 0
	var last string
	testenv.Eventually(t, 5*time.Second, "the kept-alive client reaches the moved instance", func() bool {
		last = get()
		return last == "moved"
	})
	if reused == 0 {
		t.Fatal("no request after the move reused the client's connection: the test shows nothing")
	}
	t.Logf("after the move: %d requests on the kept-alive connection", reused)
	if n := in.metric(successes); n != reloads {
		t.Errorf("%v reloads for a move, want none (the runtime API)", n-reloads)
	}
}
