package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// An IPv6-only pair of namespaces: client c and node n, with no IPv4
// address at all (127.0.0.1 removed from lo too), so any code path that
// assumes IPv4 shows.
const (
	v6Client  = "fd78:1::2"
	v6Node    = "fd78:1::1"
	v6Backend = "fd78:2::1"  // on the node's lo: a local "pod"
	v6VIP     = "fd96:78::1" // a "ClusterIP", DNAT'd at PREROUTING
)

func ipv6OnlyPair(t *testing.T) (c, n netlab.Namespace) {
	t.Helper()
	lab, err := netlab.New("trv6")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	if c, err = lab.Namespace("c"); err != nil {
		t.Fatal(err)
	}
	if n, err = lab.Namespace("n"); err != nil {
		t.Fatal(err)
	}
	if err := lab.Link(c, "c-n", v6Client+"/64", n, "n-c", v6Node+"/64"); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		ns   netlab.Namespace
		args []string
	}{
		{c, []string{"ip", "addr", "del", "127.0.0.1/8", "dev", "lo"}},
		{n, []string{"ip", "addr", "del", "127.0.0.1/8", "dev", "lo"}},
		{n, []string{"ip", "addr", "add", v6Backend + "/128", "dev", "lo"}},
		{c, []string{"ip", "-6", "route", "add", "default", "via", v6Node}},
		{n, []string{"ip6tables", "-t", "nat", "-A", "PREROUTING", "-d", v6VIP, "-p", "tcp", "--dport", "80",
			"-j", "DNAT", "--to-destination", "[" + v6Backend + "]:8080"}},
		{n, []string{"ip6tables", "-A", "INPUT", "-p", "tcp", "--dport", "81", "-j", "REJECT", "--reject-with", "tcp-reset"}},
		{n, []string{"ip6tables", "-A", "INPUT", "-p", "udp", "--dport", "9", "-j", "REJECT", "--reject-with", "icmp6-port-unreachable"}},
	}
	for _, s := range steps {
		if _, err := s.ns.Run(s.args[0], s.args[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []netlab.Namespace{c, n} {
		out, err := ns.Run("ip", "-4", "addr", "show")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "inet ") {
			t.Fatalf("%s still has an IPv4 address:\n%s", ns.Name, out)
		}
	}
	// The addresses were added without nodad: wait until they can be used.
	if err := netlab.SettleIPv6(10*time.Second, c, n); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := n.Do(func() (err error) { ln, err = net.Listen("tcp", "["+v6Backend+"]:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
			c.Write([]byte("backend"))
			c.Close()
		}
	}()
	return c, n
}

// TestTraceIPv6Only traces an IPv6-only node: a DNAT'd connection, a
// REJECT with tcp-reset and one with icmp6-port-unreachable, each checked
// against what the client saw and the rule counters of ip6tables, not
// against the tracer's own words.
func TestTraceIPv6Only(t *testing.T) {
	requireRootHost(t)
	bin := buildTracer(t)
	c, n := ipv6OnlyPair(t)
	cmd, out, stderr := startTrace(t, bin, n, "-o", "json", "--linger", "500ms")

	// What the client sees is the truth the flows must agree with.
	var got string
	err := c.Do(func() error {
		conn, err := net.DialTimeout("tcp", "["+v6VIP+"]:80", 2*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		b := make([]byte, 16)
		k, _ := conn.Read(b)
		got = string(b[:k])
		return nil
	})
	if err != nil || got != "backend" {
		t.Fatalf("connect to [%s]:80: %q, %v", v6VIP, got, err)
	}
	err = c.Do(func() error {
		conn, err := net.DialTimeout("tcp", "["+v6Node+"]:81", 2*time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect to [%s]:81: want connection refused (a RST), got %v", v6Node, err)
	}
	err = c.Do(func() error {
		conn, err := net.Dial("udp", "["+v6Node+"]:9")
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.Write([]byte("x"))
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		return err
	})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("udp to [%s]:9: want the port-unreachable error, got %v", v6Node, err)
	}
	// ip6tables' own counters: each rule matched exactly one packet.
	for _, table := range []string{"nat", "filter"} {
		dump, err := n.Run("ip6tables-save", "-c", "-t", table)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(dump, "\n") {
			if strings.Contains(line, "-j DNAT") || strings.Contains(line, "-j REJECT") {
				if !strings.HasPrefix(line, "[1:") {
					t.Errorf("rule counters: want one packet, got %s", line)
				}
			}
		}
	}

	time.Sleep(800 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tracer trace exited with %v; stderr: %s", err, stderr.String())
	}
	flows := map[string]trace.Flow{}
	var sum trace.Summary
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct{ Type string }
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("not NDJSON: %q: %v", sc.Text(), err)
		}
		switch rec.Type {
		case trace.TypeFlow:
			var f trace.Flow
			if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
				t.Fatal(err)
			}
			flows[f.Orig.Dst] = f
		case trace.TypeSummary:
			json.Unmarshal(sc.Bytes(), &sum)
		}
	}
	if sum.LostEvents != 0 {
		t.Errorf("lost events: %+v", sum)
	}
	for dst := range flows {
		t.Logf("flow to %s: %+v", dst, flows[dst])
	}

	dnat, ok := flows["["+v6VIP+"]:80"]
	if !ok {
		t.Fatalf("no flow to [%s]:80 in %s", v6VIP, out)
	}
	if len(dnat.Events) == 0 || dnat.Events[0].Kind != trace.KindDNAT || dnat.Events[0].To != "["+v6Backend+"]:8080" {
		t.Errorf("dnat flow events %+v", dnat.Events)
	}
	if dnat.Reply == nil || dnat.Reply.Src != "["+v6Backend+"]:8080" {
		t.Errorf("dnat flow reply %+v: the backend answered", dnat.Reply)
	}
	if dnat.Conntrack == nil || !dnat.Conntrack.Replied {
		t.Errorf("dnat flow conntrack %+v: the connection was answered", dnat.Conntrack)
	}
	if dnat.Rule == nil || !strings.Contains(dnat.Rule.Text, "--to-destination ["+v6Backend+"]:8080") {
		t.Errorf("dnat flow rule %+v", dnat.Rule)
	}
	if dnat.Verdict != trace.VerdictOK {
		t.Errorf("dnat flow verdict %s: %s", dnat.Verdict, dnat.Explanation)
	}

	rst, ok := flows["["+v6Node+"]:81"]
	if !ok {
		t.Fatalf("no flow to [%s]:81", v6Node)
	}
	if !hasEvent(rst, trace.KindReset, "") || rst.Verdict != trace.VerdictRejected {
		t.Errorf("reset flow: events %+v verdict %s: %s", rst.Events, rst.Verdict, rst.Explanation)
	}
	if rst.Rule == nil || !strings.Contains(rst.Rule.Text, "--reject-with tcp-reset") {
		t.Errorf("reset flow rule %+v", rst.Rule)
	}

	rej, ok := flows["["+v6Node+"]:9"]
	if !ok {
		t.Fatalf("no flow to [%s]:9", v6Node)
	}
	if !hasEvent(rej, trace.KindReject, "icmp6-port-unreachable") || rej.Verdict != trace.VerdictRejected {
		t.Errorf("reject flow: events %+v verdict %s: %s", rej.Events, rej.Verdict, rej.Explanation)
	}
	if rej.Rule == nil || !strings.Contains(rej.Rule.Text, "--reject-with icmp6-port-unreachable") {
		t.Errorf("reject flow rule %+v", rej.Rule)
	}
}

func hasEvent(f trace.Flow, kind, reason string) bool {
	for _, e := range f.Events {
		if e.Kind == kind && (reason == "" || e.Reason == reason) {
			return true
		}
	}
	return false
}
