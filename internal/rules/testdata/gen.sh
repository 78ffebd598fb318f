#!/bin/sh
# gen.sh regenerates the *.save files in this directory from the real tools:
# iptables 1.8.9, ipset 7.17 and the CNI portmap plugin (Debian
# containernetworking-plugins 1.1.1), inside throwaway network namespaces.
# It never touches the caller's namespace. Run as root:  sh gen.sh
#
# Outputs:
#   appended.save   kube-proxy (IPVS mode) first, portmap added afterwards
#                   (portmap appends its PREROUTING/OUTPUT jumps: fixed order)
#   prepended.save  the same with the portmap jumps moved ahead of
#                   KUBE-SERVICES, as portmap <= 0.7.4 wrote them
#   ipsets.save     ipset save of the kube-proxy sets
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ns=rules-test-$$
ctr=rules-ctr-$$
cleanup() { ip netns del "$ns" 2>/dev/null || true; ip netns del "$ctr" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$ns"
ip netns add "$ctr"
X="ip netns exec $ns"

# ipsets exactly as kube-proxy creates them (kube-proxy-ipvs.md).
$X sh -e <<'SETS'
ipset create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-EXTERNAL-IP hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-EXTERNAL-IP-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-LOAD-BALANCER hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-LOAD-BALANCER-FW hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-LOAD-BALANCER-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist
ipset create KUBE-NODE-PORT-LOCAL-TCP bitmap:port range 0-65535 -exist
ipset create KUBE-NODE-PORT-UDP bitmap:port range 0-65535 -exist
ipset create KUBE-NODE-PORT-LOCAL-UDP bitmap:port range 0-65535 -exist
ipset create KUBE-NODE-PORT-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-NODE-PORT-LOCAL-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
ipset create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535 -exist
ipset create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536 -exist
ipset add KUBE-LOOP-BACK 10.244.1.5,tcp:8080,10.244.1.5 -exist
for e in 10.96.0.10,tcp:80 10.96.0.20,tcp:80 10.96.0.30,tcp:80; do ipset add KUBE-CLUSTER-IP $e -exist; done
ipset add KUBE-LOAD-BALANCER 192.168.1.200,tcp:80 -exist
ipset add KUBE-LOAD-BALANCER-LOCAL 192.168.1.200,tcp:80 -exist
ipset add KUBE-NODE-PORT-TCP 30080 -exist; ipset add KUBE-NODE-PORT-TCP 30081 -exist
ipset add KUBE-NODE-PORT-LOCAL-TCP 30081 -exist
ipset add KUBE-HEALTH-CHECK-NODE-PORT 32000 -exist
for a in 10.96.0.10 10.96.0.20 10.96.0.30 192.168.1.200; do ipset add KUBE-IPVS-IPS $a -exist; done
SETS

# kube-proxy's prepended jumps, then its restore payload (kube-proxy-ipvs.md).
$X sh -e <<'KP'
iptables -t nat -N KUBE-SERVICES; iptables -t nat -N KUBE-POSTROUTING
iptables -N KUBE-FORWARD; iptables -N KUBE-NODE-PORT; iptables -N KUBE-PROXY-FIREWALL
iptables -N KUBE-IPVS-FILTER; iptables -N KUBE-IPVS-OUT-FILTER
iptables -t nat -I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
iptables -t nat -I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
iptables -t nat -I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
iptables -t filter -I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
iptables -t filter -I INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
iptables -t filter -I INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
iptables -t filter -I FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
iptables -t filter -I INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
iptables -t filter -I OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
iptables-restore --noflush <<'R'
*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-LOAD-BALANCER -m comment --comment "Kubernetes service load balancer ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m mark ! --mark 0x004000/0x004000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x004000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x004000
COMMIT
*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x004000/0x004000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT
COMMIT
R
KP

# The real portmap plugin: two sandboxes on network "cbr0".
#   mysql-b   10.244.1.5  hostPort 3306 -> 3306, hostPort 30080 -> 80 (= a NodePort)
#   nginx-hp  10.244.1.6  hostPort 80 -> 80
ip -n "$ctr" link add eth0 type dummy 2>/dev/null || ip -n "$ctr" link add eth0 type bridge
portmap() { # id ip mappings-json
  cat >"$here/.conf.json" <<CONF
{"cniVersion":"1.0.0","name":"cbr0","type":"portmap","snat":true,
 "runtimeConfig":{"portMappings":$3},
 "prevResult":{"cniVersion":"1.0.0",
   "interfaces":[{"name":"eth0","sandbox":"/run/netns/$ctr"}],
   "ips":[{"address":"$2/24","interface":0}]}}
CONF
  CNI_COMMAND=ADD CNI_CONTAINERID=$1 CNI_NETNS=/run/netns/$ctr CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni \
    $X /usr/lib/cni/portmap <"$here/.conf.json" >/dev/null
  rm -f "$here/.conf.json"
}
portmap 4b1c0f6de2a94b3f8c1e7a5d9e0b2c3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d 10.244.1.5 \
  '[{"hostPort":3306,"containerPort":3306,"protocol":"tcp"},{"hostPort":30080,"containerPort":80,"protocol":"tcp"}]'
portmap 9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0 10.244.1.6 \
  '[{"hostPort":80,"containerPort":80,"protocol":"tcp"}]'

save() { for t in raw mangle nat filter; do $X iptables-save -t $t; done | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]$/[0:0]/'; }
save >"$here/appended.save"
$X ipset save >"$here/ipsets.save"

# portmap <= 0.7.4 inserted its jumps at the top (CVE-2019-9946): move them.
for c in PREROUTING OUTPUT; do
  $X iptables -t nat -D $c -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
  $X iptables -t nat -I $c -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
done
save >"$here/prepended.save"
