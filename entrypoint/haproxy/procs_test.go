package haproxy

import (
	"reflect"
	"testing"
)

// Captured from HAProxy 2.6.12 after a failed reload: the surviving worker
// stays under "# workers" and the master's failed counter moved.
const showProcFailed = `#<PID>          <type>          <reloads>       <uptime>        <version>      
2716            master          2 [failed: 1]   0d00h10m16s     2.6.12-1+deb12u4
# workers
2969            worker          1               0d00h00m06s     2.6.12-1+deb12u4
# programs

`

const showProcOld = `#<PID>          <type>          <reloads>       <uptime>        <version>
100             master          3 [failed: 0]   0d00h01m00s     3.0.11
# workers
130             worker          0               0d00h00m01s     3.0.11
# old workers
120             worker          1               0d00h00m20s     3.0.11
110             worker          2               0d00h00m40s     3.0.11
# programs
140             dataplane       0               0d00h01m00s     -
`

func TestParseShowProc(t *testing.T) {
	p, err := ParseShowProc(showProcFailed)
	if err != nil {
		t.Fatal(err)
	}
	want := Procs{
		Master:  Proc{Pid: 2716, Type: "master", Reloads: 2, Failed: 1, Version: "2.6.12-1+deb12u4"},
		Workers: []Proc{{Pid: 2969, Type: "worker", Reloads: 1, Failed: -1, Version: "2.6.12-1+deb12u4"}},
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("got %+v\nwant %+v", p, want)
	}

	p, err = ParseShowProc(showProcOld)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Workers) != 1 || p.Workers[0].Pid != 130 {
		t.Errorf("workers = %+v, want pid 130 only", p.Workers)
	}
	if len(p.Old) != 2 || p.Old[0].Pid != 120 || p.Old[1].Pid != 110 {
		t.Errorf("old workers = %+v, want 120 and 110", p.Old)
	}
	if got := p.WorkerPids(); !reflect.DeepEqual(got, map[int]bool{130: true, 120: true, 110: true}) {
		t.Errorf("WorkerPids = %v (programs must not count)", got)
	}
}

func TestParseShowProcRejectsGarbage(t *testing.T) {
	for _, in := range []string{"", "Unknown command\n", "# workers\n12 worker x 0d 2.6\n"} {
		if _, err := ParseShowProc(in); err == nil {
			t.Errorf("ParseShowProc(%q) accepted garbage", in)
		}
	}
}

// Captured from HAProxy 3.2.26 after a reload that failed on a bind: the
// worker that goes on serving is listed as an old one.
const showProcFailed32 = `#<PID>          <type>          <reloads>       <uptime>        <version>      
4025            master          1 [failed: 1]   0d00h00m03s     3.2.26-1       
# workers
# old workers
4030            worker          1               0d00h00m03s     3.2.26-1       

`

func TestHasWorkersCountsTheSurvivorOfAFailedReload(t *testing.T) {
	p, err := ParseShowProc(showProcFailed32)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Workers) != 0 || len(p.Old) != 1 || p.Master.Failed != 1 {
		t.Fatalf("parsed %+v", p)
	}
	if !p.HasWorkers() {
		t.Error("HasWorkers is false while a worker serves")
	}
	if (Procs{}).HasWorkers() {
		t.Error("HasWorkers is true without workers")
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
	}{
		{"3.0.5", true}, {"3.2.26-1", true}, {"10.1", true}, {"2.6.12-1+deb12u4", false}, {"2.9-dev3", false},
		{"3.0-dev1", true}, {"", false}, {"3", false}, {"x.y", false},
	} {
		if got := VersionAtLeast(c.v, 3, 0); got != c.want {
			t.Errorf("VersionAtLeast(%q, 3, 0) = %v, want %v", c.v, got, c.want)
		}
	}
}
