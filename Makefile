# seamless — see README.md. `make demo` runs the demo, `make test` the tests.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
CACHE := $(CURDIR)/.cache

.PHONY: all build deps test test-matrix test-docker image consul consul-template pebble demo demo-reload bench-reload clean \
	image-consul image-demo-backend compose-consul compose-file compose-docker compose-down \
	bench-propagation bench-scale bench-peer bench-tls chaos soak

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/seamless ./cmd/seamless
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/demo-backend ./cmd/demo-backend

# HAProxy 2.6 from Debian for the host tests; the package starts a system
# service that nothing here needs, so it is stopped again. Chromium renders
# the status page in its test.
#
# Another apt run (unattended upgrades, a provisioning script) may hold
# apt's locks: install waits for them up to 10 minutes; `apt-get update`
# ignores that option for its lists lock, so it is retried while, and only
# while, the lock is what fails it.
APT_WAIT := 600
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=$(APT_WAIT) install -y -qq
APT_UPDATE := ok=; for i in $$(seq $$(($(APT_WAIT) / 2))); do \
		if out=$$(apt-get update -qq 2>&1); then ok=1; break; fi; \
		case $$out in *"Could not get lock"*) [ $$i != 1 ] || echo "waiting for another apt run to finish"; sleep 2;; \
		*) break;; esac; \
	done; [ -n "$$ok" ] || { echo "$$out" >&2; exit 1; }
deps:
	@if ! command -v haproxy >/dev/null; then \
		echo "installing haproxy"; \
		$(APT_UPDATE); $(APT_INSTALL) haproxy >/dev/null || exit 1; \
		service haproxy stop >/dev/null 2>&1 || systemctl stop haproxy >/dev/null 2>&1 || true; \
	fi
	@if ! command -v chromium >/dev/null; then \
		echo "installing chromium"; \
		$(APT_UPDATE); $(APT_INSTALL) chromium >/dev/null || exit 1; \
	fi
	@haproxy -v | head -1

# What the tests need and take long to make (root filesystems with newer
# HAProxy versions, the Consul agent) is cached here, outside the
# checkout, and rebuilt when missing.
TEST_CACHE ?= /var/cache/seamless
CONSUL_VERSION := 1.14.11
CONSUL := $(TEST_CACHE)/consul/consul-$(CONSUL_VERSION)
CONSUL_TEMPLATE_VERSION := 0.41.1
CONSUL_TEMPLATE := $(TEST_CACHE)/consul-template/consul-template-$(CONSUL_TEMPLATE_VERSION)
PEBBLE_VERSION := 2.10.3
PEBBLE := $(TEST_CACHE)/pebble/pebble-$(PEBBLE_VERSION)
CHALLTESTSRV := $(TEST_CACHE)/pebble/pebble-challtestsrv-$(PEBBLE_VERSION)
MATRIX ?= 3.0 3.2

test: deps $(CONSUL) $(CONSUL_TEMPLATE) $(PEBBLE) $(CHALLTESTSRV)
	$(GO) vet ./...
	SEAMLESS_CONSUL_BIN=$(CONSUL) SEAMLESS_CONSUL_TEMPLATE_BIN=$(CONSUL_TEMPLATE) \
		SEAMLESS_PEBBLE_BIN=$(PEBBLE) SEAMLESS_CHALLTESTSRV_BIN=$(CHALLTESTSRV) $(GO) test -p 1 -count=1 -timeout 30m ./...
	$(MAKE) test-matrix
	$(MAKE) test-docker chaos

# The supervisor, master-CLI and certificate runtime-API tests again
# against HAProxy 3.0 (trixie) and 3.2 (forky), whose master CLI answers
# reloads differently from 2.6.
test-matrix:
	integration/hostmatrix/prepare.sh $(TEST_CACHE)
	@set -e; for v in $(MATRIX); do \
		echo "== HAProxy $$v"; \
		SEAMLESS_HAPROXY_BIN=$(TEST_CACHE)/bin/haproxy-$$v \
			$(GO) test -count=1 -timeout 15m ./cmd/seamless ./entrypoint/haproxy ./entrypoint/certs; \
	done

# HAProxy with the demo config and three demo backends, on 127.0.0.1:
# http://127.0.0.1:5001 (the service), http://127.0.0.1:8404/haproxy?stats,
# http://127.0.0.1:8405/metrics (seamless). Ctrl-C drains and stops
# (demo/run.sh says how; demo/demo_test.go presses it in a terminal).
demo: deps build
	@demo/run.sh

