package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/lab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TRACER_LAB_BREAK=NAME runs TestLabScenarios with one of brokenVariants
// in the tracer, to watch the lab's checks fail on it.
func init() {
	if name := os.Getenv("TRACER_LAB_BREAK"); name != "" {
		v, ok := variantNamed(name)
		if !ok {
			panic("TRACER_LAB_BREAK: no broken variant " + name)
		}
		brokenTracer = v.breakFlow
	}
}

// vmLabKernels share the lab scenarios in the VM matrix. Under TCG every
// scenario costs 20 to 45 s per kernel (5.10's TestLabScenarios took 849 s
// alone when each guest ran them all), and CI has an hour; the host runs
// them all, and TestCapture puts every kernel's NAT, IPVS, REJECT, reset
// and drop decisions of both families to the test on each guest.
var vmLabKernels = []string{"5.10", "6.1", "6.12"}

// vmNFTLabScenarios are the nftables scenarios the VM matrix runs, one per
// guest: a native nftables REJECT and DROP on the oldest nf_tables, the
// numgen DNAT, and an ICMPv6 reject from the ip6 table. The other nftables
// scenarios differ from these in rule order and ownership, which the
// tracer reads in userspace the same way on every kernel, and run on the
// host.
var vmNFTLabScenarios = map[string]string{
	"nft-reject-reset-drop":        "5.10",
	"nft-healthy-service":          "6.1",
	"dualstack-nft-ping-clusterip": "6.12",
}

// hostLabScenarios are IPv6 twins of iptables scenarios whose IPv4
// scenario and whose IPv6 kernel paths already run in a guest (an IPv6
// virtual server's DNAT in dualstack-ping-clusterip, its ip_vs_leave in
// dualstack-ipvs-no-endpoint, ip6tables' KUBE-IPVS-FILTER in both,
// portmap's ip6tables DNAT in dualstack-hostport-hijack-clusterip, and
// TestCapture's IPv6 DNAT on every tier): the guests' kernels decide these
// the same way, and CI has an hour.
var hostLabScenarios = []string{"dualstack-lb-port-outside-cluster", "dualstack-hostport-vs-nodeport", "dualstack-hostnetwork-vs-hostport"}

// vmLabGuests names the guest that runs each scenario in the VM matrix:
// the iptables scenarios, which meet the guest's real IPVS where the host
// has a stand-in, are shared round-robin, but for hostLabScenarios; the
// nftables ones are vmNFTLabScenarios. A scenario without a guest runs on
// the host only.
func vmLabGuests(scs []lab.Scenario) map[string]string {
	guests := map[string]string{}
	i := 0
	for _, sc := range scs {
		if slices.Contains(hostLabScenarios, sc.Name) {
			continue
		}
		if strings.Contains(sc.Name, "nft-") {
			if g, ok := vmNFTLabScenarios[sc.Name]; ok {
				guests[sc.Name] = g
			}
			continue
		}
		guests[sc.Name] = vmLabKernels[i%len(vmLabKernels)]
		i++
	}
	return guests
}

