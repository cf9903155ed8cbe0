package consul

import (
	"bufio"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Like net/http's Transport, connTransport asks for gzip when the caller
// did not choose an encoding, and hands the caller the decoded body:
// Consul's answers of many instances shrink several times.

// withGzip returns req, or a copy asking for gzip, and whether it asked.
func withGzip(req *http.Request) (*http.Request, bool) {
	if req.Method == http.MethodHead || req.Header.Get("Accept-Encoding") != "" || req.Header.Get("Range") != "" {
		return req, false
	}
	out := *req
	out.Header = req.Header.Clone()
	if out.Header == nil {
		out.Header = http.Header{}
	}
	out.Header.Set("Accept-Encoding", "gzip")
	return &out, true
}

// ungzip makes a gzip-encoded answer's body read decoded, as net/http does.
func ungzip(resp *http.Response) {
	if !strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") || resp.Body == http.NoBody {
		return
	}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
	resp.Body = &gzipBody{body: resp.Body}
}

// unzipper is a gzip reader and its input buffer, kept between answers
// (a decoder holds a 32 KiB window).
type unzipper struct {
	br *bufio.Reader
	zr gzip.Reader
}

var unzippers sync.Pool

// gzipBody decodes body on first Read.
type gzipBody struct {
	body io.ReadCloser
	mu   sync.Mutex
	z    *unzipper
	err  error // sticky
}

func (g *gzipBody) Read(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return 0, g.err
	}
	if g.z == nil {
		z, _ := unzippers.Get().(*unzipper)
		if z == nil {
			z = &unzipper{br: bufio.NewReaderSize(nil, 2048)}
		}
		z.br.Reset(g.body)
		if err := z.zr.Reset(z.br); err != nil {
			g.z = z
			g.release()
			g.err = err
			return 0, err
		}
		g.z = z
	}
	n, err := g.z.zr.Read(p)
	if err != nil {
		g.err = err
		g.release()
	}
	return n, err
}

func (g *gzipBody) release() {
	if g.z != nil {
		g.z.br.Reset(nil)
		unzippers.Put(g.z)
		g.z = nil
	}
}

func (g *gzipBody) Close() error {
	err := g.body.Close() // first: a Read blocked below returns
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.err = errBodyClosed
	}
	g.release()
	return err
}
