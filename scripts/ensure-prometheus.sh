#!/bin/sh
# `make setup`: Debian's prometheus package (prometheus and promtool, 2.42 on bookworm) for the rule tests
# and the real-Prometheus test of `make test`. Installed when missing; never started as a service.
set -eu
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
how="install Prometheus 2.42 or later so that \`prometheus\` and \`promtool\` are on PATH:
  Debian/Ubuntu:  sudo apt-get install prometheus
  elsewhere:      https://prometheus.io/download/ (unpack; put prometheus and promtool on PATH)"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "make setup: prometheus and promtool are missing (needed by make test); $how" >&2
    exit 1
fi
echo "make setup: installing Debian's prometheus package (prometheus, promtool)"
# policy-rc.d exit 101: the package's service is not started (tests start their own Prometheus on a free port)
policy=/usr/sbin/policy-rc.d
added=""
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added=1
fi
status=0
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || status=$?
[ -n "$added" ] && rm -f "$policy"
if [ "$status" -ne 0 ] || ! command -v promtool >/dev/null 2>&1; then
    echo "make setup: apt-get could not install prometheus (exit $status); $how" >&2
    exit 1
fi