// TestLabScenarios runs `tracer lab SCENARIO -o json` for every scenario:
// the incident is built for real, the lab proves from the node's own
// counters and tables that it happened, and every flow the tracer reports
// must agree with that proof (the lab checks that itself and exits non-zero
// otherwise). Then the same proof is checked against the flows as each
// broken variant of the tracer would have reported them: the checks must
// fail wherever the variant's bug shows. Scenarios that need IPVS skip on
// kernels without it and run in the VM matrix.
func TestLabScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("privileged tier: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged tier: needs root")
	}
	scs := lab.Scenarios()
	guests := vmLabGuests(scs)
	for _, sc := range scs {
		t.Run(sc.Name, func(t *testing.T) {
			if k, g := os.Getenv("TRACER_VM_KERNEL"), guests[sc.Name]; k != "" && k != g && slices.Contains(vmLabKernels, k) {
				if g == "" {
					t.Skip("the VM matrix leaves this scenario to the host (vmNFTLabScenarios and hostLabScenarios say why; TestCapture checks each kernel's decisions)")
				}
				t.Skipf("the VM matrix runs this scenario in the %s guest (its scenarios are shared over the kernels, for CI's hour; the host runs them all, and TestCapture checks each kernel's decisions)", g)
			}
			var out, errb bytes.Buffer
			code := dispatch(t.Context(), []string{"lab", "-o", "json", sc.Name}, &out, &errb)
			res, flows := parseLabOutput(t, out.Bytes())
			if res.Skipped != "" {
				if sc.NeedsIPVS && os.Getenv("TRACER_VM_KERNEL") == "" {
					t.Skipf("kernel without IPVS: %s", res.Skipped)
				}
				t.Fatalf("skipped where it must run: %s", res.Skipped)
			}
			logReport(t, res.Report)
			if ph := res.Phases; ph != nil {
				t.Logf("build %d ms, attach %d ms, traffic %d ms, settle %d ms", ph.BuildMS, ph.AttachMS, ph.TrafficMS, ph.SettleMS)
			}
			if code != 0 || !res.OK {
				t.Fatalf("lab %s: exit %d, checks failed; stderr: %s", sc.Name, code, errb.String())
			}
			if len(res.Results) == 0 {
				t.Fatal("the scenario checked nothing")
			}
			baseline := false
			for _, c := range res.Results {
				baseline = baseline || c.Baseline()
			}
			if !baseline {
				t.Error("the scenario has no baseline traffic to show healthy flows stay ok")
			}
			if brokenTracer == nil {
				checkBrokenVariants(t, res.Report, flows)
				checkPredictions(t, res)
			}
		})
	}
}

func logReport(t *testing.T, rep lab.Report) {
	t.Helper()
	for _, c := range rep.Results {
		t.Logf("%-4s %s %s -> %s (%s): want %s, got %q in %d flow(s) %v %s", okWord(c.OK), c.Proto, c.Src, c.Dst, c.Mechanism, c.Verdict, c.Got, c.Flows, c.Wrong, c.Unobservable)
	}
	for _, fa := range rep.FalseAlarms {
		t.Logf("FALSE ALARM %s %s -> %s: %s", fa.Proto, fa.Orig.Src, fa.Orig.Dst, fa.Verdict)
	}
}

func okWord(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAIL"
}

// checkBrokenVariants re-checks the scenario's proof against the flows as
// each broken tracer would have reported them.
func checkBrokenVariants(t *testing.T, rep lab.Report, flows []*trace.Flow) {
	t.Helper()
	exps := make([]lab.Expectation, len(rep.Results))
	for i, r := range rep.Results {
		exps[i] = r.Expectation
	}
	dropReasons := true
	for _, r := range rep.Results {
		dropReasons = dropReasons && r.Unobservable == ""
	}
	for _, v := range brokenVariants {
		var broken []*trace.Flow
		for _, f := range flows {
			broken = append(broken, v.breakFlow(cloneFlow(f))...)
		}
		should := v.shows(rep)
		got := lab.Check(exps, broken, dropReasons)
		switch {
		case should && got.OK:
			t.Errorf("broken tracer %q (%s): the lab's checks passed it", v.name, v.what)
		case !should && !got.OK:
			t.Errorf("broken tracer %q (%s): the checks failed where its bug cannot show", v.name, v.what)
			logReport(t, got)
		default:
			t.Logf("broken tracer %q: checks ok=%v, as they must be", v.name, got.OK)
		}
	}
}

// brokenVariant is a bug a tracer could have, and which scenarios it shows
// in: those with an attempt whose proof the bug contradicts.
type brokenVariant struct {
	name, what string
	breakFlow  func(*trace.Flow) []*trace.Flow
	shows      func(lab.Report) bool
}

// flowChecked says the attempt's flow was compared with its proof.
func flowChecked(r lab.Result) bool { return r.Flows > 0 && !r.NoFlow() }

func anyResult(pred func(lab.Result) bool) func(lab.Report) bool {
	return func(rep lab.Report) bool {
		for _, r := range rep.Results {
			if pred(r) {
				return true
			}
		}
		return false
	}
}