# Images for every HAProxy in the matrix, built offline: the base is a
# debootstrap root filesystem (image/bases.sh) and the binary is the host's.
# With a registry, `docker build -f image/Dockerfile .` uses the official
# haproxy and golang images instead.
IMAGE ?= seamless
image: build
	image/bases.sh $(TEST_CACHE)
	@set -e; for v in $(MATRIX); do \
		echo "== $(IMAGE):haproxy-$$v"; \
		$(call docker_build,$(IMAGE):haproxy-$$v,-f image/Dockerfile \
			--build-arg HAPROXY_IMAGE=seamless-base:haproxy-$$v \
			--build-arg BUILDER=seamless-base:haproxy-$$v \
			--build-arg PREBUILT=bin/seamless --build-arg VERSION=$(VERSION) .); \
	done

# $(call docker_build,TAG,ARGS): docker build that leaves no dangling image
# behind (the legacy builder left two per image, 226-271 MB each): the
# build stage, labelled seamless.build-run with a value of this run's own,
# is pruned by that label; the image TAG named before is removed unless a
# container or another tag still uses it. Nothing else is touched.
define docker_build
old=$$(docker image inspect -f '{{.Id}}' $(1) 2>/dev/null || true); \
run=$$(date +%s%N)-$$$$; \
if docker build -q -t $(1) --build-arg BUILD_RUN=$$run $(2); then ok=1; else ok=; fi; \
docker image prune -f --filter label=seamless.build-run=$$run >/dev/null; \
[ -n "$$ok" ] || exit 1; \
new=$$(docker image inspect -f '{{.Id}}' $(1)); \
if [ -n "$$old" ] && [ "$$old" != "$$new" ]; then docker rmi "$$old" >/dev/null 2>&1 || true; fi
endef

# The image on the real Docker engine: docker kill -s HUP under load,
# docker stop during a request, for every HAProxy of the matrix; the
# compose examples scaled under load; the Docker label source.
test-docker: image image-consul image-demo-backend
	SEAMLESS_IMAGES="$(foreach v,$(MATRIX),$(IMAGE):haproxy-$(v))" $(COMPOSE_ENV) \
		$(GO) test -tags docker -count=1 -timeout 20m ./integration/ ./entrypoint/discovery/docker/

# A fleet on a real Consul cluster under faults (integration/chaos): 3
# servers, 3 client agents, a replica beside each agent, load through every
# replica while the leader is killed, an agent is cut off, a replica is
# killed. Its own networks and containers, removed when it ends.
chaos: image image-consul image-demo-backend
	$(COMPOSE_ENV) $(GO) test -tags docker -count=1 -v -timeout 15m ./integration/chaos/

# Compose: `docker compose` (v2) when the Docker CLI has it, else Debian's
# docker-compose (v1).
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo 'docker compose' || echo docker-compose)
CONSUL_IMAGE ?= seamless-consul:$(CONSUL_VERSION)
DEMO_BACKEND_IMAGE ?= seamless-demo-backend
# The build stage of the offline builds below: a local base with a shell.
LOCAL_BASE := seamless-base:haproxy-$(lastword $(MATRIX))
COMPOSE_ENV = SEAMLESS_IMAGE=$(IMAGE):haproxy-$(lastword $(MATRIX)) \
	CONSUL_IMAGE=$(CONSUL_IMAGE) DEMO_BACKEND_IMAGE=$(DEMO_BACKEND_IMAGE)

# The Consul agent `make consul` built, as an image FROM scratch (with a
# registry, the compose examples use hashicorp/consul:1.14 instead).
image-consul: $(CONSUL)
	image/bases.sh $(TEST_CACHE)
	@$(call docker_build,$(CONSUL_IMAGE),-f image/consul.Dockerfile \
		--build-arg BUILDER=$(LOCAL_BASE) \
		--build-arg CONSUL_BIN=$(notdir $(CONSUL)) $(dir $(CONSUL)))

# The demo backend FROM scratch, from the host's static bin/demo-backend.
image-demo-backend: build
	image/bases.sh $(TEST_CACHE)
	@$(call docker_build,$(DEMO_BACKEND_IMAGE),-f cmd/demo-backend/Dockerfile \
		--build-arg BUILDER=$(LOCAL_BASE) --build-arg PREBUILT=bin/demo-backend .)

# The compose examples with the local images (compose/README.md), on
# 127.0.0.1: consul 5001/8404/8405 (+8500), file 5002/8406/8407,
# docker 5003/8408/8409. `make compose-down` removes them.
compose-consul: image image-consul image-demo-backend
	cd compose/consul && $(COMPOSE_ENV) $(COMPOSE) up -d --no-build
compose-file: image image-demo-backend
	cd compose/file && $(COMPOSE_ENV) $(COMPOSE) up -d --no-build
