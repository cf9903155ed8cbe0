package certs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
)

// Challenges answers ACME HTTP-01 challenges through HAProxy itself: the
// HTTP frontend serves /.well-known/acme-challenge/TOKEN from a map file
// (token → key authorization). Tokens are added and removed over the
// runtime API (add map, del map), and the file is kept in step, so that a
// reload during an order still answers. It implements lego's
// challenge.Provider.
type Challenges struct {
	file string
	cli  CLI
	mu   sync.Mutex
	keys map[string]string // token → key authorization
}

// A token is base64url (RFC 8555 8.1); a key authorization is a token,
// '.', and a base64url thumbprint. Anything else never reaches HAProxy.
var (
	tokenRe   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,256}$`)
	keyAuthRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,256}\.[A-Za-z0-9_-]{1,128}$`)
)

// NewChallenges empties the map file (tokens of an earlier run are stale)
// before HAProxy loads it; cli may be set later with SetCLI.
func NewChallenges(file string, cli CLI) (*Challenges, error) {
	if !safePath.MatchString(file) {
		return nil, fmt.Errorf("ACME challenge map %q: only letters, digits and . _ / - may be used in the path", file)
	}
	if err := writeFile(file, nil); err != nil {
		return nil, fmt.Errorf("ACME challenge map: %w", err)
	}
	return &Challenges{file: file, cli: cli, keys: map[string]string{}}, nil
}

// File is the map file the HTTP frontend reads.
func (c *Challenges) File() string { return c.file }

// Present makes HAProxy answer token with keyAuth.
func (c *Challenges) Present(ctx context.Context, domain, token, keyAuth string) error {
	if !tokenRe.MatchString(token) || !keyAuthRe.MatchString(keyAuth) {
		return fmt.Errorf("ACME challenge for %s: the CA's token %s is not base64url", domain, describe(token))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keys[token] = keyAuth
	if err := c.write(); err != nil {
		return err
	}
	return c.do(ctx, "add map "+c.file+" "+token+" "+keyAuth)
}

// has reports whether token is answered.
func (c *Challenges) has(token string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.keys[token]
	return ok
}

// CleanUp stops answering token.
func (c *Challenges) CleanUp(ctx context.Context, domain, token, keyAuth string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.keys[token]; !ok {
		return nil
	}
	delete(c.keys, token)
	if err := c.write(); err != nil {
		return err
	}
	return c.do(ctx, "del map "+c.file+" "+token)
}

func (c *Challenges) write() error {
	var b strings.Builder
	for _, t := range slices.Sorted(maps.Keys(c.keys)) {
		b.WriteString(t + " " + c.keys[t] + "\n")
	}
	if err := writeFile(c.file, []byte(b.String())); err != nil {
		return fmt.Errorf("ACME challenge map: %w", err)
	}
	return nil
}

// do sends cmd to the current worker: add map and del map answer nothing
// on success. HAProxy may still be starting (the first hosts are ordered
// at once): a master CLI that cannot be reached yet, that has no worker
// yet to pass the command to, or that dropped the connection (before 3.1
// the master re-executes itself once its first worker runs) is tried
// again for a while. Sent twice, add map adds a second equal entry, which
// answers alike and which del map removes with the first.
func (c *Challenges) do(ctx context.Context, cmd string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	what := strings.Join(strings.Fields(cmd)[:2], " ")
	for {
		ans, err := c.cli.Do(ctx, "@1 "+cmd)
		a := strings.TrimSpace(ans)
		switch {
		case err == nil && a == "":
			return nil
		case err == nil:
			err = fmt.Errorf("HAProxy answered %s", describe(firstLine(a)))
		}
		if !dialFailed(err) && !noWorkerYet(a) && !haproxy.IsConnDrop(err) {
			return fmt.Errorf("%s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// noWorkerYet reports whether the master CLI answered that it has no
// worker for the '@1' prefix: it runs before its first worker does.
func noWorkerYet(answer string) bool { return strings.Contains(answer, "Can't find the target PID") }

// dialFailed reports whether err is a connection that never opened.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
