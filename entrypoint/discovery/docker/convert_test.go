package docker

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

const testID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// inspected is `docker inspect` of a running container named shop-web-1,
// labelled seamless.enable=true plus labels (label=value pairs), exposing
// 8080/tcp and on the network shop at 172.18.0.5.
func inspected(labels ...string) container.InspectResponse {
	l := map[string]string{LabelEnable: "true"}
	for _, kv := range labels {
		k, v, _ := strings.Cut(kv, "=")
		l[k] = v
	}
	return container.InspectResponse{
		ID:    testID,
		Name:  "/shop-web-1",
		State: &container.State{Status: container.StateRunning, Running: true},
		Config: &container.Config{
			Image:        "shop/web:1.2",
			Labels:       l,
			ExposedPorts: network.PortSet{network.MustParsePort("8080/tcp"): {}},
		},
		HostConfig: &container.HostConfig{NetworkMode: "shop"},
		NetworkSettings: &container.NetworkSettings{Networks: map[string]*network.EndpointSettings{
			"shop": {IPAddress: netip.MustParseAddr("172.18.0.5")},
		}},
	}
}

func ports(specs ...string) network.PortSet {
	ps := network.PortSet{}
	for _, s := range specs {
		ps[network.MustParsePort(s)] = struct{}{}
	}
	return ps
}

