package enrich_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/live/livetest"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TestPrivUnansweredEndpointIsOneFlow: a TCP connection, a DNS query and
// an IPv6 TCP connection to Service addresses DNAT'd to an endpoint
// address nothing answers ARP or neighbour discovery for. The kernel holds their packets until it gives up on the neighbour,
// 3 s later, then drops them and answers host-unreachable, which fails the
// client's connect and its query's read (EHOSTUNREACH, the truth this test
// starts from). The tracer must report each as one flow, to the Service
// address, with the DNAT and the rejection, rejected, leading to the
// address nobody holds; no other flow may name the client's endpoint.
// Before join.UnansweredLinger the DNAT's flow left at its linger as "ok"
// and the rejection made a second flow; held once only, a retransmitted
// SYN's rejection 3 s after the first made the second flow.
// clientAddr6 is the client's IPv6 address on the node's cni0.
const clientAddr6 = "fd00:a::2"

func TestPrivUnansweredEndpointIsOneFlow(t *testing.T) {
	requirePrivileged(t, "iptables", "ip6tables")
	for _, tier := range livetest.Tiers {
		t.Run(tier.Name, func(t *testing.T) {
			tier.SkipWithoutLinks(t)
			lab, nss := newLab(t, fmt.Sprintf("trdead%d", os.Getpid()%10000), "c", "n", "e")
			c, n, e := nss["c"], nss["n"], nss["e"]
			must(t, lab.Link(c, "eth0", clientAddr+"/24", n, "cni0", "10.0.0.1/24"))
			// The endpoints' link holds 10.245.0.2; 10.245.0.9, where the
			// DNATs send the connections, is on it and held by nobody.
			must(t, lab.Link(n, "eth1", "10.245.0.1/24", e, "eth0", "10.245.0.2/24"))
			run(t, c, "ip", "route", "add", "default", "via", "10.0.0.1")
			must(t, n.Sysctl("net.ipv4.ip_forward", "1"))
			run(t, n, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", "10.96.0.10", "-p", "tcp", "--dport", "80",
				"-j", "DNAT", "--to-destination", "10.245.0.9:8080")
			run(t, n, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", "10.96.0.10", "-p", "udp", "--dport", "53",
				"-j", "DNAT", "--to-destination", "10.245.0.9:53")
			// IPv6: neighbour discovery for fd00:245::9 goes unanswered.
			for _, a := range []struct {
				ns        netlab.Namespace
				dev, cidr string
			}{{c, "eth0", clientAddr6 + "/64"}, {n, "cni0", "fd00:a::1/64"}, {n, "eth1", "fd00:245::1/64"}, {e, "eth0", "fd00:245::2/64"}} {
				run(t, a.ns, "ip", "-6", "addr", "add", a.cidr, "dev", a.dev, "nodad")
			}
			run(t, c, "ip", "-6", "route", "add", "default", "via", "fd00:a::1")
			must(t, n.Sysctl("net.ipv6.conf.all.forwarding", "1"))
			must(t, netlab.SettleIPv6(10*time.Second, c, n, e))
			run(t, n, "ip6tables", "-t", "nat", "-A", "PREROUTING", "-d", "fd00:96::10", "-p", "tcp", "--dport", "80",
				"-j", "DNAT", "--to-destination", "[fd00:245::9]:8080")
			tr := livetest.Start(t, n, livetest.Config{Only: tier.Only})

			type attempt struct {
				proto, src string
				err        error
				took       time.Duration
			}
			attempts := []*attempt{{proto: "tcp"}, {proto: "udp"}, {proto: "tcp6"}}
			began := time.Now()
			var wg sync.WaitGroup
			for _, a := range attempts {
				wg.Go(func() {
					switch a.proto {
					case "tcp":
						a.src, a.err = dial(c, clientAddr, "10.96.0.10:80", 10*time.Second)
					case "udp":
						a.src, a.err = query(c, clientAddr, "10.96.0.10:53", 10*time.Second)
					case "tcp6":
						a.src, a.err = dial(c, clientAddr6, "[fd00:96::10]:80", 10*time.Second)
					}
					a.took = time.Since(began)
				})
			}
			wg.Wait()
			for _, a := range attempts {
				if !errors.Is(a.err, syscall.EHOSTUNREACH) {
					t.Fatalf("%s from %s: %v after %s; want EHOSTUNREACH (no host answers ARP for 10.245.0.9, or neighbour discovery for fd00:245::9)", a.proto, a.src, a.err, a.took)
				}
				t.Logf("%s from %s failed after %s: %v", a.proto, a.src, a.took.Round(time.Millisecond), a.err)
			}
			// The SYN the client retransmitted as the first resolution
			// failed starts another, rejected 3 s later; the flows leave
			// UnansweredLinger after their last rejection, before Stop
			// flushes anything.
			seen := func(src string) bool {
				return slices.ContainsFunc(tr.All(), func(f *trace.Flow) bool { return namesEndpoint(f, src) })
			}
			deadline := time.Now().Add(3*time.Second + join.UnansweredLinger + 2*time.Second)
			for slices.ContainsFunc(attempts, func(a *attempt) bool { return !seen(a.src) }) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			// A flow split off would have come first: the rejection
			// 6.1 s in, at its linger, or the DNAT's at 1.5 s.
			t.Logf("every attempt's first flow came within %s of the attempts' start", time.Since(began).Round(100*time.Millisecond))
			tr.Stop(t)
			checkOneRejectedFlow(t, tr.All(), "tcp", attempts[0].src, "10.96.0.10:80", "10.245.0.9")
			checkOneRejectedFlow(t, tr.All(), "udp", attempts[1].src, "10.96.0.10:53", "10.245.0.9")
			checkOneRejectedFlow(t, tr.All(), "tcp", attempts[2].src, "[fd00:96::10]:80", "fd00:245::9")
		})
	}
}

