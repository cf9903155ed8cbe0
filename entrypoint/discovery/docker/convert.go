package docker

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// The labels the source reads. The three of routes' tag schema
// (routes.TagHTTPHost, TagHTTPPath, TagTCPPort; spelled out here so that
// discovery does not depend on the renderer) become tags; the others are
// consumed here.
const (
	LabelEnable  = "seamless.enable"  // "true" opts the container in
	LabelService = "seamless.service" // the service's name
	LabelPort    = "seamless.port"    // the target port
	LabelWeight  = "seamless.weight"  // the server weight

	LabelHTTPHost = "seamless.http.host"
	LabelHTTPPath = "seamless.http.path"
	LabelTCPPort  = "seamless.tcp.port"

	labelPrefix = "seamless."

	// Docker Compose's labels.
	labelComposeService = "com.docker.compose.service"
	labelComposeProject = "com.docker.compose.project"
)

// Meta keys of every instance.
const (
	MetaContainer      = "container"       // the container's name
	MetaImage          = "image"           // the image, as the container was created from it
	MetaNetwork        = "network"         // the network Address is on
	MetaComposeProject = "compose_project" // when Compose created the container
)

// Check IDs of the checks an instance can carry.
const (
	CheckHealth   = "docker-health"   // the container's HEALTHCHECK, when it has one
	CheckPaused   = "docker-paused"   // present while the container is paused
	CheckStopping = "docker-stopping" // present from a stop signal until the container exits
)

// shortIDLen is the length of the IDs `docker ps` shows.
const shortIDLen = 12

func shortID(id string) string {
	if len(id) > shortIDLen {
		return id[:shortIDLen]
	}
	return id
}

// converted is what the source makes of one inspected container: an
// instance, or skip saying why there is none. notes say, for the log, why
// the instance is not passing or which label was ignored; they do not
// change while the container's state does not, so each is logged once.
type converted struct {
	id       string // full
	name     string // the container's name, without the leading "/"
	instance *model.Instance
	skip     string
	// quiet: the container stopped between the list and the inspect; that
	// is not worth a log line (its die event follows).
	quiet bool
	notes []note
}

// note is a log line about a container that is routed.
type note struct {
	warn bool
	msg  string
}

// convert turns one inspected container into an instance of its service.
// network is Config.Network; k is the last signal the engine sent the
// container, if any, and now the time to judge it by. Labels are carried
// as they are (validating them is the renderer's job); convert only needs
// the port and the address to be usable, and never panics on odd input
// (convertSafely makes sure).
func convert(c container.InspectResponse, netName string, k *kill, now time.Time) converted {
	r := converted{id: c.ID, name: strings.TrimPrefix(c.Name, "/")}
	if c.Config == nil || c.State == nil {
		r.skip = "the engine's answer has no configuration or state for it"
		return r
	}
	if !c.State.Running || c.State.Restarting {
		r.skip, r.quiet = fmt.Sprintf("not running (%s)", c.State.Status), true
		return r
	}
	labels := c.Config.Labels

	nw, addr, skip := chooseAddress(c.NetworkSettings, c.HostConfig, netName)
	if skip != "" {
		r.skip = skip
		return r
	}
	port, skip := choosePort(labels, c.Config.ExposedPorts)
	if skip != "" {
		r.skip = skip
		return r
	}

	in := &model.Instance{
		Source:  Name,
		ID:      shortID(c.ID),
		Name:    serviceName(labels, r.name),
		Address: addr,
		Port:    port,
		Tags:    labelTags(labels),
		Meta:    map[string]string{MetaContainer: r.name, MetaImage: c.Config.Image, MetaNetwork: nw},
		Status:  model.StatusPassing,
	}
	if t, err := time.Parse(time.RFC3339Nano, c.Created); err == nil && t.UnixNano() > 0 {
		in.Registered = uint64(t.UnixNano()) // the earliest container keeps a contested route
	}
	if p, ok := labels[labelComposeProject]; ok {
		in.Meta[MetaComposeProject] = p
	}
	if v, ok := labels[LabelWeight]; ok {
		if w, ok := parseWeight(v); ok {
			in.Weight = w
		} else {
			r.notes = append(r.notes, note{warn: true, msg: fmt.Sprintf(
				"label %s=%q ignored: a weight is a whole number of 1 or more; HAProxy's default weight applies", LabelWeight, v)})
		}
	}
	r.notes = append(r.notes, health(c.State, in)...)
	if k != nil && k.stops(c, now) {
		in.Checks = append(in.Checks, model.Check{CheckID: CheckStopping, Name: "Docker stop", Status: model.StatusMaintenance,
			Notes: "the container is stopping (" + signalName(k.signal) + ")", ServiceID: in.ID, ServiceName: in.Name})
		in.Status = worstCheck(in.Checks)
		r.notes = append(r.notes, note{msg: fmt.Sprintf("container stopping (%s); reported in maintenance, so that no new request reaches it while it drains",
			signalName(k.signal))})
	}
	r.instance = in
	return r
}

