#!/usr/bin/env bash
# Simulated hosts on one machine: network namespaces joined by a bridge that
# lives in a namespace of its own, so no traffic touches the machine's own
# interfaces. Needs root (ip netns).
#
#   netns.sh up TAG K [RATE]   K hosts TAG-h0..TAG-h<K-1> at 10.77.0.1..K/24, each
#                              with eth0 on the bridge; RATE (e.g. 1gbit) caps
#                              every host's outgoing rate (tc tbf)
#   netns.sh down TAG          removes them
#   netns.sh link TAG K up|down  sets host K's eth0 up or down
#   netns.sh delay TAG K MS HELPER LOG
#                              delays every packet host K sends on eth0 by MS
#                              ms: an iptables rule queues them to HELPER
#                              (tests/progs/braid_netdelay), which runs in the
#                              background inside host K, writing to LOG; for
#                              kernels without netem. Needs iptables.
#   netns.sh exec TAG K CMD... runs CMD inside host K
set -euo pipefail
cmd=${1:?usage: netns.sh up|down|link|delay|exec TAG ...}
tag=${2:?TAG}
sw="$tag-sw"
case "$cmd" in
up)
  k=${3:?K}
  rate=${4:-}
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < k; i++)); do
    h="$tag-h$i"
    ip netns add "$h"
    ip -n "$h" link set lo up
    ip -n "$h" link add eth0 type veth peer name "p$i" netns "$sw"
    ip -n "$h" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
    if [ -n "$rate" ]; then
      ip netns exec "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
    fi
  done
  ;;
down)
  # A delay helper (and any rank left behind) lives inside a namespace and
  # would outlive it: end them first, so that the helpers print their counts.
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$tag-h[0-9]+$" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      kill $pids 2>/dev/null || true
      for _ in $(seq 50); do
        alive=0
        for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
      done
      kill -9 $pids 2>/dev/null || true
    fi
  done
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$tag-(sw|h[0-9]+)$" || true); do
    ip netns del "$ns" || true
  done
  ;;
link)
  ip -n "$tag-h${3:?K}" link set eth0 "${4:?up|down}"
  ;;
delay)
  k=${3:?K}
  ms=${4:?MS}
  helper=${5:?HELPER}
  log=${6:?LOG}
  h="$tag-h$k"
  rm -f "$log.ready"
  ip netns exec "$h" "$helper" 0 "$ms" "$log.ready" >"$log" 2>&1 </dev/null &
  for _ in $(seq 50); do
    [ -e "$log.ready" ] && break
    sleep 0.1
  done
  if [ ! -e "$log.ready" ]; then
    echo "netns.sh: $helper did not start in $h (see $log)" >&2
    exit 1
  fi
  # Only packets leaving on eth0 (not loopback); a queue nobody reads drops
  # them, so a helper that died shows as a broken link, not as no delay.
  # iptables' NFQUEUE target (legacy tables: kernels may lack nftables' queue).
  ipt=iptables-legacy
  command -v "$ipt" >/dev/null 2>&1 || ipt=iptables
  ip netns exec "$h" "$ipt" -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0
  ;;
exec)
  k=${3:?K}
  shift 3
  exec ip netns exec "$tag-h$k" "$@"
  ;;
*)
  echo "netns.sh: unknown command $cmd" >&2
  exit 2
  ;;
esac
