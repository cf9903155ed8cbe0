package certs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// SourceKV is the source label of certificates from SEAMLESS_CERTS_KV.
const SourceKV = "kv"

// kvWait is how long one blocking query waits for a change.
const kvWait = 5 * time.Minute

// KV reads certificates from a Consul KV prefix: PREFIX/NAME holds one PEM
// bundle (certificate, chain and key), installed as NAME. Keys deeper
// under the prefix are not certificates and are refused. Values are as
// untrusted as files: each is checked like one, a bad one is refused with
// a message naming its key (never its content), and a key that was good
// keeps its last good content until it is fixed or deleted. While Consul
// cannot be read the last good set keeps serving, and a Consul that comes
// back without its data removes nothing for the hold (removalHold).
type KV struct {
	client *api.Client
	prefix string // with a trailing '/'
	now    func() time.Time
	log    *slog.Logger
	good   map[string]*Entry // last good content, by name
	logged map[string]string // problems logged, by key, so each is logged once
	hold   removalHold       // owned by Run
}

// NewKV returns a source for prefix (no trailing '/'). Removals are held
// for hold after Consul lost its data (0: never). now and log may be nil.
func NewKV(client *api.Client, prefix string, hold time.Duration, now func() time.Time, log *slog.Logger) *KV {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	prefix = strings.TrimSuffix(prefix, "/") + "/"
	k := &KV{client: client, prefix: prefix, now: now, log: log.With("component", "certs", "kv", prefix),
		good: map[string]*Entry{}, logged: map[string]string{}}
	k.hold = removalHold{hold: hold, log: k.log}
	return k
}

// Read reads the prefix once, for the files HAProxy starts with.
func (k *KV) Read(ctx context.Context) (Set, error) {
	pairs, _, err := k.client.KV().List(k.prefix, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return Set{}, fmt.Errorf("certificates in Consul KV %s: %w", k.prefix, err)
	}
	set, _ := k.apply(pairs)
	return set, nil
}

// apply checks the pairs of one answer. Problems are logged (each once,
// until it changes) and returned by key.
func (k *KV) apply(pairs api.KVPairs) (Set, map[string]string) {
	problems := map[string]string{}
	good := map[string]*Entry{}
	n := 0
	for _, p := range pairs {
		name, ok := strings.CutPrefix(p.Key, k.prefix)
		if !ok || name == "" {
			continue
		}
		if strings.Contains(name, "/") {
			if !strings.HasSuffix(name, "/") { // a folder's own key holds nothing
				problems[p.Key] = "not a certificate: each bundle is one key PREFIX/NAME, with no further '/'"
			}
			continue
		}
		if n++; n > maxFiles {
			problems[p.Key] = fmt.Sprintf("more than %d certificates under the prefix; this one and the following are not read", maxFiles)
			break
		}
		inst := installName(name)
		c, err := Check(p.Value, k.now())
		if err != nil {
			problems[p.Key] = err.Error()
			if last, ok := k.good[inst]; ok {
				good[inst] = last
				problems[p.Key] += "; its last good content keeps serving"
			}
			continue
		}
		good[inst] = &Entry{Name: inst, Source: SourceKV, File: "consul kv " + p.Key, Cert: c}
	}
	for key, p := range problems {
		if k.logged[key] != p {
			k.log.Error("certificate refused", "key", key, "err", p)
		}
	}
	for key := range k.logged {
		if _, ok := problems[key]; !ok {
			k.log.Info("certificate key no longer refused", "key", key)
		}
	}
	k.logged = problems
	k.good = good
	return Set{Certs: maps.Clone(good)}, problems
}

// kvAnswer is one answer of watchKV.
type kvAnswer struct {
	pairs api.KVPairs
	reset bool
}

