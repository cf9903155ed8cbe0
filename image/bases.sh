#!/usr/bin/env bash
# Offline HAProxy base images: imports the debootstrap root filesystems that
# integration/hostmatrix/prepare.sh caches under CACHE as
# seamless-base:haproxy-3.0 (trixie) and seamless-base:haproxy-3.2 (forky),
# unless they exist already. No registry is needed.
set -euo pipefail
cache=${1:?usage: bases.sh CACHE}
here=$(cd "$(dirname "$0")" && pwd)
"$here/../integration/hostmatrix/prepare.sh" "$cache" >/dev/null
for pair in trixie:3.0 forky:3.2; do
	suite=${pair%%:*} version=${pair##*:}
	image=seamless-base:haproxy-$version
	if ! docker image inspect "$image" >/dev/null 2>&1; then
		echo "importing $image from $cache/rootfs/$suite"
		tar -C "$cache/rootfs/$suite" -c . | docker import \
			--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			- "$image" >/dev/null
	fi
done
