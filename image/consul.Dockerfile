# A Consul agent image built from a static consul binary, for machines
# without a registry (with one, use the official hashicorp/consul:1.14).
#
#   make image-consul    # seamless-consul:1.14.11 from the binary `make consul` built
#   docker build -f image/consul.Dockerfile -t seamless-consul:1.14.11 \
#       --build-arg CONSUL_BIN=consul-1.14.11 /var/cache/seamless/consul
#
# The build context is the directory holding the binary; CONSUL_BIN is its
# name there. BUILDER only lays out the directories (any image with a
# shell: offline, a local debootstrap base). Like the official image, the
# entrypoint is consul and the command a dev agent reachable from other
# containers; unlike it, there is no entrypoint script, so give every
# argument ("agent -server -data-dir=/consul/data ..." for a real one).
ARG BUILDER=busybox:1.36

FROM ${BUILDER} AS dirs
RUN mkdir -p /out/consul/data /out/consul/config /out/tmp \
    && chown 100:1000 /out/consul/data /out/consul/config \
    && chmod 1777 /out/tmp
# The legacy builder keeps this stage as an untagged image; `make` prunes
# it by this label (see docker_build in the Makefile).
ARG BUILD_RUN=
LABEL seamless.build-run=${BUILD_RUN}

FROM scratch
ARG CONSUL_BIN=consul
COPY --from=dirs /out/ /
COPY ${CONSUL_BIN} /bin/consul
# The official image's consul user (uid 100, gid 1000).
USER 100:1000
ENV PATH=/bin
EXPOSE 8300 8301 8301/udp 8302 8302/udp 8500 8600 8600/udp
VOLUME /consul/data
ENTRYPOINT ["consul"]
CMD ["agent", "-dev", "-client", "0.0.0.0"]
