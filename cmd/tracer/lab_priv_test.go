package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/lab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TestLabScenarios runs `tracer lab SCENARIO -o json` for every scenario:
// the incident is built for real, traced, and every flow the scenario
// expects must carry its verdict and the explanation's key facts (the lab
// checks that itself and exits non-zero otherwise); here we also check the
// attribution of every flow whose verdict rests on a rule. Scenarios that
// need IPVS skip on kernels without it and run in the VM matrix.
func TestLabScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("privileged tier: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged tier: needs root")
	}
	for _, sc := range lab.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := dispatch(t.Context(), []string{"lab", "-o", "json", sc.Name}, &out, &errb)
			res, flows := parseLabOutput(t, out.Bytes())
			if res.Skipped != "" {
				if sc.NeedsIPVS && os.Getenv("TRACER_VM_KERNEL") == "" {
					t.Skipf("kernel without IPVS: %s", res.Skipped)
				}
				t.Fatalf("skipped where it must run: %s", res.Skipped)
			}
			for _, c := range res.Checks {
				t.Logf("%-5s %s %s -> %s: want %s, got %q %v %s", okWord(c.OK), c.Proto, c.Src, c.Dst, c.Verdict, c.Got, c.Missing, c.Unobservable)
			}
			if code != 0 || !res.OK {
				t.Fatalf("lab %s: exit %d, checks failed; stderr: %s", sc.Name, code, errb.String())
			}
			if len(res.Checks) == 0 {
				t.Fatal("the scenario checked nothing")
			}
			baseline := false
			for _, c := range res.Checks {
				baseline = baseline || c.Baseline
			}
			if !baseline {
				t.Error("the scenario has no baseline traffic to show healthy flows stay ok")
			}
			for _, f := range flows {
				checkAttribution(t, f)
			}
		})
	}
}

func okWord(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAIL"
}

// checkAttribution: verdicts that rest on a rule must name it, with its
// chain path; a hostPort rule must name its owner.
func checkAttribution(t *testing.T, f *trace.Flow) {
	t.Helper()
	switch f.Verdict {
	case trace.VerdictHostportHijack:
		if f.Rule == nil || !strings.HasPrefix(f.Rule.Chain, "CNI-DN-") || f.Rule.EntryChain != "CNI-HOSTPORT-DNAT" ||
			f.Rule.Owner == nil || f.Rule.Owner.ContainerID == "" || f.Rule.Owner.Pod == nil || f.DstPod == nil {
			t.Errorf("hijack flow %s -> %s without full attribution: rule %+v dst_pod %+v", f.Orig.Src, f.Orig.Dst, f.Rule, f.DstPod)
		}
	case trace.VerdictIPVSFilterReject:
		if f.Rule == nil || f.Rule.Chain != "KUBE-IPVS-FILTER" || !strings.Contains(f.Rule.Text, "-j REJECT") {
			t.Errorf("filter reject %s -> %s: rule %+v", f.Orig.Src, f.Orig.Dst, f.Rule)
		}
	case trace.VerdictRejected, trace.VerdictDropped:
		if f.Rule == nil || f.Rule.Text == "" || len(f.Rule.Path) == 0 {
			t.Errorf("%s %s -> %s: no rule", f.Verdict, f.Orig.Src, f.Orig.Dst)
		}
	}
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
