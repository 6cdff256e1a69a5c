#!/usr/bin/env bash
# bench/ingress.sh: Keel's HTTPS ingress against nginx and Caddy as TLS
# reverse proxies, and against the backend serving TLS itself ("direct"),
# all in front of the same backend, on 127.0.0.1. Run from anywhere:
#
#   bench/ingress.sh
#
# It installs what it lacks with apt-get (wrk, nghttp2-client for h2load,
# nginx-light, caddy; Caddy is skipped where Debian does not package it),
# builds keel's side (bench/ingressbench) with go, and prints one Markdown
# table:
#
#   keep-alive:    wrk, HTTP/1.1 over kept-alive TLS connections, small
#                  answers: requests/s, p50, p99
#   HTTP/2:        h2load, H2CONNS connections (default 10) of H2STREAMS
#                  concurrent streams each (default 10): requests/s
#   resumed TLS:   wrk with "Connection: close": a new connection per
#                  request; wrk resumes its TLS session (a TLS 1.3 PSK
#                  handshake with a fresh key exchange, no certificate)
#   full TLS:      ingressbench handshakes (a Go client that keeps no TLS
#                  session): a new connection and a full handshake
#                  (certificate, ECDSA P-256 signature) per request
#
# Each with the CPU time the server spent per request or connection.
#
# On a machine of 2 or more cores the server under test runs on CPU 1 and
# everything else (load generator, backend) on CPU 0, so every server gets
# the same one core. Knobs (environment): DURATION (whole seconds, default
# 10s), CONNS (concurrent connections of wrk and ingressbench, default 50),
# H2CONNS, H2STREAMS, RUNS (each figure is the median of RUNS runs, default
# 3), PORT_BASE (default 18400).
set -euo pipefail

DURATION=${DURATION:-10s}
CONNS=${CONNS:-50}
H2CONNS=${H2CONNS:-10}
H2STREAMS=${H2STREAMS:-10}
RUNS=${RUNS:-3}
PORT_BASE=${PORT_BASE:-18400}
HOST=localhost # resolves to 127.0.0.1 everywhere, and is an SNI name

root=$(cd "$(dirname "$0")/.." && pwd)

# --- tools -----------------------------------------------------------------
missing=()
for t in wrk:wrk h2load:nghttp2-client nginx:nginx-light caddy:caddy; do
	command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t#*:}")
