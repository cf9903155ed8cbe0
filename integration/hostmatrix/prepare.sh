#!/usr/bin/env bash
# Prepares newer HAProxy versions for the host test matrix, without Docker:
# a minimal Debian root filesystem per suite (debootstrap, with the haproxy
# package), cached under CACHE and reused, plus a wrapper per version that
# runs that HAProxy on this host's paths (see haproxy-in).
#
#   prepare.sh CACHE      -> CACHE/bin/haproxy-3.0 (trixie), CACHE/bin/haproxy-3.2 (forky)
set -euo pipefail
cache=${1:?usage: prepare.sh CACHE}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$cache/rootfs" "$cache/bin"

if ! command -v debootstrap >/dev/null; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

# The archive this machine's apt already uses (deb822 or one-line format).
mirror=$(grep -hoE '^URIs:[[:space:]]+[^[:space:]]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
if [ -z "$mirror" ]; then
	mirror=$(grep -hoE '^deb[[:space:]]+[^[:space:]]+' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -1 || true)
fi
[ -n "$mirror" ] || { echo "prepare.sh: no Debian archive found in the apt sources" >&2; exit 1; }

# suite  version  debootstrap script (bookworm's debootstrap has no forky script;
# sid's works for it)
while read -r suite version script; do
	root="$cache/rootfs/$suite"
	if [ ! -x "$root/usr/sbin/haproxy" ]; then
		echo "building $suite root filesystem (HAProxy $version)"
		rm -rf "$root.tmp"
		for try in 1 2; do
			if debootstrap --variant=minbase --include=haproxy "$suite" "$root.tmp" "$mirror" \
				"/usr/share/debootstrap/scripts/$script" >"$cache/rootfs/$suite.log" 2>&1; then
				break
			fi
			[ "$try" = 2 ] && { tail -20 "$cache/rootfs/$suite.log" >&2; exit 1; }
			rm -rf "$root.tmp"
		done
		rm -rf "$root" && mv "$root.tmp" "$root"
	fi
	printf '#!/bin/sh\nexec %s %s "$@"\n' "$here/haproxy-in" "$root" >"$cache/bin/haproxy-$version"
	chmod +x "$cache/bin/haproxy-$version"
	# All of the output is read: with pipefail, head closing the pipe early
	# would fail the script with SIGPIPE now and then.
	"$cache/bin/haproxy-$version" -v | sed -n 1p
done <<'SUITES'
trixie 3.0 trixie
forky 3.2 sid
SUITES