var brokenVariants = []brokenVariant{
	{"hijack-as-ok", "reports every hostPort hijack as ok",
		func(f *trace.Flow) []*trace.Flow {
			if f.Verdict == trace.VerdictHostportHijack {
				f.Verdict, f.Explanation = trace.VerdictOK, "ok: "+f.Orig.Dst+" was DNAT'd"
			}
			return one(f)
		},
		anyResult(func(r lab.Result) bool { return r.Verdict == trace.VerdictHostportHijack })},
	{"no-flows", "drops every flow",
		func(*trace.Flow) []*trace.Flow { return nil },
		anyResult(func(r lab.Result) bool { return r.Flows > 0 && !r.NoFlow() })},
	{"split", "reports each connection as two flows",
		func(f *trace.Flow) []*trace.Flow { return []*trace.Flow{f, cloneFlow(f)} },
		anyResult(func(r lab.Result) bool { return r.Flows > 0 })},
	{"no-rule", "names no rule",
		func(f *trace.Flow) []*trace.Flow { f.Rule = nil; return one(f) },
		anyResult(func(r lab.Result) bool { return flowChecked(r) && (r.Proof.Rule != nil || r.Proof.Owner != "") })},
	{"wrong-rule", "names the rule before the deciding one in its chain path",
		func(f *trace.Flow) []*trace.Flow {
			if f.Rule != nil && len(f.Rule.Path) > 1 {
				f.Rule.Chain = f.Rule.Path[len(f.Rule.Path)-2]
			}
			return one(f)
		},
		anyResult(func(r lab.Result) bool {
			return flowChecked(r) && r.Proof.Rule != nil && !r.Proof.Rule.BaseChain && r.Proof.Rule.Chain != "PREROUTING" && r.Proof.Rule.Chain != "OUTPUT"
		})},
	{"wrong-handle", "names the native rule after the deciding one (its handle plus one)",
		func(f *trace.Flow) []*trace.Flow {
			if f.Rule.NFTables() {
				f.Rule.Handle++
			}
			return one(f)
		},
		anyResult(func(r lab.Result) bool {
			return flowChecked(r) && r.Proof.Rule != nil && r.Proof.Rule.Backend == trace.BackendNFTables
		})},
	{"no-element-comment", "loses the comment of the map element that led to the native rule",
		func(f *trace.Flow) []*trace.Flow {
			if f.Rule.NFTables() && f.Rule.Element != nil {
				f.Rule.Element.Comment = ""
			}
			return one(f)
		},
		anyResult(func(r lab.Result) bool {
			return flowChecked(r) && r.Proof.Rule != nil && r.Proof.Rule.Element != nil && r.Proof.Rule.Element.Comment != ""
		})},
	{"wrong-pod", "names the source pod as the destination",
		func(f *trace.Flow) []*trace.Flow { f.DstPod = f.SrcPod; return one(f) },
		anyResult(func(r lab.Result) bool { return flowChecked(r) && r.Proof.DstPod != "" })},
	{"wrong-backend", "reports another real server in the reply tuple",
		func(f *trace.Flow) []*trace.Flow {
			if f.Reply != nil {
				f.Reply.Src = "10.255.255.1:1"
			}
			return one(f)
		},
		anyResult(func(r lab.Result) bool { return flowChecked(r) && r.Proof.Conntrack != nil })},
	{"false-alarm", "reports healthy flows as dropped",
		func(f *trace.Flow) []*trace.Flow {
			if f.Verdict == trace.VerdictOK {
				f.Verdict = trace.VerdictDropped
			}
			return one(f)
		},
		anyResult(func(r lab.Result) bool { return r.Flows > 0 && r.Verdict == trace.VerdictOK })},
}

func variantNamed(name string) (brokenVariant, bool) {
	for _, v := range brokenVariants {
		if v.name == name {
			return v, true
		}
	}
	return brokenVariant{}, false
}

func one(f *trace.Flow) []*trace.Flow { return []*trace.Flow{f} }