done
if ((${#missing[@]})); then
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -q
	for p in "${missing[@]}"; do
		# Caddy is optional (not every Debian release packages it).
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$p" || [ "$p" = caddy ]
	done
fi
PATH=$PATH:/usr/sbin

# Command prefixes (arrays, so that a background server's pid is its own).
client=() server=()
if [ "$(nproc)" -ge 2 ]; then
	client=(taskset -c 0)
	server=(taskset -c 1)
fi

# --- servers -----------------------------------------------------------------
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

backend_plain=$((PORT_BASE + 0)) # the backend the proxies forward to (CPU 0)
direct=$((PORT_BASE + 1))        # the backend's own TLS (CPU 1)
keel=$((PORT_BASE + 2))
nginx=$((PORT_BASE + 3))
caddy=$((PORT_BASE + 4))

(cd "$root" && go build -o "$work/ingressbench" ./bench/ingressbench)
"$work/ingressbench" cert "$work" "$HOST"

start() { "$@" >>"$work/servers.log" 2>&1 & pids+=($!); }

start "${client[@]}" "$work/ingressbench" backend "127.0.0.1:$backend_plain" "127.0.0.1:$((PORT_BASE + 5))" "$work"
start "${server[@]}" "$work/ingressbench" backend "127.0.0.1:$((PORT_BASE + 6))" "127.0.0.1:$direct" "$work"
start "${server[@]}" "$work/ingressbench" keel "127.0.0.1:$keel" "$HOST" "127.0.0.1:$backend_plain" "$work"

mkdir -p "$work/nginx/logs"
cat >"$work/nginx.conf" <<EOF
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
	access_log off;
	# nginx closes a connection after 1,000 requests by default (HTTP/2
	# too), which h2load does not survive and Keel does not do.
	keepalive_requests 1000000;
	client_body_temp_path $work/nginx/body;
	proxy_temp_path $work/nginx/proxy;
	fastcgi_temp_path $work/nginx/fastcgi;
	uwsgi_temp_path $work/nginx/uwsgi;
	scgi_temp_path $work/nginx/scgi;
	upstream backend {
		server 127.0.0.1:$backend_plain;
		keepalive 64;
	}
	server {
		listen 127.0.0.1:$nginx ssl http2;
		server_name $HOST;
		ssl_certificate $work/cert.pem;
		ssl_certificate_key $work/key.pem;
		ssl_protocols TLSv1.2 TLSv1.3;
		location / {
			proxy_pass http://backend;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header Host \$host;
			proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
			proxy_set_header X-Forwarded-Host \$host;
			proxy_set_header X-Forwarded-Proto https;
		}
	}
}
EOF
start "${server[@]}" nginx -p "$work/nginx" -c "$work/nginx.conf" -g 'daemon off;'

have_caddy=false
if command -v caddy >/dev/null 2>&1; then
	have_caddy=true
	cat >"$work/Caddyfile" <<EOF
{
	admin off
	auto_https off
}
https://$HOST:$caddy {
	bind 127.0.0.1
	tls $work/cert.pem $work/key.pem
	reverse_proxy 127.0.0.1:$backend_plain
}
EOF
	start env HOME="$work" XDG_DATA_HOME="$work" XDG_CONFIG_HOME="$work" "${server[@]}" caddy run --config "$work/Caddyfile" --adapter caddyfile
fi

targets=("direct:$direct" "keel:$keel" "nginx:$nginx")
$have_caddy && targets+=("caddy:$caddy")

for t in "${targets[@]}"; do
	port=${t#*:}
	for _ in $(seq 100); do
		curl -fsk "https://$HOST:$port/" >/dev/null 2>&1 && break
		sleep 0.1
	done
	if ! curl -fsk "https://$HOST:$port/" | grep -q hello; then
		echo "${t%%:*} on port $port does not answer; servers' log:" >&2
		cat "$work/servers.log" >&2
		exit 1
	fi
done

# --- measurements ----------------------------------------------------------
# The machine may be busy with other work, which moves throughput and
# latency; the CPU time the server under test spends per request moves far
# less, so it is measured too: the utime+stime of the server's process (for
# nginx, its worker) over the run, divided by the requests served.

# pid of the server process listening on port $1
server_pid() {
	local pid
	pid=$(ss -Htlnp "sport = :$1" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
	echo "$pid"
}
# CPU ticks (1/100 s as Linux reports them) used so far by pid $1
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# wrk's latency ("1.23ms", "456.00us", "1.02s") in milliseconds
to_ms() { awk '{ v = $1; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v) } else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 }; printf "%.2f\n", v }'; }
# CPU microseconds per request: ticks before, ticks after, requests
per_req() { awk -v a="$1" -v b="$2" -v n="$3" -v hz="$hz" 'BEGIN { printf "%.1f\n", (b - a) / hz * 1e6 / n }'; }

keepalive() { # port pid -> "rps p50 p99 cpu_us"
	local out t0 t1 n rps=() p50=() p99=() cpu=()
	for _ in $(seq "$RUNS"); do
		t0=$(ticks "$2")
		out=$("${client[@]}" wrk -t1 -c"$CONNS" -d"$DURATION" --latency "https://$HOST:$1/")
		t1=$(ticks "$2")
		if grep -q "Non-2xx\|Socket errors" <<<"$out"; then echo "errors: $out" >&2; fi
		n=$(awk '/requests in/ { print $1 }' <<<"$out")
		rps+=("$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")")
		p50+=("$(awk '$1 == "50%" { print $2 }' <<<"$out" | to_ms)")
		p99+=("$(awk '$1 == "99%" { print $2 }' <<<"$out" | to_ms)")
		cpu+=("$(per_req "$t0" "$t1" "$n")")
	done
	echo "$(printf '%s\n' "${rps[@]}" | median) $(printf '%s\n' "${p50[@]}" | median) $(printf '%s\n' "${p99[@]}" | median) $(printf '%s\n' "${cpu[@]}" | median)"
}

resumed() { # port pid -> "conns/s cpu_us"
	local out t0 t1 n rps=() cpu=()
	for _ in $(seq "$RUNS"); do
		t0=$(ticks "$2")
		out=$("${client[@]}" wrk -t1 -c"$CONNS" -d"$DURATION" -H 'Connection: close' "https://$HOST:$1/")
		t1=$(ticks "$2")
		if grep -q "Non-2xx" <<<"$out"; then echo "errors: $out" >&2; fi
		n=$(awk '/requests in/ { print $1 }' <<<"$out")
		rps+=("$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")")
		cpu+=("$(per_req "$t0" "$t1" "$n")")
	done
	echo "$(printf '%s\n' "${rps[@]}" | median) $(printf '%s\n' "${cpu[@]}" | median)"
}

h2() { # port pid -> "rps cpu_us"
	local out t0 t1 n rps=() cpu=()
	for _ in $(seq "$RUNS"); do
		t0=$(ticks "$2")
		out=$("${client[@]}" h2load -c "$H2CONNS" -m "$H2STREAMS" -D "${DURATION%s}" "https://$HOST:$1/" 2>&1)
		t1=$(ticks "$2")
		n=$(awk '/^requests:/ { print $8 }' <<<"$out")
		if ! grep -q " 0 failed, 0 errored" <<<"$out"; then echo "errors: $out" >&2; fi
		rps+=("$(awk '/^finished in/ { print $4 }' <<<"$out")")
		cpu+=("$(per_req "$t0" "$t1" "$n")")
	done
	echo "$(printf '%s\n' "${rps[@]}" | median) $(printf '%s\n' "${cpu[@]}" | median)"
}

full() { # port pid -> "conns/s cpu_us"
	local out t0 t1 rate errs rps=() cpu=()
	for _ in $(seq "$RUNS"); do
		t0=$(ticks "$2")
		out=$("${client[@]}" "$work/ingressbench" handshakes "127.0.0.1:$1" "$HOST" "$CONNS" "$DURATION")
		t1=$(ticks "$2")
		read -r rate errs <<<"$out"
		if [ "$errs" != 0 ]; then echo "$errs failed connections to port $1" >&2; fi
		rps+=("$rate")
		cpu+=("$(per_req "$t0" "$t1" "$(awk -v r="$rate" -v d="${DURATION%s}" 'BEGIN { print r * d }')")")
	done
	echo "$(printf '%s\n' "${rps[@]}" | median) $(printf '%s\n' "${cpu[@]}" | median)"
}

echo "wrk $(wrk -v 2>&1 | awk 'NR == 1 { print $2 }'), $(nginx -v 2>&1 | sed 's/.*: //'), caddy $($have_caddy && caddy version | awk '{ print $1 }' || echo absent), $(go version | awk '{ print $3 }'); $(nproc) cores, load average before $(cut -d' ' -f1-3 /proc/loadavg); DURATION=$DURATION CONNS=$CONNS RUNS=$RUNS"
echo
echo "| server | HTTP/1.1 keep-alive req/s | p50 ms | p99 ms | CPU µs/req | HTTP/2 req/s | CPU µs/req | resumed TLS conns/s | CPU µs/conn | full TLS conns/s | CPU µs/conn |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for t in "${targets[@]}"; do
	name=${t%%:*} port=${t#*:}
	pid=$(server_pid "$port")
	if [ "$name" = nginx ]; then pid=$(pgrep -P "$(cat "$work/nginx/nginx.pid")" | head -1); fi
	read -r rps p50 p99 cpu <<<"$(keepalive "$port" "$pid")"
	read -r hrate hcpu <<<"$(h2 "$port" "$pid")"
	read -r rrate rcpu <<<"$(resumed "$port" "$pid")"
	read -r frate fcpu <<<"$(full "$port" "$pid")"
	printf '| %s | %.0f | %s | %s | %s | %.0f | %s | %.0f | %s | %.0f | %s |\n' "$name" "$rps" "$p50" "$p99" "$cpu" "$hrate" "$hcpu" "$rrate" "$rcpu" "$frate" "$fcpu"
done
echo
echo "load average after $(cut -d' ' -f1-3 /proc/loadavg)"
