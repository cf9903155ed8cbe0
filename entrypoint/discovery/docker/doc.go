// Package docker is the discovery source that reads services from the
// labels of the containers on a Docker engine.
//
// # Which containers
//
// Every running container labelled seamless.enable=true (exactly "true")
// is one instance of a service; every other container is ignored. Labels:
//
//	seamless.enable=true                      required: opts the container in
//	seamless.service=web                      the service's name; default: Compose's
//	                                          service (com.docker.compose.service),
//	                                          else the container's name
//	seamless.port=8080                        the port to send traffic to; default: the
//	                                          container's only exposed TCP port
//	seamless.weight=10                        the server weight (1 or more); default:
//	                                          HAProxy's
//	seamless.http.host=a.example,b.example    routes' tag schema: one tag per
//	seamless.http.path=/api,/v2               comma-separated value
//	seamless.tcp.port=5432
//
// With Compose:
//
//	services:
//	  web:
//	    image: shop/web
//	    labels:
//	      seamless.enable: "true"
//	      seamless.http.host: shop.example.com
//	      seamless.port: "8080"
//
// The three labels of the schema become the tags the built-in
// configuration reads (seamless.http.host=a.example and
// seamless.http.host=b.example for the example above); spaces around the
// commas are dropped, so a path cannot contain a comma here. Any other
// label starting with "seamless." that this package does not read is
// passed on as a tag too, so that the renderer reports it as unknown: it
// is usually a typo. Labels are untrusted and carried as they are: whether
// a host, path or name can go into HAProxy's configuration is checked, and
// reported, by the renderer. This package only needs the port and the
// address; a container whose seamless.port is not a port number (1-65535),
// that exposes no TCP port or several without seamless.port, or that has
// no address (below) is left out, and the log says why, once. An invalid
// seamless.weight is ignored, with a log line.
//
// Each instance has Source "docker", ID the container's short ID (12 hex
// digits, as `docker ps` shows), Name the service, Address and Port as
// above, Tags, Weight, and Meta: container (its name), image (as it was
// created from), network (the network of Address) and compose_project
// (when Compose made it). Node and Datacenter are empty and the catalog
// has no nodes: the engine's host name would need GET /info, which a
// read-only socket proxy need not allow, and nothing in seamless reads it.
//
// # Address
//
// The container's IP address on the network Config.Network
// (SEAMLESS_DOCKER_NETWORK) names; without one, on the container's only
// network. A container not on that network, or on several networks when
// none is named, or with no IP address there (network_mode host, none,
// container:...) is left out. IPv4 is preferred; a container with only a
// global IPv6 address on the network gets that. HAProxy must reach that
// address: run seamless on the same network.
//
// # Health
//
// A container without a healthcheck, or whose healthcheck is healthy, is
// passing. While its healthcheck is starting (no check has passed yet) or
// unhealthy it is critical, with a check docker-health saying so, and the
// log says so once: the health filter (passing by default) leaves it out
// of HAProxy until the check passes. A paused container is in maintenance
// (check docker-paused). So is a container being stopped (check
// docker-stopping), from the engine's kill event with SIGTERM, SIGINT,
// SIGQUIT, SIGKILL or its own stop signal until it exits: it still runs
// while it drains, and HAProxy sends it no new request meanwhile, which a
// lossless `docker compose up --scale web=1` needs. One still running
// well past its stop timeout (it ignored a `docker kill -s TERM`) is
// routed again. Containers that are not running are not listed.
//
// # Watching
//
// Run lists the labelled containers (GET /containers/json with the label
// filter, then GET /containers/{id}/json for each) and follows the
// engine's event stream (GET /events) for container start, restart, die,
// stop, kill, pause, unpause, health_status, destroy and rename, and for
// containers joining or leaving the network. Any such event of a labelled
// container triggers a full re-list, after a short settle that lets a
// burst (`docker compose up`) share one; events are never applied one by
// one, so none can be applied out of order. Run subscribes to the events
// before it lists (and again, then lists again, whenever the stream ends),
// so no change falls between the two. Every Config.Rescan (30 s by
// default) every container is listed again anyway, as a backstop for an
// event the stream lost. A re-list costs one request plus one per
// labelled container.
//
// # The engine
//
// The client honours the Docker CLI's variables: DOCKER_HOST (default
// unix:///var/run/docker.sock), DOCKER_API_VERSION, DOCKER_CERT_PATH and
// DOCKER_TLS_VERIFY, and negotiates the API version with the engine (API
// 1.40 or later: Docker 19.03). The source only reads, so a read-only
// socket proxy that lets through GET /_ping, /version, /containers and
// /events suffices; with Tecnativa's docker-socket-proxy that is
// CONTAINERS=1 (events, ping and version are on by default, and POST is
// off):
//
//	DOCKER_HOST=tcp://docker-socket-proxy:2375
//
// Mounting the socket itself read-only (-v
// /var/run/docker.sock:/var/run/docker.sock:ro) does not make the API
// read-only: whoever can connect to it can start containers.
//
// When the engine cannot be reached, or refuses, Run keeps what it sent
// last (it never sends an empty snapshot because a request failed),
// retries with exponential backoff and jitter, up to Config.Rescan, and
// Status reports the error, naming DOCKER_HOST or the socket and what to
// check. When the event stream ends (the engine restarted) Run subscribes
// again and lists everything, since events may have been missed.
package docker
