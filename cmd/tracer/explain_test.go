package main

import (
	"encoding/json"
	"strings"
	"testing"
)

const ipvsNodeTrace = "../../internal/predict/testdata/ipvs-node.ndjson"

func TestExplainHostportHijack(t *testing.T) {
	code, out, errs := runTracer("explain", "--snapshot", ipvsNodeTrace, "pod/ns-c/client", "svc/ns-a/svc-b")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"tcp 10.244.1.7 (pod ns-c/client) → 10.96.0.20:3306 (Service ns-a/svc-b)",
		"DNAT to 10.244.1.5:3306 by `-A CNI-DN-8b747bf054247edf07ca9",
		"verdict: hostport-hijack",
		"no packet was sent",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestExplainJSON(t *testing.T) {
	code, out, errs := runTracer("explain", "--snapshot", ipvsNodeTrace, "--proto", "icmp", "-o", "json", "10.244.1.7", "10.96.0.20")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got explainJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Verdict != "ipvs-filter-reject" || got.Flow == nil || got.Flow.Rule == nil || got.Flow.Rule.Chain != "KUBE-IPVS-FILTER" {
		t.Fatalf("%+v", got)
	}
}

func TestExplainBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"explain", "--snapshot", ipvsNodeTrace, "pod/ns-c/client"}, "FROM and TO"},
		{[]string{"explain", "--snapshot", ipvsNodeTrace, "pod/ns-c/nope", "10.96.0.20:3306"}, "FROM: no pod ns-c/nope"},
		{[]string{"explain", "--snapshot", ipvsNodeTrace, "10.244.1.7", "10.96.0.20"}, "a destination port is needed"},
		{[]string{"explain", "--snapshot", ipvsNodeTrace, "--proto", "gre", "10.244.1.7", "10.96.0.20:1"}, "unknown protocol"},
		{[]string{"explain", "--snapshot", ipvsNodeTrace, "-o", "yaml", "a", "b"}, "text or json"},
		{[]string{"explain", "--snapshot", "testdata/nope.ndjson", "a", "b"}, "no such file"},
		{[]string{"explain", "--snapshot", ipvsNodeTrace, "--metadata", "x.json", "a", "b"}, "do not apply"},
		{[]string{"explain", "--bogus"}, "flag provided but not defined"},
	} {
		code, _, errs := runTracer(c.args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 saying %q", c.args, code, errs, c.want)
		}
	}
}

func TestAuditCommand(t *testing.T) {
	code, out, errs := runTracer("audit", "--snapshot", ipvsNodeTrace)
	if code != 1 || !strings.Contains(errs, "1 problem(s) on node node-2") {
		t.Fatalf("exit %d, stderr %q; want exit 1 for the hijack", code, errs)
	}
	for _, want := range []string{"1 problem(s), 2 note(s)", "PROBLEM hostport-hijack: tcp 10.96.0.20:3306 (Service ns-a/svc-b port 3306 (mysql))", "NOTE ipvs-filter-reject: icmp 10.96.0.10"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runTracer("audit", "--snapshot", ipvsNodeTrace, "-o", "json")
	var r struct {
		Findings []struct{ Severity, Verdict string }
	}
	if err := json.Unmarshal([]byte(out), &r); code != 1 || err != nil || len(r.Findings) != 3 || r.Findings[0].Verdict != "hostport-hijack" {
		t.Fatalf("json: exit %d, %v, %+v", code, err, r)
	}
	if code, _, errs := runTracer("audit", "--snapshot", ipvsNodeTrace, "extra"); code != 2 || !strings.Contains(errs, "unexpected argument") {
		t.Errorf("extra argument: exit %d, %q", code, errs)
	}
}