// cloneFlow deep-copies a flow through its trace encoding, which holds all
// of it.
func cloneFlow(f *trace.Flow) *trace.Flow {
	b, err := json.Marshal(f)
	if err != nil {
		panic(err) // a flow always encodes
	}
	c := new(trace.Flow)
	if err := json.Unmarshal(b, c); err != nil {
		panic(err)
	}
	return c
}

func parseLabOutput(t *testing.T, out []byte) (labResult, []*trace.Flow) {
	t.Helper()
	var res labResult
	var flows []*trace.Flow
	seen := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var typ struct{ Type string }
		if err := json.Unmarshal(sc.Bytes(), &typ); err != nil {
			t.Fatalf("not NDJSON: %v: %q", err, sc.Text())
		}
		switch typ.Type {
		case trace.TypeFlow:
			f := new(trace.Flow)
			if err := json.Unmarshal(sc.Bytes(), f); err != nil {
				t.Fatal(err)
			}
			flows = append(flows, f)
		case "lab":
			if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
				t.Fatal(err)
			}
			seen = true
		}
	}
	if !seen {
		t.Fatalf("no lab record in the output:\n%s", out)
	}
	return res, flows
}

// checkPredictions: what `tracer explain` said of each attempt from the
// node's state before any traffic is the verdict the lab then proved (and
// the live tracer gave: the lab checks that), and `tracer audit` of the
// same state found each proven problem at an address it walks.
func checkPredictions(t *testing.T, res labResult) {
	t.Helper()
	if res.Audit == nil || res.Audit.Error != "" {
		t.Fatalf("no audit: %+v", res.Audit)
	}
	agree, unsure := 0, 0
	defer func() {
		t.Logf("predictions: %d attempts, %d as the lab proved, %d otherwise and uncertain", len(res.Results), agree, unsure)
	}()
	for _, r := range res.Results {
		p, ok := predictionOf(res.Predictions, r.Expectation)
		if ok && p.Verdict == r.Verdict {
			agree++
		}
		switch {
		case !ok:
			t.Errorf("no prediction for %s %s -> %s", r.Proto, r.Src, r.Dst)
		case p.Verdict != r.Verdict && len(p.Uncertain) > 0:
			unsure++
			// Never a confident wrong answer: the prediction said why it
			// could be wrong.
			t.Logf("%s %s -> %s: predicted %s, uncertain %q; the lab proved %s", r.Proto, r.Src, r.Dst, p.Verdict, p.Uncertain, r.Verdict)
		case p.Verdict != r.Verdict:
			t.Errorf("%s %s -> %s: predicted %s (steps %q, error %q), certain, and the lab proved %s", r.Proto, r.Src, r.Dst, p.Verdict, p.Steps, p.Error, r.Verdict)
		}
	}
	benign := true
	for _, r := range res.Results {
		benign = benign && r.Verdict == trace.VerdictOK
	}
	certain := 0
	for _, f := range res.Audit.Findings {
		t.Logf("audit: %s %s %s %s from %v, uncertain %q", f.Severity, f.Verdict, f.Proto, f.To, f.From, f.Uncertain)
		if len(f.Uncertain) > 0 {
			continue
		}
		if f.Severity == audit.Problem {
			certain++
		}
		for _, r := range res.Results {
			if r.Proto == f.Proto && strings.HasPrefix(f.To, r.Dst+" (") && f.Verdict != r.Verdict {
				t.Errorf("audit says %s of %s %s, certain, and the lab proved %s for %s -> %s", f.Verdict, f.Proto, f.To, r.Verdict, r.Src, r.Dst)
			}
		}
	}
	if benign && certain > 0 {
		t.Errorf("audit found %d certain problem(s) on a scenario whose traffic is all healthy", certain)
	}
}

// predictionOf finds the prediction of the attempt: same protocol,
// destination and client address.
func predictionOf(ps []labPrediction, e lab.Expectation) (labPrediction, bool) {
	src := trace.ParseEndpoint(e.Src).Addr().String()
	for _, p := range ps {
		if p.Proto == e.Proto && p.Dst == e.Dst && p.Src == src {
			return p, true
		}
	}
	return labPrediction{}, false
}
