package certs

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"strings"
	"time"
)

// The runtime API half of the Installer: each change as HAProxy's commands,
// answers checked against what HAProxy 2.6+ says on success.

// put adds (new ssl cert, then into the crt-list) or replaces a
// certificate in the running worker, and checks its serial.
func (i *Installer) put(ctx context.Context, name string, e *Entry, replace bool) error {
	p := i.path(name)
	if !replace {
		// A worker started after the files were written (a reload)
		// has it already: then it is a replacement.
		ans, err := i.do(ctx, "new ssl cert "+p)
		switch {
		case err != nil:
			return err
		case strings.Contains(ans, "already exists"):
			replace = true
		case !strings.Contains(ans, "New empty certificate store"):
			return fmt.Errorf("new ssl cert %s: %s", p, firstLine(ans))
		}
	}
	ans, err := i.do(ctx, "set ssl cert "+p+" <<\n"+string(e.PEM))
	if err != nil {
		return err
	}
	if !strings.Contains(ans, "Transaction created") && !strings.Contains(ans, "Transaction updated") {
		i.abort(ctx, p)
		return fmt.Errorf("set ssl cert %s: %s", p, firstLine(ans))
	}
	if ans, err = i.do(ctx, "commit ssl cert "+p); err != nil || !strings.Contains(ans, "Success!") {
		i.abort(ctx, p)
		return fmt.Errorf("commit ssl cert %s: %s", p, errOr(err, ans))
	}
	if !replace {
		// A reload after "new ssl cert" gives a worker that loaded it
		// from the files, crt-list entry included: adding it again
		// would make a second entry, which "del ssl crt-list" refuses.
		listed, err := i.listed(ctx, p)
		if err != nil {
			return err
		}
		if !listed {
			if ans, err = i.do(ctx, "add ssl crt-list "+i.list+" "+p); err != nil || !strings.Contains(ans, "Success!") {
				return fmt.Errorf("add ssl crt-list %s: %s", p, errOr(err, ans))
			}
		}
	}
	return i.verify(ctx, p, e.Serial)
}

// listed reports whether the worker's crt-list has an entry for p.
func (i *Installer) listed(ctx context.Context, p string) (bool, error) {
	ans, err := i.do(ctx, "show ssl crt-list "+i.list)
	if err != nil {
		return false, err
	}
	if !strings.HasPrefix(strings.TrimSpace(ans), "# "+i.list) {
		return false, fmt.Errorf("show ssl crt-list %s: %s", i.list, firstLine(ans))
	}
	for l := range strings.Lines(ans) {
		if l = strings.TrimSpace(l); l == p || strings.HasPrefix(l, p+" ") {
			return true, nil
		}
	}
	return false, nil
}

// remove takes a certificate out of the crt-list, then out of the worker.
func (i *Installer) remove(ctx context.Context, name string) error {
	// "does not exist": a worker started after the files were written
	// (a reload) never had it, which is the goal too.
	p := i.path(name)
	ans, err := i.do(ctx, "del ssl crt-list "+i.list+" "+p)
	if err != nil || !strings.Contains(ans, "deleted in crtlist") && !strings.Contains(ans, "does not exist") {
		return fmt.Errorf("del ssl crt-list %s: %s", p, errOr(err, ans))
	}
	ans, err = i.do(ctx, "del ssl cert "+p)
	if err != nil || !strings.Contains(ans, "deleted!") && !strings.Contains(ans, "doesn't exist") {
		return fmt.Errorf("del ssl cert %s: %s", p, errOr(err, ans))
	}
	return nil
}

var serialLine = regexp.MustCompile(`(?m)^Serial: ([0-9A-Fa-f]+)\s*$`)

// verify reads the serial the worker serves for p: an answer is not a proof.
func (i *Installer) verify(ctx context.Context, p string, want *big.Int) error {
	ans, err := i.do(ctx, "show ssl cert "+p)
	if err != nil {
		return err
	}
	m := serialLine.FindStringSubmatch(ans)
	if m == nil {
		return fmt.Errorf("show ssl cert %s: no serial in %s", p, firstLine(ans))
	}
	got, _ := new(big.Int).SetString(m[1], 16)
	if got == nil || got.Cmp(want) != 0 {
		return fmt.Errorf("show ssl cert %s: serial %s served, %s installed", p, m[1], want.Text(16))
	}
	return nil
}

func (i *Installer) abort(ctx context.Context, p string) { _, _ = i.do(ctx, "abort ssl cert "+p) }

func (i *Installer) do(ctx context.Context, cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ans, err := i.o.CLI.Do(ctx, "@1 "+cmd)
	if err != nil {
		verb, _, _ := strings.Cut(cmd, " /")
		head, payload, _ := strings.Cut(cmd, "<<\n")
		if payload != "" {
			return "", fmt.Errorf("%s: %w", head, withoutPayload(err, payload))
		}
		return "", fmt.Errorf("%s: %w", verb, err)
	}
	return ans, nil
}

// withoutPayload returns the first error of err's chain that does not quote
// the payload (a certificate's private key): the master CLI's errors quote
// the command they failed on.
func withoutPayload(err error, payload string) error {
	key := strings.TrimSpace(payload)
	key = key[:min(len(key), 40)]
	for e := err; e != nil; e = errors.Unwrap(e) {
		if msg := e.Error(); !strings.Contains(msg, "BEGIN") && !strings.Contains(msg, key) {
			return e
		}
	}
	return errors.New("the master CLI failed")
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return "no answer"
	}
	return strings.ReplaceAll(s, "\n", " / ")
}

func errOr(err error, ans string) string {
	if err != nil {
		return err.Error()
	}
	return firstLine(ans)
}