// checkOneRejectedFlow: exactly one flow names src, and it is the
// connection to the Service address, DNAT'd, rejected, and explained by
// the neighbour nothing answered.
func checkOneRejectedFlow(t *testing.T, all []*trace.Flow, proto, src, service, deadAddr string) {
	t.Helper()
	var mine []*trace.Flow
	for _, f := range all {
		if namesEndpoint(f, src) {
			mine = append(mine, f)
		}
	}
	if len(mine) != 1 {
		t.Errorf("%s: %d flows name the client's endpoint %s, want its connection's one:\n%s", proto, len(mine), src, flowsJSON(mine))
		return
	}
	f := mine[0]
	kinds := map[string]bool{}
	for _, ev := range f.Events {
		kinds[ev.Kind] = true
	}
	if f.Proto != proto || f.Orig.Dst != service || !kinds[trace.KindDNAT] || !kinds[trace.KindReject] || f.Verdict != trace.VerdictRejected {
		t.Errorf("%s: flow to %s, events %s, verdict %q; want the Service address's, with the DNAT and the rejection, rejected:\n%s",
			proto, f.Orig.Dst, livetest.EventList(f.Events), f.Verdict, flowsJSON(mine))
	}
	// The address nobody holds is the lab's; the explanation must lead
	// there (by the NEIGH_FAILED drop, or by the 3 s).
	if !strings.Contains(f.Explanation, "neighbour discovery for "+deadAddr+",") {
		t.Errorf("%s: the explanation does not name %s as the neighbour nothing answered: %s", proto, deadAddr, f.Explanation)
	}
	t.Logf("%s: %s: %s", proto, f.Verdict, f.Explanation)
}

// query sends one datagram from ns, from a fixed local port, to addr on a
// connected UDP socket and reads the answer: an ICMP error for the
// datagram is the read's error (IP_RECVERR). It returns the local endpoint.
func query(ns netlab.Namespace, from, addr string, timeout time.Duration) (string, error) {
	local := &net.UDPAddr{IP: net.ParseIP(from), Port: 20000 + rand.IntN(20000)}
	err := ns.Do(func() error {
		raddr, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return err
		}
		c, err := net.DialUDP("udp", local, raddr)
		if err != nil {
			return err
		}
		defer c.Close()
		// Without IP_RECVERR a UDP socket takes only the ICMP errors that
		// are fatal (port unreachable): a DNS client sees a host
		// unreachable as a timeout. With it the error is the read's.
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVERR, 1) }); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("set IP_RECVERR: %w", serr)
		}
		if _, err := c.Write([]byte("q")); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(timeout))
		_, err = c.Read(make([]byte, 512))
		return err
	})
	return local.String(), err
}

// namesEndpoint says whether ap is in any of f's tuples or its events'.
func namesEndpoint(f *trace.Flow, ap string) bool {
	has := func(tu *trace.Tuple) bool { return tu != nil && (tu.Src == ap || tu.Dst == ap) }
	if has(&f.Orig) || has(f.Reply) {
		return true
	}
	for _, ev := range f.Events {
		if has(ev.Packet) || has(ev.Orig) || has(ev.Reply) {
			return true
		}
	}
	return false
}

func flowsJSON(fs []*trace.Flow) string {
	var b []byte
	for _, f := range fs {
		j, _ := json.Marshal(f)
		b = append(append(b, j...), '\n')
	}
	return string(b)
}
