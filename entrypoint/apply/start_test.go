package apply

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// builtinLike renders nothing until the catalog has arrived, as the
// built-in template does, and a frontend line otherwise.
type builtinLike struct{}

func (builtinLike) Render(st model.State) (model.Rendering, error) {
	r := model.Rendering{Queries: []model.Query{model.LocalCatalog}}
	if _, ok := st.Result(model.LocalCatalog); !ok {
		r.Missing = []model.Query{model.LocalCatalog}
		return r, nil
	}
	var b strings.Builder
	b.WriteString("frontend http\n")
	for _, in := range st.Local().Instances {
		fmt.Fprintf(&b, "server %s %s\n", in.Name, in.Address)
	}
	r.Config = []byte(b.String())
	return r, nil
}

// A source that never answers, nothing saved: the first configuration is
// the template over empty answers (frontends, no routes), not an empty
// file; not ready until the source answers, then its data is applied.
func TestStartWithNothingFromTheSourcesServesTheEmptyConfiguration(t *testing.T) {
	src := newSource("consul")
	r := newRig(t, t.TempDir(), builtinLike{}, src)
	if err := r.a.Start(startCtx(t, r)); err != nil {
		t.Fatal(err)
	}
	if got := r.file(t); got != "frontend http\n" {
		t.Errorf("first file %q, want the frontend with no routes", got)
	}
	if err := r.a.Ready(); err == nil || !strings.Contains(err.Error(), "consul") {
		t.Errorf("Ready = %v, want an error naming consul", err)
	}
	r.run(t)
	src.send("web=10.0.0.1")
	testenv.Eventually(t, 5*time.Second, "the source's data applied", func() bool { return r.reloadCount() == 1 })
	if got := r.file(t); got != "frontend http\nserver web 10.0.0.1\n" {
		t.Errorf("file %q", got)
	}
	testenv.Eventually(t, 5*time.Second, "ready", func() bool { return r.a.Ready() == nil })
}

// With FirstUnchecked, the first configuration is written unchecked only
// when nothing was applied before: HAProxy's start checks it. Over an
// earlier file (what a restart would fall back to) it is checked first,
// and a refused one leaves that file as it was; without FirstUnchecked it
// is always checked.
func TestTheFirstConfigurationIsCheckedByHAProxyAloneWhenNothingRuns(t *testing.T) {
	for _, tc := range []struct {
		name      string
		unchecked bool
		before    string // Path's content before the start; "" none
		checks    int
		file      string
	}{
		{name: "nothing before", unchecked: true, checks: 0, file: "frontend http\nserver web 10.0.0.1\n"},
		{name: "nothing before, checked", checks: 1, file: "frontend http\nserver web 10.0.0.1\n"},
		{name: "an earlier file", unchecked: true, before: "frontend old\n", checks: 1, file: "frontend http\nserver web 10.0.0.1\n"},
		{name: "an earlier file, a refused one", unchecked: true, before: "frontend old\n", checks: 1, file: "frontend old\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := newSource("consul")
			r := newRig(t, t.TempDir(), builtinLike{}, src)
			r.a.opts.FirstUnchecked = tc.unchecked
			if tc.before != "" {
				if err := os.WriteFile(r.path, []byte(tc.before), 0o640); err != nil {
					t.Fatal(err)
				}
			}
			addr := "10.0.0.1"
			if strings.Contains(tc.name, "refused") {
				addr = "bad"
			}
			src.send("web=" + addr)
			if err := r.a.Start(startCtx(t, r)); err != nil {
				t.Fatal(err)
			}
			if n := r.checkCount(); n != tc.checks {
				t.Errorf("%d checks before HAProxy starts, want %d", n, tc.checks)
			}
			if got := r.file(t); got != tc.file {
				t.Errorf("file %q, want %q", got, tc.file)
			}
		})
	}
}