// Run watches the prefix with a blocking query and sends each set that
// differs from the one sent before, until ctx ends: only the newest when
// out is slow. Read's set counts as sent when initial is it. Removals are
// held after an index reset, or when one answer empties the prefix of
// more than one certificate, for the hold; then the listing applies.
func (k *KV) Run(ctx context.Context, initial Set, out chan<- Set) {
	answers := make(chan kvAnswer)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		watchKV(wctx, k.client, k.prefix, k.log, func(pairs api.KVPairs, reset bool) {
			select {
			case answers <- kvAnswer{pairs, reset}:
			case <-wctx.Done():
			}
		})
	})
	defer func() { cancel(); wg.Wait() }()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var (
		listed  = initial // the newest answer's certificates
		cur     = initial // what was sent, or waits to be
		sent    = initial
		pending bool
	)
	for {
		var send chan<- Set
		if pending {
			send = out
		}
		select {
		case <-ctx.Done():
			return
		case a := <-answers:
			before := len(cur.Certs)
			listed, _ = k.apply(a.pairs)
			switch now := k.now(); {
			case a.reset:
				k.hold.start(now, "Consul's index went backwards under the prefix (a Consul restarted or restored without its data)")
			case len(listed.Certs) == 0 && before > 1 && !k.hold.active(now):
				k.hold.start(now, fmt.Sprintf("one answer removed all %d certificates under the prefix", before))
			}
		case <-timer.C:
		case send <- cur:
			sent, pending = cur, false
			continue
		}
		now := k.now()
		cur = k.hold.compose(listed, cur, now)
		pending = !cur.equal(sent)
		timer.Stop()
		if k.hold.active(now) {
			timer.Reset(k.hold.until.Sub(now))
		}
	}
}

// watchKV calls fn with every key under prefix at once and after each
// change, with blocking queries, until ctx ends. While Consul fails, fn is
// not called (what it last had stays in use) and the query is retried with
// backoff; the failure is logged once, and the recovery.
//
// reset is true when Consul's index went backwards since the answer
// before: a server restarted or restored with less data, or another
// server that lags behind.
func watchKV(ctx context.Context, c *api.Client, prefix string, log *slog.Logger, fn func(pairs api.KVPairs, reset bool)) {
	var (
		index   uint64
		backoff time.Duration
		failing bool
	)
	for ctx.Err() == nil {
		// After a failure the query reads afresh: a Consul that came back
		// with a lower index would hold a query for a higher one for its
		// whole wait, so the loss of its data would go unseen.
		wait := index
		if failing {
			wait = 0
		}
		opts := (&api.QueryOptions{WaitIndex: wait, WaitTime: kvWait}).WithContext(ctx)
		pairs, meta, err := c.KV().List(prefix, opts)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				log.Warn("cannot read Consul KV; what it last held stays in use", "prefix", prefix, "err", err)
				failing = true
			}
			backoff = min(max(2*backoff, 250*time.Millisecond), 30*time.Second)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			continue
		}
		if failing {
			log.Info("Consul KV answers again", "prefix", prefix)
			failing = false
		}
		backoff = 0
		// An index that went back (a Consul restored from a snapshot)
		// starts the watch again; 0 would not block.
		reset := meta.LastIndex < index
		if reset {
			log.Warn("Consul's index went backwards (restarted with less data, or another server answered): starting the watch over",
				"prefix", prefix, "from", index, "to", meta.LastIndex)
			index = 0
		} else {
			index = max(meta.LastIndex, 1)
		}
		fn(pairs, reset)
	}
}

// Merge is the union of the directory's and the KV prefix's certificates.
// A name both use is the directory's: the KV one is left out, and shadowed
// lists such names.
func Merge(dir, kv Set) (set Set, shadowed []string) {
	set = Set{Certs: maps.Clone(dir.Certs)}
	if set.Certs == nil {
		set.Certs = map[string]*Entry{}
	}
	for name, e := range kv.Certs {
		if _, ok := set.Certs[name]; ok {
			shadowed = append(shadowed, name)
			continue
		}
		set.Certs[name] = e
	}
	slices.Sort(shadowed)
	return set, shadowed
}

// RunMerge sends the merge of the newest set from dirs and from kvs,
// starting from dir and kv (what the files were prepared with), until ctx
// ends. A nil input never sends. Each name shadowed is logged once.
func RunMerge(ctx context.Context, dir, kv Set, dirs, kvs <-chan Set, out chan<- Set, log *slog.Logger) {
	logged := map[string]bool{}
	note := func(shadowed []string) {
		now := map[string]bool{}
		for _, n := range shadowed {
			now[n] = true
			if !logged[n] && log != nil {
				log.Warn("a certificate of SEAMLESS_CERTS_KV has the name of one of SEAMLESS_CERTS_DIR; the directory's serves",
					"component", "certs", "name", n, "from", kv.Certs[n].File)
			}
		}
		logged = now
	}
	sent, sh := Merge(dir, kv)
	note(sh)
	var pending *Set
	for {
		var send chan<- Set
		var s Set
		if pending != nil {
			send, s = out, *pending
		}
		select {
		case <-ctx.Done():
			return
		case dir = <-dirs:
		case kv = <-kvs:
		case send <- s:
			sent, pending = s, nil
			continue
		}
		m, sh := Merge(dir, kv)
		note(sh)
		if m.equal(sent) {
			pending = nil
		} else {
			pending = &m
		}
	}
}
