package consul

import (
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair is a connected pair of loopback TCP connections: the held end,
// as seamless's, and the agent's.
func tcpPair(t *testing.T) (held *heldConn, agent net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); a.Close() })
	return &heldConn{Conn: c}, a
}

// parkNow parks c and returns a channel closed when it resumes.
func parkNow(t *testing.T, c *heldConn, deadline time.Time) chan struct{} {
	t.Helper()
	resumed := make(chan struct{})
	if !heldParker.park(c, deadline, func() { close(resumed) }) {
		t.Fatal("a TCP connection was not parked")
	}
	return resumed
}

func resumedWithin(t *testing.T, resumed chan struct{}, what string) {
	t.Helper()
	select {
	case <-resumed:
	case <-time.After(10 * time.Second):
		t.Fatalf("a parked query did not resume %s", what)
	}
}

func notResumed(t *testing.T, resumed chan struct{}, what string) {
	t.Helper()
	select {
	case <-resumed:
		t.Fatalf("a parked query resumed %s", what)
	case <-time.After(100 * time.Millisecond):
	}
}

// A parked query resumes when its answer begins, and the answer's bytes
// are all there to read.
func TestAParkedQueryResumesWhenTheAnswerBegins(t *testing.T) {
	held, agent := tcpPair(t)
	resumed := parkNow(t, held, time.Time{})
	notResumed(t, resumed, "before the agent wrote")
	agent.Write([]byte("HTTP"))
	resumedWithin(t, resumed, "when the answer began")
	if err := held.waitFirst(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if n, err := held.Read(buf[:1]); n != 1 || buf[0] != 'H' || err != nil {
		t.Fatalf("first byte: %q, %v", buf[:n], err)
	}
	if n, err := io.ReadFull(held, buf[:3]); n != 3 || err != nil {
		t.Fatalf("the rest of the answer: %q, %v", buf[:n], err)
	}
	if held.parked.Load() != nil {
		t.Error("a resumed connection still wakes its parked query")
	}
	// Parked again, as a reused connection is for its next query.
	resumed = parkNow(t, held, time.Time{})
	notResumed(t, resumed, "on what the last query read")
	held.Close()
	resumedWithin(t, resumed, "when parked a second time and closed")
}

// A close resumes the parked query, and its wait then fails at once:
// seamless's (a cut: a restart, the agent's return, the sub-watch's end),
// or the agent's (its restart, an idle close), after which the query may
// be sent again.
func TestAParkedQueryResumesWhenItsConnectionCloses(t *testing.T) {
	for _, by := range []string{"seamless", "the agent"} {
		t.Run(by, func(t *testing.T) {
			held, agent := tcpPair(t)
			resumed := parkNow(t, held, time.Time{})
			if by == "seamless" {
				held.Close()
			} else {
				agent.Close()
			}
			resumedWithin(t, resumed, "when "+by+" closed the connection")
			if err := held.waitFirst(); err == nil {
				t.Errorf("the wait on a connection %s closed succeeded", by)
			}
		})
	}
}

// A query the agent never answers resumes at its deadline, and its wait
// fails then instead of blocking.
func TestAParkedQueryResumesAtItsDeadline(t *testing.T) {
	held, _ := tcpPair(t)
	deadline := time.Now().Add(200 * time.Millisecond)
	held.SetDeadline(deadline)
	resumed := parkNow(t, held, deadline)
	resumedWithin(t, resumed, "at its deadline")
	if time.Now().Before(deadline) {
		t.Error("resumed before its deadline")
	}
	done := make(chan error, 1)
	go func() { done <- held.waitFirst() }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the wait past the deadline succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait past the deadline blocked")
	}
}

// Only one resume, whatever comes: the answer, a close and the deadline
// together.
func TestAParkedQueryResumesOnce(t *testing.T) {
	for range 50 {
		held, agent := tcpPair(t)
		resumes := make(chan struct{}, 4)
		if !heldParker.park(held, time.Now().Add(time.Millisecond), func() { resumes <- struct{}{} }) {
			t.Fatal("not parked")
		}
		agent.Write([]byte("H"))
		held.Close()
		<-resumes
		select {
		case <-resumes:
			t.Fatal("a parked query resumed twice")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A connection that is no descriptor (a test's pipe, a wrapped dialer's)
// is not parked: its caller waits on a goroutine, as before.
func TestAConnectionWithoutADescriptorIsNotParked(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if heldParker.park(&heldConn{Conn: a}, time.Time{}, func() { t.Error("resumed") }) {
		t.Fatal("a pipe was parked")
	}
	// A closed connection cannot be parked either.
	held, _ := tcpPair(t)
	held.Conn.Close()
	if heldParker.park(held, time.Time{}, func() { t.Error("resumed") }) {
		t.Fatal("a closed connection was parked")
	}
	if held.parked.Load() != nil {
		t.Error("a connection that was not parked would wake a query")
	}
}

// Should the parker's wait fail, the queries parked go on waiting on
// goroutines of their own at once, not until their deadlines, and no
// query is parked any more.
func TestParkedQueriesGoOnWhenTheParkerFails(t *testing.T) {
	var p parker
	held, _ := tcpPair(t)
	resumed := make(chan struct{})
	if !p.park(held, time.Time{}, func() { close(resumed) }) {
		t.Fatal("a TCP connection was not parked")
	}
	p.file.Close() // the loop's wait fails
	resumedWithin(t, resumed, "when the parker failed")
	other, _ := tcpPair(t)
	if p.park(other, time.Time{}, func() { t.Error("resumed") }) {
		t.Fatal("a connection was parked after the parker failed")
	}
}