func TestConvert(t *testing.T) {
	base := model.Instance{
		Source: "docker", ID: "0123456789ab", Name: "shop-web-1", Address: "172.18.0.5", Port: 8080,
		Meta:   map[string]string{"container": "shop-web-1", "image": "shop/web:1.2", "network": "shop"},
		Status: model.StatusPassing,
	}
	with := func(f func(*model.Instance)) *model.Instance {
		in := base
		in.Meta = map[string]string{}
		for k, v := range base.Meta {
			in.Meta[k] = v
		}
		f(&in)
		return &in
	}
	healthCheck := func(status, notes string) model.Check {
		return model.Check{CheckID: CheckHealth, Name: "Docker healthcheck", Status: status, Notes: notes,
			ServiceID: "0123456789ab", ServiceName: "shop-web-1"}
	}
	for _, tc := range []struct {
		name    string
		c       container.InspectResponse
		network string
		want    *model.Instance
		skip    string // a part of the reason it is left out
		note    string // a part of a note for the log
	}{
		{name: "only the enable label: the container's name, its only port and network", c: inspected(), want: &base},
		{
			name: "routes' labels become one tag per comma-separated value, trimmed",
			c: inspected("seamless.http.host=a.example, b.example,", "seamless.http.path=/api,/v2",
				"seamless.tcp.port=5432"),
			want: with(func(in *model.Instance) {
				in.Tags = []string{"seamless.http.host=a.example", "seamless.http.host=b.example",
					"seamless.http.path=/api", "seamless.http.path=/v2", "seamless.tcp.port=5432"}
			}),
		},
		{
			name: "values are carried as they are, for the renderer to judge",
			c:    inspected("seamless.http.host=Bad Host!\n", "seamless.http.path=no-slash"),
			want: with(func(in *model.Instance) {
				in.Tags = []string{"seamless.http.host=Bad Host!", "seamless.http.path=no-slash"}
			}),
		},
		{
			name: "an empty routes label is passed on for the renderer to report",
			c:    inspected("seamless.http.host="),
			want: with(func(in *model.Instance) { in.Tags = []string{"seamless.http.host="} }),
		},
		{
			name: "unknown seamless labels become tags, so the renderer reports the typo; other labels do not",
			c:    inspected("seamless.http.hots=a.example", "Seamless.Tcp.Port=1", "com.example.team=shop", "seamlessly=1"),
			want: with(func(in *model.Instance) {
				in.Tags = []string{"Seamless.Tcp.Port=1", "seamless.http.hots=a.example"}
			}),
		},
		{
			name: "the labels the source reads are not tags",
			c:    inspected("seamless.service=web", "seamless.port=8080", "seamless.weight=5"),
			want: with(func(in *model.Instance) { in.Name, in.Weight = "web", 5 }),
		},
		{
			name: "Compose's service and project",
			c:    inspected("com.docker.compose.service=web", "com.docker.compose.project=shop"),
			want: with(func(in *model.Instance) { in.Name, in.Meta["compose_project"] = "web", "shop" }),
		},
		{
			name: "seamless.service wins over Compose's service",
			c:    inspected("com.docker.compose.service=web", "seamless.service=shop-web"),
			want: with(func(in *model.Instance) { in.Name = "shop-web" }),
		},
		{
			name: "an empty seamless.service falls back",
			c:    inspected("seamless.service="),
			want: &base,
		},
		{
			name: "seamless.port picks one of several exposed ports",
			c: func() container.InspectResponse {
				c := inspected("seamless.port=9090")
				c.Config.ExposedPorts = ports("8080/tcp", "9090/tcp")
				return c
			}(),
			want: with(func(in *model.Instance) { in.Port = 9090 }),
		},
		{
			name: "seamless.port need not be exposed",
			c: func() container.InspectResponse {
				c := inspected("seamless.port=3000")
				c.Config.ExposedPorts = nil
				return c
			}(),
			want: with(func(in *model.Instance) { in.Port = 3000 }),
		},
		{
			name: "UDP ports do not count",
			c: func() container.InspectResponse {
				c := inspected()
				c.Config.ExposedPorts = ports("8080/tcp", "53/udp")
				return c
			}(),
			want: &base,
		},
		{
			name: "several exposed ports and no seamless.port",
			c: func() container.InspectResponse {
				c := inspected()
				c.Config.ExposedPorts = ports("8080/tcp", "443/tcp")
				return c
			}(),
			skip: "exposes several TCP ports (443, 8080): choose one with the label seamless.port",
		},
		{
			name: "no exposed port",
			c: func() container.InspectResponse {
				c := inspected()
				c.Config.ExposedPorts = ports("53/udp")
				return c
			}(),
			skip: "exposes no TCP port: set the label seamless.port",
		},
		{name: "seamless.port not a number", c: inspected("seamless.port=http"), skip: `label seamless.port="http" is not a port number`},
		{name: "seamless.port 0", c: inspected("seamless.port=0"), skip: "is not a port number"},
		{name: "seamless.port too large", c: inspected("seamless.port=65536"), skip: "is not a port number"},
		{name: "seamless.port with a sign", c: inspected("seamless.port=+80"), skip: "is not a port number"},
		{name: "seamless.port with a space", c: inspected("seamless.port= 80"), skip: "is not a port number"},
		{name: "seamless.port with a leading zero", c: inspected("seamless.port=080"), skip: "is not a port number"},
		{name: "seamless.port empty", c: inspected("seamless.port="), skip: "is not a port number"},
		{
			name: "an invalid weight is ignored, with a note",
			c:    inspected("seamless.weight=0"),
			want: &base,
			note: `label seamless.weight="0" ignored`,
		},
		{name: "a weight that is not a number", c: inspected("seamless.weight=heavy"), want: &base, note: "ignored"},
		{name: "a negative weight", c: inspected("seamless.weight=-1"), want: &base, note: "ignored"},
		{name: "a weight too large for an int32", c: inspected("seamless.weight=99999999999"), want: &base, note: "ignored"},
		{
			name: "a weight HAProxy refuses is for the renderer to report",
			c:    inspected("seamless.weight=1000"),
			want: with(func(in *model.Instance) { in.Weight = 1000 }),
		},
		{
			name:    "the configured network, among several",
			c:       onNetworks(inspected(), "shop", "other"),
			network: "shop",
			want:    &base,
		},
		{
			name:    "not on the configured network",
			c:       onNetworks(inspected(), "other", "more"),
			network: "shop",
			skip:    `not attached to network "shop" (SEAMLESS_DOCKER_NETWORK); it is on "more", "other"`,
		},
		{
			name: "several networks and none configured",
			c:    onNetworks(inspected(), "shop", "other"),
			skip: `attached to several networks ("other", "shop"): set SEAMLESS_DOCKER_NETWORK`,
		},
		{
			name: "no network",
			c: func() container.InspectResponse {
				c := inspected()
				c.HostConfig.NetworkMode = "none"
				c.NetworkSettings.Networks = nil
				return c
			}(),
			skip: `attached to no network (network mode "none")`,
		},
		{
			name: "no network settings at all",
			c: func() container.InspectResponse {
				c := inspected()
				c.NetworkSettings, c.HostConfig = nil, nil
				return c
			}(),
			skip: "attached to no network, so it has no address",
		},
		{
			name: "the host's network",
			c: func() container.InspectResponse {
				c := inspected()
				c.NetworkSettings.Networks = map[string]*network.EndpointSettings{"host": {}}
				return c
			}(),
			skip: `no IP address on network "host" (a container in the host's network has no address of its own)`,
		},
		{
			name: "a network without settings",
			c: func() container.InspectResponse {
				c := inspected()
				c.NetworkSettings.Networks = map[string]*network.EndpointSettings{"shop": nil}
				return c
			}(),
			network: "shop",
			skip:    `not attached to network "shop"`,
		},
		{
			name: "an IPv6-only network",
			c: func() container.InspectResponse {
				c := inspected()
				c.NetworkSettings.Networks["shop"] = &network.EndpointSettings{GlobalIPv6Address: netip.MustParseAddr("fd00::5")}
				return c
			}(),
			want: with(func(in *model.Instance) { in.Address = "fd00::5" }),
		},
		{
			name: "a healthcheck that has not passed yet: critical",
			c:    withHealth(inspected(), container.Starting),
			want: with(func(in *model.Instance) {
				in.Status = model.StatusCritical
				in.Checks = []model.Check{healthCheck(model.StatusCritical, "starting: no check has passed yet")}
			}),
			note: "container's healthcheck has not passed yet; reported critical",
		},
		{
			name: "an unhealthy container: critical",
			c:    withHealth(inspected(), container.Unhealthy),
			want: with(func(in *model.Instance) {
				in.Status = model.StatusCritical
				in.Checks = []model.Check{healthCheck(model.StatusCritical, "unhealthy")}
			}),
			note: `container's healthcheck says "unhealthy"; reported critical`,
		},
		{
			name: "a healthy container: passing, with its check",
			c:    withHealth(inspected(), container.Healthy),
			want: with(func(in *model.Instance) { in.Checks = []model.Check{healthCheck(model.StatusPassing, "")} }),
		},
		{
			name: "no healthcheck",
			c:    withHealth(inspected(), container.NoHealthcheck),
			want: &base,
		},
		{
			name: "paused: maintenance, over any health",
			c: func() container.InspectResponse {
				c := withHealth(inspected(), container.Unhealthy)
				c.State.Paused, c.State.Status = true, container.StatePaused
				return c
			}(),
			want: with(func(in *model.Instance) {
				in.Status = model.StatusMaintenance
				in.Checks = []model.Check{healthCheck(model.StatusCritical, "unhealthy"), {
					CheckID: CheckPaused, Name: "Docker pause", Status: model.StatusMaintenance,
					Notes: "the container is paused (docker pause)", ServiceID: "0123456789ab", ServiceName: "shop-web-1",
				}}
			}),
			note: "container paused; reported in maintenance",
		},
		{
			name: "stopped since the list",
			c: func() container.InspectResponse {
				c := inspected()
				c.State = &container.State{Status: container.StateExited}
				return c
			}(),
			skip: "not running (exited)",
		},
		{
			name: "restarting",
			c: func() container.InspectResponse {
				c := inspected()
				c.State.Restarting = true
				return c
			}(),
			skip: "not running",
		},
		{
			name: "an answer without a configuration",
			c:    container.InspectResponse{ID: "abc", Name: "/x", State: &container.State{Running: true}},
			skip: "no configuration or state",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := convertSafely(tc.c, tc.network, nil, time.Time{})
			if r.id != tc.c.ID || r.name != strings.TrimPrefix(tc.c.Name, "/") {
				t.Errorf("id %q, name %q", r.id, r.name)
			}
			switch {
			case tc.skip != "":
				if r.instance != nil || !strings.Contains(r.skip, tc.skip) {
					t.Fatalf("got instance %+v, skip %q; want left out for %q", r.instance, r.skip, tc.skip)
				}
			case r.instance == nil:
				t.Fatalf("left out: %s", r.skip)
			case !reflect.DeepEqual(r.instance, tc.want):
				t.Errorf("got  %+v\nwant %+v", *r.instance, *tc.want)
			}
			var notes []string
			for _, n := range r.notes {
				notes = append(notes, n.msg)
			}
			if got := strings.Join(notes, "; "); tc.note == "" && got != "" || !strings.Contains(got, tc.note) {
				t.Errorf("notes %q, want %q", got, tc.note)
			}
		})
	}
}

