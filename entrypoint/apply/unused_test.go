package apply

import (
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// static renders fixed bytes, reading the queries it is given (none for a
// template that reads only env or nothing at all).
type static struct{ queries []model.Query }

func (s static) Render(st model.State) (model.Rendering, error) {
	r := model.Rendering{Queries: s.queries, Config: []byte("global\n")}
	for _, q := range s.queries {
		if _, ok := st.Result(q); !ok {
			r.Missing = append(r.Missing, q)
		}
	}
	return r, nil
}

// A source the template does not read must not hold the first rendering
// until the discovery timeout (consul-template renders such a template at
// once): a template that queries nothing starts at once; one that reads
// only a KV key starts as soon as that key is answered. One that reads the
// catalog still waits for every source (TestStartWaitsForEverySource...).
func TestStartDoesNotWaitForSourcesTheTemplateDoesNotRead(t *testing.T) {
	key := model.Query{Kind: model.QueryKey, Key: "k"}
	tests := []struct {
		name    string
		queries []model.Query
		send    func(consul *fakeSource)
	}{
		{"no query", nil, func(*fakeSource) {}},
		{"a KV key only", []model.Query{key}, func(c *fakeSource) {
			c.ch <- model.Snapshot{Source: "consul", Results: map[model.Query]model.Result{key: {Pairs: []model.KVPair{{Key: "k", Value: "v"}}}}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, f := newSource("consul"), newSource("file") // the file source never answers
			r := newRig(t, t.TempDir(), static{tt.queries}, c, f)
			r.a.opts.StartTimeout = 10 * time.Second
			tt.send(c)
			start := time.Now()
			if err := r.a.Start(startCtx(t, r)); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("the first rendering took %s, waiting for a source the template does not read", took)
			}
			if got := r.file(t); got != "global\n" {
				t.Errorf("file %q", got)
			}
		})
	}
}
