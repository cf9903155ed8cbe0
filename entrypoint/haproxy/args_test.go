package haproxy

import (
	"reflect"
	"slices"
	"testing"
)

func TestParseCommandLine(t *testing.T) {
	const sock = "/run/seamless/master.sock"
	tests := []struct {
		name    string
		args    []string
		want    []string
		socket  string
		files   []string
		dropped []string
	}{
		{
			name:   "official image CMD gets master-worker, foreground and a master socket",
			args:   []string{"-f", "/usr/local/etc/haproxy/haproxy.cfg"},
			want:   []string{"-f", "/usr/local/etc/haproxy/haproxy.cfg"},
			socket: sock + ",mode,600",
			files:  []string{"/usr/local/etc/haproxy/haproxy.cfg"},
		},
		{
			name:   "flags seamless adds anyway are not doubled",
			args:   []string{"-W", "-db", "-f", "a.cfg", "-Ws"},
			want:   []string{"-f", "a.cfg"},
			socket: sock + ",mode,600",
			files:  []string{"a.cfg"},
		},
		{
			name:   "the user's master socket is kept",
			args:   []string{"-S", "/tmp/m.sock,level,admin", "-f", "a.cfg"},
			want:   []string{"-f", "a.cfg"},
			socket: "/tmp/m.sock,level,admin",
			files:  []string{"a.cfg"},
		},
		{
			name:    "daemon mode and old pids are dropped",
			args:    []string{"-D", "-f", "a.cfg", "-sf", "12", "34", "-q", "-x", "/x.sock"},
			want:    []string{"-f", "a.cfg", "-q"},
			socket:  sock + ",mode,600",
			files:   []string{"a.cfg"},
			dropped: []string{"-D", "-sf", "12", "34", "-x", "/x.sock"},
		},
		{
			name:   "files after -- are configuration files too",
			args:   []string{"-f", "a.cfg", "--", "b.cfg", "c.cfg"},
			want:   []string{"-f", "a.cfg", "--", "b.cfg", "c.cfg"},
			socket: sock + ",mode,600",
			files:  []string{"a.cfg", "b.cfg", "c.cfg"},
		},
		{
			name:   "relative files resolve against -C, in order, directories too",
			args:   []string{"-C", "/etc/hap", "-f", "a.cfg", "-f", "/abs/conf.d", "-L", "peer1"},
			want:   []string{"-C", "/etc/hap", "-f", "a.cfg", "-f", "/abs/conf.d", "-L", "peer1"},
			socket: sock + ",mode,600",
			files:  []string{"/etc/hap/a.cfg", "/abs/conf.d"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, err := ParseCommandLine(tt.args, sock)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cl.Args, tt.want) {
				t.Errorf("Args = %q, want %q", cl.Args, tt.want)
			}
			if cl.MasterSocket != tt.socket {
				t.Errorf("MasterSocket = %q, want %q", cl.MasterSocket, tt.socket)
			}
			if !reflect.DeepEqual(cl.ConfigFiles, tt.files) {
				t.Errorf("ConfigFiles = %q, want %q", cl.ConfigFiles, tt.files)
			}
			if !reflect.DeepEqual(cl.Dropped, tt.dropped) {
				t.Errorf("Dropped = %q, want %q", cl.Dropped, tt.dropped)
			}
		})
	}
}

func TestParseCommandLineMissingValue(t *testing.T) {
	if _, err := ParseCommandLine([]string{"-f"}, "/s"); err == nil {
		t.Fatal("a -f without a file was accepted")
	}
}

func TestRunAndCheckArgs(t *testing.T) {
	cl, err := ParseCommandLine([]string{"-f", "a.cfg"}, "/s")
	if err != nil {
		t.Fatal(err)
	}
	run := cl.RunArgs("-f", "/run/defaults.cfg")
	want := []string{"-W", "-db", "-S", "/s,mode,600", "-f", "/run/defaults.cfg", "-f", "a.cfg"}
	if !reflect.DeepEqual(run, want) {
		t.Errorf("RunArgs = %q, want %q", run, want)
	}
	chk := cl.CheckArgs("-f", "/run/defaults.cfg")
	want = []string{"-c", "-W", "-f", "/run/defaults.cfg", "-f", "a.cfg"}
	if !reflect.DeepEqual(chk, want) {
		t.Errorf("CheckArgs = %q, want %q", chk, want)
	}
}

func TestMasterAddr(t *testing.T) {
	tests := []struct{ in, network, addr string }{
		{"/run/m.sock,mode,600", "unix", "/run/m.sock"},
		{"unix@/run/m.sock", "unix", "/run/m.sock"},
		{"ipv4@127.0.0.1:9999,level,admin", "tcp4", "127.0.0.1:9999"},
		{"127.0.0.1:9999", "tcp", "127.0.0.1:9999"},
	}
	for _, tt := range tests {
		n, a := MasterAddr(tt.in)
		if n != tt.network || a != tt.addr {
			t.Errorf("MasterAddr(%q) = %s %s, want %s %s", tt.in, n, a, tt.network, tt.addr)
		}
	}
}

func TestWithConfigReplacesEveryConfigFile(t *testing.T) {
	cl, err := ParseCommandLine([]string{"-f", "a.cfg", "-L", "me", "-f", "b.cfg", "--", "c.cfg"}, "/run/m.sock")
	if err != nil {
		t.Fatal(err)
	}
	got := cl.WithConfig("/state/haproxy.cfg")
	if want := []string{"-L", "me", "-f", "/state/haproxy.cfg"}; !slices.Equal(got.Args, want) {
		t.Errorf("Args %q, want %q", got.Args, want)
	}
	if !slices.Equal(got.ConfigFiles, []string{"/state/haproxy.cfg"}) || len(cl.ConfigFiles) != 3 {
		t.Errorf("ConfigFiles %q (original %q)", got.ConfigFiles, cl.ConfigFiles)
	}
}