func onNetworks(c container.InspectResponse, names ...string) container.InspectResponse {
	c.NetworkSettings.Networks = map[string]*network.EndpointSettings{}
	for i, n := range names {
		c.NetworkSettings.Networks[n] = &network.EndpointSettings{IPAddress: netip.AddrFrom4([4]byte{172, 18, byte(i), 5})}
	}
	return c
}

func withHealth(c container.InspectResponse, s container.HealthStatus) container.InspectResponse {
	c.State.Health = &container.Health{Status: s, FailingStreak: 3}
	return c
}

func TestShortID(t *testing.T) {
	for id, want := range map[string]string{testID: "0123456789ab", "abc": "abc", "": ""} {
		if got := shortID(id); got != want {
			t.Errorf("shortID(%q) = %q", id, got)
		}
	}
}

// Whatever the labels, convert does not panic, and an instance it makes
// has a usable port.
func FuzzConvert(f *testing.F) {
	f.Add("seamless.http.host", "a.example,b.example", "8080", "web", "5")
	f.Add("seamless.http.path", ",,,", "", "", "")
	f.Add("Seamless.", "=", "0x50", "\x00", "-1")
	f.Fuzz(func(t *testing.T, key, value, port, service, weight string) {
		c := inspected()
		c.Config.Labels[key] = value
		c.Config.Labels[LabelPort] = port
		c.Config.Labels[LabelService] = service
		c.Config.Labels[LabelWeight] = weight
		r := convert(c, "", nil, time.Now())
		if r.instance == nil {
			if r.skip == "" {
				t.Fatal("left out without a reason")
			}
			return
		}
		if r.instance.Port < 1 || r.instance.Port > 65535 || r.instance.Weight < 0 {
			t.Fatalf("port %d, weight %d", r.instance.Port, r.instance.Weight)
		}
	})
}
