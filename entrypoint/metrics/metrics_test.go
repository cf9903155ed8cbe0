package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/seamless-lb/seamless/entrypoint/model"
)

func TestSourceStatusIsExported(t *testing.T) {
	m := New()
	ok := time.Unix(1_800_000_000, 0)
	bad := ok.Add(time.Minute)
	m.WatchSources(func() []model.SourceStatus {
		return []model.SourceStatus{
			{Name: "consul", Up: false, LastSuccess: ok, LastError: "connection refused", LastErrorAt: bad},
			{Name: "file", Up: true, LastSuccess: ok},
		}
	})
	want := `
# HELP seamless_source_last_error_timestamp_seconds Unix time of the last failed read of the discovery source (the error is on /status and in the log).
# TYPE seamless_source_last_error_timestamp_seconds gauge
seamless_source_last_error_timestamp_seconds{source="consul"} 1.80000006e+09
# HELP seamless_source_up 1 when the last attempt to read the discovery source succeeded.
# TYPE seamless_source_up gauge
seamless_source_up{source="consul"} 0
seamless_source_up{source="file"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"seamless_source_up", "seamless_source_last_error_timestamp_seconds"); err != nil {
		t.Error(err)
	}
}

func TestStaleSourcesAndHeldRemovalsAreExported(t *testing.T) {
	m := New()
	m.WatchSources(func() []model.SourceStatus {
		return []model.SourceStatus{
			{Name: "consul", Stale: true, Held: 3, HoldsTotal: 2, Withheld: 4, WithholdsTotal: 1},
			{Name: "file", Up: true},
		}
	})
	want := `
# HELP seamless_source_held_instances Instances the source no longer reports that are kept until the removal is confirmed (SEAMLESS_REMOVAL_GUARD).
# TYPE seamless_source_held_instances gauge
seamless_source_held_instances{source="consul"} 3
seamless_source_held_instances{source="file"} 0
# HELP seamless_source_removal_holds_total Snapshots whose removal of too many instances at once was held (SEAMLESS_REMOVAL_GUARD).
# TYPE seamless_source_removal_holds_total counter
seamless_source_removal_holds_total{source="consul"} 2
seamless_source_removal_holds_total{source="file"} 0
# HELP seamless_source_stale 1 when the source has not answered within its wait plus a margin; its last good data keeps serving.
# TYPE seamless_source_stale gauge
seamless_source_stale{source="consul"} 1
seamless_source_stale{source="file"} 0
# HELP seamless_source_withheld_instances Instances the source reports again just after it started over, though it had removed them, kept out until the hold period ends (SEAMLESS_REMOVAL_HOLD).
# TYPE seamless_source_withheld_instances gauge
seamless_source_withheld_instances{source="consul"} 4
seamless_source_withheld_instances{source="file"} 0
# HELP seamless_source_withholds_total Snapshots after a reset of the source that brought back instances it had removed (SEAMLESS_REMOVAL_GUARD).
# TYPE seamless_source_withholds_total counter
seamless_source_withholds_total{source="consul"} 1
seamless_source_withholds_total{source="file"} 0
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"seamless_source_stale", "seamless_source_held_instances", "seamless_source_removal_holds_total",
		"seamless_source_withheld_instances", "seamless_source_withholds_total"); err != nil {
		t.Error(err)
	}
}

// process_network_*_bytes_total are the network namespace's totals (read
// from /proc/self/net/dev), not seamless's traffic: in a container they
// count HAProxy's bytes too, which misleads. The other process_ metrics
// stay.
func TestNoNamespaceNetworkTotalsAreExported(t *testing.T) {
	m := New()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var process int
	for _, f := range fams {
		name := f.GetName()
		if strings.HasPrefix(name, "process_network_") {
			t.Errorf("%s is exported: it describes the network namespace, not seamless", name)
		}
		if strings.HasPrefix(name, "process_") {
			process++
		}
	}
	if process < 4 {
		t.Errorf("only %d process_ metrics: the process collector is gone", process)
	}
}

// seamless_haproxy_workers is asked for at each scrape; when the master
// does not answer, the last reload's values stay.
func TestWorkersAreCountedAtEachScrape(t *testing.T) {
	m := New()
	m.Workers.WithLabelValues("old").Set(1)
	m.Workers.WithLabelValues("current").Set(1)
	var fail bool
	m.WatchWorkers(func(context.Context) (int, int, error) {
		if fail {
			return 0, 0, errors.New("no master")
		}
		return 2, 0, nil
	})
	want := `
# HELP seamless_haproxy_workers HAProxy worker processes by generation (current, or old and still draining), as the master lists them at the scrape (after the last reload when it does not answer).
# TYPE seamless_haproxy_workers gauge
seamless_haproxy_workers{generation="current"} 2
seamless_haproxy_workers{generation="old"} 0
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "seamless_haproxy_workers"); err != nil {
		t.Error(err)
	}
	fail = true
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "seamless_haproxy_workers"); err != nil {
		t.Errorf("after a failed count: %v", err)
	}
}
