package status

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// maxConns bounds the status server's open connections: probes and
// scrapes need a handful, and every descriptor it holds is one that
// haproxy -c, the master CLI and the sources may lack. A quarter of the
// process's descriptor limit, at most 64: with the 256 of a small
// container, 192 stay for the rest.
func maxConns() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 16
	}
	return int(max(min(lim.Cur/4, 64), 4))
}

// capListener accepts every connection, so that none waits in the
// kernel's backlog behind idle ones (a probe queued there would time out),
// and keeps at most max open: at the cap, a new connection closes the
// oldest one that is not serving a request. A client holding idle
// connections loses them; /healthz gets in.
type capListener struct {
	net.Listener
	max int
	log *slog.Logger

	mu       sync.Mutex
	open     []*capConn // in order of acceptance
	lastWarn time.Time
}

type capConn struct {
	net.Conn
	l      *capListener
	active bool // serving a request (http.StateActive); guarded by l.mu
	once   sync.Once
}

func (c *capConn) Close() error {
	c.once.Do(func() { c.l.forget(c) })
	return c.Conn.Close()
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cc := &capConn{Conn: c, l: l}
		l.mu.Lock()
		var victim *capConn
		full := len(l.open) >= l.max
		if full {
			for _, o := range l.open {
				if !o.active {
					victim = o
					break
				}
			}
		}
		warn := full && time.Since(l.lastWarn) > time.Minute
		if warn {
			l.lastWarn = time.Now()
		}
		if !full || victim != nil {
			l.open = append(l.open, cc)
		}
		l.mu.Unlock()
		if warn {
			l.log.Warn("status endpoint at its connection cap; closing the oldest idle connections", "max", l.max)
		}
		if victim != nil {
			victim.Close()
		}
		if full && victim == nil {
			c.Close() // every connection is serving a request
			continue
		}
		return cc, nil
	}
}

func (l *capListener) forget(c *capConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, o := range l.open {
		if o == c {
			l.open = append(l.open[:i], l.open[i+1:]...)
			return
		}
	}
}

// connState is the server's ConnState hook: it tells which connections
// serve a request and may not be closed to make room.
func (l *capListener) connState(c net.Conn, st http.ConnState) {
	cc, ok := c.(*capConn)
	if !ok {
		return
	}
	l.mu.Lock()
	cc.active = st == http.StateActive
	l.mu.Unlock()
	if st == http.StateHijacked || st == http.StateClosed {
		cc.once.Do(func() { l.forget(cc) })
	}
}