compose-docker: image image-demo-backend
	cd compose/docker && DOCKER_GID=$$(stat -c %g /var/run/docker.sock) $(COMPOSE_ENV) $(COMPOSE) up -d --no-build
compose-down:
	@for d in consul file docker; do \
		(cd compose/$$d && DOCKER_GID=$$(stat -c %g /var/run/docker.sock) $(COMPOSE_ENV) $(COMPOSE) down -v); \
	done

# The Consul agent for the discovery tests, built from the module proxy by
# a tool module of its own (about 6 minutes on 2 cores, once).
consul: $(CONSUL)
$(CONSUL):
	@mkdir -p $(dir $@)
	cd tools/consul && CGO_ENABLED=0 $(GO) build -trimpath -o $@.tmp github.com/hashicorp/consul && mv $@.tmp $@

# consul-template itself, which the compatibility tests render the same
# templates with (integration/ctcompat); a tool module of its own too.
consul-template: $(CONSUL_TEMPLATE)
$(CONSUL_TEMPLATE):
	@mkdir -p $(dir $@)
	cd tools/consul-template && CGO_ENABLED=0 $(GO) build -trimpath -o $@.tmp github.com/hashicorp/consul-template && mv $@.tmp $@

# Pebble, Let's Encrypt's ACME test server, and its challenge test server
# (DNS answering 127.0.0.1 for every name), which the ACME tests obtain
# certificates from (entrypoint/certs); a tool module of its own too.
pebble: $(PEBBLE) $(CHALLTESTSRV)
$(PEBBLE):
	@mkdir -p $(dir $@)
	cd tools/pebble && CGO_ENABLED=0 $(GO) build -trimpath -o $@.tmp github.com/letsencrypt/pebble/v2/cmd/pebble && mv $@.tmp $@
$(CHALLTESTSRV):
	@mkdir -p $(dir $@)
	cd tools/pebble && CGO_ENABLED=0 $(GO) build -trimpath -o $@.tmp github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv && mv $@.tmp $@

# Validated, lossless reload of the running demo (edit demo/haproxy.cfg first).
demo-reload:
	kill -HUP $$(cat $(CACHE)/demo.pid)

# Reload benchmark: seamless vs plain -W vs the -sf script vs a restart.
BENCH_FLAGS ?=
bench-reload: deps build
	$(GO) run ./cmd/seamless-bench reload -seamless bin/seamless $(BENCH_FLAGS)

# Discovery benchmarks with a real Consul: from a registration or health
# change to the first request served accordingly (runtime API and reload,
# wait default and 0); and 100 / 1,000 services × 10 instances (render,
# haproxy -c, apply, RSS, Consul requests per change).
bench-propagation: deps build $(CONSUL)
	$(GO) run ./cmd/seamless-bench propagation -seamless bin/seamless -consul $(CONSUL) $(BENCH_FLAGS)
bench-scale: deps build $(CONSUL)
	$(GO) run ./cmd/seamless-bench scale -seamless bin/seamless -consul $(CONSUL) $(BENCH_FLAGS)

# seamless side by side with consul-template: 100 and 1,000 services × 10,
# 40 single-instance changes, each tool alone (BENCH_FLAGS=-together: all
# at once): change → rendered file (and served), Consul bytes, requests and
# CPU per change through a counting proxy per tool, RSS.
bench-peer: deps build $(CONSUL) $(CONSUL_TEMPLATE)
	$(GO) run ./cmd/seamless-bench peer -seamless bin/seamless -consul $(CONSUL) \
		-consul-template $(CONSUL_TEMPLATE) $(BENCH_FLAGS)

# HTTPS through the built-in HTTPS frontend (host HAProxy): new TLS
# handshakes and keep-alive requests with no rotation, a certificate
# rotated every second over the runtime API, and the same plus a reload per
# rotation (a certbot deploy hook), side by side.
bench-tls: deps build
	$(GO) run ./cmd/seamless-bench tls -seamless bin/seamless $(BENCH_FLAGS)

# Soak (not in make test): one seamless, HAProxy 2.6 and a `consul agent
# -dev` on 127.0.0.1 under seeded churn for DURATION (registrations, whole
# services with new names, health flaps, template edits with HUP, Consul
# restarted empty, service files written and removed) with a paced load to
# services that never change. A table of RSS, goroutines, fds, HAProxy
# processes and failed requests per minute with their slopes; fails on a
# failed request or a final configuration other than a fresh render's.
DURATION ?= 10m
soak: deps build $(CONSUL)
	$(GO) run ./cmd/seamless-bench soak -seamless bin/seamless -consul $(CONSUL) -duration $(DURATION) $(BENCH_FLAGS)

clean:
	rm -rf bin $(CACHE)