// convertSafely is convert that turns a panic into a skipped container: a
// bug here must not take PID 1, and HAProxy with it, down.
func convertSafely(c container.InspectResponse, network string, k *kill, now time.Time) (r converted) {
	defer func() {
		if p := recover(); p != nil {
			r = converted{id: c.ID, name: strings.TrimPrefix(c.Name, "/"),
				skip: fmt.Sprintf("reading it failed (%v); please report this with `docker inspect` of the container", p)}
		}
	}()
	return convert(c, network, k, now)
}

// serviceName is the seamless.service label, else Compose's service, else
// the container's name.
func serviceName(labels map[string]string, container string) string {
	if s := labels[LabelService]; s != "" {
		return s
	}
	if s := labels[labelComposeService]; s != "" {
		return s
	}
	return container
}

// chooseAddress picks the network and the container's IP address on it:
// the network named, or else the only one the container is on. IPv4 is
// preferred; an IPv6-only endpoint gives its global IPv6 address.
func chooseAddress(ns *container.NetworkSettings, hc *container.HostConfig, want string) (name, addr, skip string) {
	var nets map[string]*network.EndpointSettings
	if ns != nil {
		nets = ns.Networks
	}
	names := make([]string, 0, len(nets))
	for n := range nets {
		names = append(names, n)
	}
	slices.Sort(names)
	var ep *network.EndpointSettings
	switch {
	case want != "":
		if ep = nets[want]; ep == nil {
			return "", "", fmt.Sprintf("not attached to network %q (SEAMLESS_DOCKER_NETWORK); it is on %s", want, listNames(names))
		}
		name = want
	case len(names) == 1:
		name, ep = names[0], nets[names[0]]
		if ep == nil {
			return "", "", fmt.Sprintf("the engine gives no settings for its network %q", name)
		}
	case len(names) == 0:
		mode := ""
		if hc != nil && hc.NetworkMode != "" {
			mode = fmt.Sprintf(" (network mode %q)", string(hc.NetworkMode))
		}
		return "", "", "attached to no network" + mode + ", so it has no address of its own"
	default:
		return "", "", fmt.Sprintf("attached to several networks (%s): set SEAMLESS_DOCKER_NETWORK to the one seamless reaches containers on",
			listNames(names))
	}
	switch {
	case ep.IPAddress.IsValid() && !ep.IPAddress.IsUnspecified():
		return name, ep.IPAddress.Unmap().String(), ""
	case ep.GlobalIPv6Address.IsValid() && !ep.GlobalIPv6Address.IsUnspecified():
		return name, ep.GlobalIPv6Address.String(), ""
	}
	hint := ""
	if name == "host" {
		hint = " (a container in the host's network has no address of its own)"
	}
	return "", "", fmt.Sprintf("no IP address on network %q%s", name, hint)
}

