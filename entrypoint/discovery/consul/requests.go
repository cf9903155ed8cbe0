package consul

import (
	"io"
	"net/http"
	"sync/atomic"
)

// Requests returns how many HTTP requests the source has sent to Consul,
// including those still waiting for an answer.
func (s *Source) Requests() uint64 { return s.started.Load() }

// InFlight is how many requests wait for an answer now: once the source
// is steady, its held blocking queries.
func (s *Source) InFlight() uint64 {
	f := s.finished.Load()
	return s.started.Load() - f
}

// countingTransport counts the requests of the Consul client, and the
// bytes of their answers.
type countingTransport struct {
	next              http.RoundTripper
	started, finished *atomic.Uint64
	received          *atomic.Uint64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.started.Add(1)
	defer c.finished.Add(1) // a blocking query answers only when it is done
	resp, err := c.next.RoundTrip(r)
	if err == nil && resp != nil && resp.Body != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: c.received}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Uint64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(uint64(n))
	return n, err
}
