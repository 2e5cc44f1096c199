#!/bin/sh
# Start the machine's Docker engine when nothing answers (machines without systemd).
set -eu
if docker info >/dev/null 2>&1; then exit 0; fi
mkdir -p build/lab/logs
echo "deps: starting dockerd"
nohup dockerd >build/lab/logs/dockerd-host.log 2>&1 &
i=0
until docker info >/dev/null 2>&1; do
  i=$((i + 1))
  if [ "$i" -gt 120 ]; then echo "deps: dockerd did not answer within 60 s; see build/lab/logs/dockerd-host.log" >&2; exit 1; fi
  sleep 0.5
done