func listNames(names []string) string {
	if len(names) == 0 {
		return "no network"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// choosePort is the seamless.port label, else the container's only exposed
// TCP port.
func choosePort(labels map[string]string, exposed network.PortSet) (int, string) {
	if v, ok := labels[LabelPort]; ok {
		p, err := strconv.Atoi(v)
		if err != nil || !isDecimal(v) || p < 1 || p > 65535 {
			return 0, fmt.Sprintf("label %s=%q is not a port number (1-65535)", LabelPort, v)
		}
		return p, ""
	}
	var tcp []int
	for p := range exposed {
		if p.Proto() == network.TCP && p.Num() != 0 {
			tcp = append(tcp, int(p.Num()))
		}
	}
	slices.Sort(tcp)
	tcp = slices.Compact(tcp)
	switch len(tcp) {
	case 1:
		return tcp[0], ""
	case 0:
		return 0, fmt.Sprintf("exposes no TCP port: set the label %s to the port it serves on", LabelPort)
	}
	ports := make([]string, len(tcp))
	for i, p := range tcp {
		ports[i] = strconv.Itoa(p)
	}
	return 0, fmt.Sprintf("exposes several TCP ports (%s): choose one with the label %s", strings.Join(ports, ", "), LabelPort)
}

// isDecimal reports whether s is plain decimal digits: no sign, no
// spaces, no leading zero, at most 10 digits.
func isDecimal(s string) bool {
	if s == "" || len(s) > 10 || (len(s) > 1 && s[0] == '0') {
		return false
	}
	return strings.Trim(s, "0123456789") == ""
}

// parseWeight reads seamless.weight: a decimal integer of 1 or more.
// Whether HAProxy takes it (1-256) is for the renderer to say.
func parseWeight(v string) (int, bool) {
	if !isDecimal(v) {
		return 0, false
	}
	w, err := strconv.ParseInt(v, 10, 64)
	if err != nil || w < 1 || w > math.MaxInt32 {
		return 0, false
	}
	return int(w), true
}

// labelTags turns the labels of routes' tag schema into tags, one per
// comma-separated value, in the schema's order; any other label under
// "seamless." that the source does not read itself is passed on as a tag
// too, so that the renderer reports it as unknown (usually a typo). Values
// are carried as they are, only trimmed of the spaces around commas.
func labelTags(labels map[string]string) []string {
	var tags []string
	for _, key := range []string{LabelHTTPHost, LabelHTTPPath, LabelTCPPort} {
		v, ok := labels[key]
		if !ok {
			continue
		}
		n := len(tags)
		for part := range strings.SplitSeq(v, ",") {
			if part = strings.TrimSpace(part); part != "" {
				tags = append(tags, key+"="+part)
			}
		}
		if len(tags) == n { // empty: passed on for the renderer to report
			tags = append(tags, key+"="+v)
		}
	}
	var other []string
	for k, v := range labels {
		if len(k) < len(labelPrefix) || !strings.EqualFold(k[:len(labelPrefix)], labelPrefix) {
			continue
		}
		switch k {
		case LabelEnable, LabelService, LabelPort, LabelWeight, LabelHTTPHost, LabelHTTPPath, LabelTCPPort:
			continue
		}
		other = append(other, k+"="+v)
	}
	slices.Sort(other)
	return append(tags, other...)
}

// health sets the instance's status from the container's state: passing,
// critical while its healthcheck is starting or unhealthy, maintenance
// while it is paused. It returns what the log should say about it.
func health(st *container.State, in *model.Instance) []note {
	var notes []note
	if h := st.Health; h != nil && h.Status != "" && h.Status != container.NoHealthcheck {
		ch := model.Check{CheckID: CheckHealth, Name: "Docker healthcheck", Status: model.StatusPassing,
			ServiceID: in.ID, ServiceName: in.Name}
		switch h.Status {
		case container.Healthy:
		case container.Starting:
			ch.Status, ch.Notes = model.StatusCritical, "starting: no check has passed yet"
			notes = append(notes, note{msg: "container's healthcheck has not passed yet; reported critical until it does"})
		default: // unhealthy, or a state this code does not know
			ch.Status, ch.Notes = model.StatusCritical, string(h.Status)
			notes = append(notes, note{warn: true, msg: fmt.Sprintf("container's healthcheck says %s; reported critical", strconv.Quote(string(h.Status)))})
		}
		in.Checks = append(in.Checks, ch)
	}
	if st.Paused {
		in.Checks = append(in.Checks, model.Check{CheckID: CheckPaused, Name: "Docker pause", Status: model.StatusMaintenance,
			Notes: "the container is paused (docker pause)", ServiceID: in.ID, ServiceName: in.Name})
		notes = append(notes, note{msg: "container paused; reported in maintenance until it is unpaused"})
	}
	in.Status = worstCheck(in.Checks)
	return notes
}

func worstCheck(checks []model.Check) string {
	st := make([]string, len(checks))
	for i, c := range checks {
		st[i] = c.Status
	}
	return model.WorstStatus(st...)
}
