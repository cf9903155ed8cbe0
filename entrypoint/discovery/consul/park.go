package consul

import (
	"maps"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A held health query waits minutes for its answer's first byte, and a
// goroutine blocked in a read for each kept 2 to 8 KiB of stack: 20 to 30
// MiB at 10,000 watched services, counted twice by the collector's heap
// goal. parker waits for all of them with one goroutine, on an epoll
// instance of its own that sleeps in the runtime's poller (no thread);
// a goroutine exists only once an answer has begun.
type parker struct {
	once sync.Once
	epfd int
	file *os.File // epfd, in the runtime's poller
	ok   bool

	mu     sync.Mutex
	next   int32 // the last token given
	parked map[int32]*parkedConn
	broken bool // the loop ended: nothing is parked any more
}

// heldParker serves every Source: one epoll instance and one goroutine per
// process.
var heldParker parker

// parkedConn is one held connection in the parker's epoll set.
type parkedConn struct {
	p      *parker
	c      *heldConn
	token  int32
	resume func()

	mu         sync.Mutex
	registered bool // in the epoll set
	woken      bool
	timer      *time.Timer
}

// start makes the epoll instance and its goroutine; false when the system
// refuses, and parking is then never tried again.
func (p *parker) start() bool {
	p.once.Do(func() {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return
		}
		// Non-blocking, the file is registered with the runtime's
		// poller: an epoll instance is readable while it has events.
		f := os.NewFile(uintptr(fd), "held queries")
		rc, err := f.SyscallConn()
		if err != nil {
			f.Close()
			return
		}
		p.epfd, p.file, p.ok, p.parked = fd, f, true, map[int32]*parkedConn{}
		go p.loop(f, rc) // for the process's life: it holds no thread
	})
	return p.ok
}

func (p *parker) loop(f *os.File, rc syscall.RawConn) {
	defer f.Close()
	events := make([]unix.EpollEvent, 256)
	for {
		var (
			n   int
			err error
		)
		rerr := rc.Read(func(fd uintptr) bool {
			n, err = unix.EpollWait(int(fd), events, 0)
			if err == unix.EINTR {
				n, err = 0, nil
				return true // ask again at once
			}
			return err != nil || n > 0 // none pending: wait for the next
		})
		if rerr != nil || err != nil {
			p.fail() // not seen in practice
			return
		}
		for _, ev := range events[:n] {
			p.mu.Lock()
			pc := p.parked[ev.Fd]
			p.mu.Unlock()
			if pc != nil {
				pc.wake()
			}
		}
	}
}

// fail ends parking: the queries parked go on waiting on goroutines of
// their own, as every later one does, instead of until their deadlines.
func (p *parker) fail() {
	p.mu.Lock()
	p.broken = true
	parked := slices.Collect(maps.Values(p.parked))
	p.mu.Unlock()
	for _, pc := range parked {
		pc.wake()
	}
}

// park calls resume once, when c has something to read (the answer, or
// the agent's close), when c is closed, or once deadline (if not zero)
// passes; resume must not block. It reports false, having done nothing,
// when c cannot be parked: the caller then waits on a goroutine.
func (p *parker) park(c *heldConn, deadline time.Time, resume func()) bool {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok || !p.start() {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	pc := &parkedConn{p: p, c: c, resume: resume}
	p.mu.Lock()
	if p.broken {
		p.mu.Unlock()
		return false
	}
	for { // tokens wrap; one still parked is skipped
		p.next++
		if _, taken := p.parked[p.next]; !taken {
			break
		}
	}
	pc.token = p.next
	p.parked[pc.token] = pc
	p.mu.Unlock()

	pc.mu.Lock()       // a wake waits for the end of park
	c.parked.Store(pc) // from now on its Close wakes it
	var addErr error
	// Inside Control the descriptor cannot be closed, nor its number
	// given to another connection.
	cerr := rc.Control(func(fd uintptr) {
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: pc.token}
		addErr = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
	})
	if cerr != nil || addErr != nil {
		pc.woken = true
		c.parked.CompareAndSwap(pc, nil)
		pc.mu.Unlock()
		p.forget(pc)
		return false
	}
	pc.registered = true
	if !deadline.IsZero() {
		pc.timer = time.AfterFunc(time.Until(deadline), pc.wake)
	}
	pc.mu.Unlock()
	return true
}

func (p *parker) forget(pc *parkedConn) {
	p.mu.Lock()
	delete(p.parked, pc.token)
	p.mu.Unlock()
}

// wake takes pc out of the epoll set, if it is still there, and resumes
// its query; only the first call does anything.
func (pc *parkedConn) wake() {
	pc.mu.Lock()
	if pc.woken {
		pc.mu.Unlock()
		return
	}
	pc.woken = true
	if pc.registered {
		if rc, err := pc.c.Conn.(syscall.Conn).SyscallConn(); err == nil {
			// A closed descriptor left the set as it closed.
			_ = rc.Control(func(fd uintptr) {
				_ = unix.EpollCtl(pc.p.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
			})
		}
	}
	if pc.timer != nil {
		pc.timer.Stop()
	}
	pc.c.parked.CompareAndSwap(pc, nil)
	pc.mu.Unlock()
	pc.p.forget(pc)
	pc.resume()
}
