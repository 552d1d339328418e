#!/usr/bin/env bash
# Starts a 3-node Redis Cluster on loopback for the RedisStore cluster tests, and prints the
# REDIS_CLUSTER_URLS value to use. Idempotent: nodes already running are left alone, and the
# cluster is created only when it is not formed yet.
#
#   export REDIS_CLUSTER_URLS=$(.ci/redis-cluster.sh)
#
# Ports: REDIS_CLUSTER_PORTS (default "7001 7002 7003"). Node files live in
# REDIS_CLUSTER_DIR (default /tmp/tower-idempotency-redis-cluster). Nothing is persisted.
set -euo pipefail

ports=(${REDIS_CLUSTER_PORTS:-7001 7002 7003})
dir=${REDIS_CLUSTER_DIR:-/tmp/tower-idempotency-redis-cluster}

log() { echo "redis-cluster: $*" >&2; }

for tool in redis-server redis-cli; do
    command -v "$tool" >/dev/null || { log "$tool is not installed"; exit 1; }
done

up() { redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }

for port in "${ports[@]}"; do
    if up "$port"; then
        log "node $port already running"
        continue
    fi
    mkdir -p "$dir/$port"
    # A node that is not running has no state worth keeping: start it blank.
    rm -f "$dir/$port/nodes.conf"
    redis-server --port "$port" --bind 127.0.0.1 --daemonize yes \
        --cluster-enabled yes --cluster-config-file "$dir/$port/nodes.conf" \
        --cluster-node-timeout 5000 --dir "$dir/$port" \
        --logfile "$dir/$port/redis.log" --pidfile "$dir/$port/redis.pid" \
        --save "" --appendonly no
    for _ in $(seq 50); do up "$port" && break; sleep 0.1; done
    up "$port" || { log "node $port did not start; see $dir/$port/redis.log"; exit 1; }
    log "node $port started"
done

first=${ports[0]}
info() { redis-cli -h 127.0.0.1 -p "$1" cluster info | tr -d '\r' | sed -n "s/^$2://p"; }

# Formed: every node knows every other node and sees every slot assigned.
formed=yes
blank=yes
for port in "${ports[@]}"; do
    slots=$(info "$port" cluster_slots_assigned)
    known=$(info "$port" cluster_known_nodes)
    [ "$slots" = "16384" ] && [ "$known" = "${#ports[@]}" ] || formed=no
    [ "$slots" = "0" ] && [ "$known" = "1" ] || blank=no
done

if [ "$formed" = yes ]; then
    log "cluster already formed"
else
    if [ "$blank" = no ]; then
        # Half formed (a node restarted blank while the others remember it): start over.
        log "cluster half formed; resetting the nodes"
        for port in "${ports[@]}"; do
            redis-cli -h 127.0.0.1 -p "$port" flushall >/dev/null
            redis-cli -h 127.0.0.1 -p "$port" cluster reset hard >/dev/null
        done
    fi
    nodes=()
    for port in "${ports[@]}"; do nodes+=("127.0.0.1:$port"); done
    log "creating the cluster"
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >&2
fi

state() { info "$first" cluster_state; }
for _ in $(seq 100); do
    [ "$(state)" = "ok" ] && break
    sleep 0.1
done
if [ "$(state)" != "ok" ]; then
    log "cluster_state is not ok after 10 s"
    redis-cli -h 127.0.0.1 -p "$first" cluster info >&2
    exit 1
fi
log "cluster_state:ok"

urls=()
for port in "${ports[@]}"; do urls+=("redis://127.0.0.1:$port"); done
(IFS=,; echo "${urls[*]}")
