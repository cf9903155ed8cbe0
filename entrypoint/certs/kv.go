package certs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
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
// cannot be reached the last good set keeps serving.
type KV struct {
	client *api.Client
	prefix string // with a trailing '/'
	now    func() time.Time
	log    *slog.Logger
	good   map[string]*Entry // last good content, by name
	logged map[string]string // problems logged, by key, so each is logged once
}

// NewKV returns a source for prefix (no trailing '/'). now and log may be nil.
func NewKV(client *api.Client, prefix string, now func() time.Time, log *slog.Logger) *KV {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	prefix = strings.TrimSuffix(prefix, "/") + "/"
	return &KV{client: client, prefix: prefix, now: now, log: log.With("component", "certs", "kv", prefix),
		good: map[string]*Entry{}, logged: map[string]string{}}
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

// Run watches the prefix with a blocking query and sends each set that
// differs from the one sent before, until ctx ends. Read's set counts as
// sent when initial is it.
func (k *KV) Run(ctx context.Context, initial Set, out chan<- Set) {
	sent := initial
	watchKV(ctx, k.client, k.prefix, k.log, func(pairs api.KVPairs) {
		set, _ := k.apply(pairs)
		if set.equal(sent) {
			return
		}
		select {
		case out <- set:
			sent = set
		case <-ctx.Done():
		}
	})
}

// watchKV calls fn with every key under prefix at once and after each
// change, with blocking queries, until ctx ends. While Consul fails, fn is
// not called (what it last had stays in use) and the query is retried with
// backoff; the failure is logged once, and the recovery.
func watchKV(ctx context.Context, c *api.Client, prefix string, log *slog.Logger, fn func(api.KVPairs)) {
	var (
		index   uint64
		backoff time.Duration
		failing bool
	)
	for ctx.Err() == nil {
		opts := (&api.QueryOptions{WaitIndex: index, WaitTime: kvWait}).WithContext(ctx)
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
		if meta.LastIndex < index {
			index = 0
		} else {
			index = max(meta.LastIndex, 1)
		}
		fn(pairs)
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
