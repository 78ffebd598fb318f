package diagnose

import (
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// TestOKExplanationsWordForWord holds every form of an ok flow's
// explanation, and every form of its rule and conntrack evidence, to the
// letter: users paste them into tickets, and the text is built piece by
// piece in one buffer, where a lost space or full stop is easy to miss.
func TestOKExplanationsWordForWord(t *testing.T) {
	sepPath := []string{"PREROUTING", "KUBE-SERVICES", "KUBE-SVC-Y", "KUBE-SEP-X"}
	for _, tt := range []struct {
		name string
		f    func() *trace.Flow
		want string
	}{{
		name: "DNAT to a Service's pod, iptables rule, replied entry with a state",
		f: func() *trace.Flow {
			f := flow("tcp", "10.244.2.9:40000", "10.96.0.20:3306", "10.244.1.5:3306", trace.KindDNAT)
			f.Rule = &trace.Rule{Table: "nat", Chain: "KUBE-SEP-X", Path: sepPath, Text: "-A KUBE-SEP-X -p tcp -j DNAT --to-destination 10.244.1.5:3306"}
			f.Service = &trace.ServiceRef{Namespace: "ns-a", Name: "mysql-a"}
			f.DstPod = &trace.PodRef{Namespace: "ns-a", Name: "mysql-a-0"}
			f.Conntrack = &trace.Conntrack{Replied: true, State: "TIME_WAIT"}
			return f
		},
		want: "ok: 10.96.0.20:3306 (Service ns-a/mysql-a) from 10.244.2.9:40000 was DNAT'd to 10.244.1.5:3306 (pod ns-a/mysql-a-0). " +
			"Rule `-A KUBE-SEP-X -p tcp -j DNAT --to-destination 10.244.1.5:3306` (table nat, chain path PREROUTING → KUBE-SERVICES → KUBE-SVC-Y → KUBE-SEP-X). " +
			"Conntrack entry replied, state TIME_WAIT.",
	}, {
		name: "DNAT by a native nftables rule reached through a map element with a comment",
		f: func() *trace.Flow {
			f := flow("tcp", "[fd00:10:244:2::9]:40000", "[fd00:10:96::14]:3306", "[fd00:10:244:1::5]:3306", trace.KindDNAT)
			f.Rule = &trace.Rule{Backend: trace.BackendNFTables, Family: "ip6", Table: "kube-proxy", Chain: "endpoint-X", Handle: 42,
				Path: []string{"nat-prerouting", "services", "service-Y", "endpoint-X"}, Text: "ip6 daddr set fd00:10:244:1::5 dnat to [fd00:10:244:1::5]:3306",
				Element: &trace.RuleElement{Map: "service-ips", Key: `fd00:10:96::14 . tcp . 3306`, Comment: `ns-a/mysql-a:"db"`}}
			f.Conntrack = &trace.Conntrack{Replied: false}
			return f
		},
		want: "ok: [fd00:10:96::14]:3306 from [fd00:10:244:2::9]:40000 was DNAT'd to [fd00:10:244:1::5]:3306. " +
			"nftables rule `ip6 daddr set fd00:10:244:1::5 dnat to [fd00:10:244:1::5]:3306` (table ip6 kube-proxy, chain path nat-prerouting → services → service-Y → endpoint-X, handle 42), " +
			`reached through element fd00:10:96::14 . tcp . 3306 of map service-ips (comment "ns-a/mysql-a:\"db\""). ` +
			"Conntrack entry never replied (UNREPLIED).",
	}, {
		name: "a hostPort's DNAT that took only what was its own, entry and exit chain",
		f: func() *trace.Flow {
			f := flow("tcp", "10.0.0.9:40000", "10.0.0.1:8080", "10.244.1.5:80", trace.KindDNAT)
			f.Rule = &trace.Rule{Table: "nat", EntryChain: "CNI-HOSTPORT-DNAT", Chain: "CNI-DN-abc", Text: "-A CNI-DN-abc -p tcp --dport 8080 -j DNAT --to-destination 10.244.1.5:80"}
			return f
		},
		want: "ok: 10.0.0.1:8080 from 10.0.0.9:40000 was DNAT'd to 10.244.1.5:80. " +
			"a hostPort used as intended: nothing else owns that address and port. " +
			"Rule `-A CNI-DN-abc -p tcp --dport 8080 -j DNAT --to-destination 10.244.1.5:80` (table nat, chain path CNI-HOSTPORT-DNAT → CNI-DN-abc).",
	}, {
		name: "IPVS to a real server in a pod, forwarding method unreported",
		f: func() *trace.Flow {
			f := flow("tcp", "10.244.2.9:40000", "10.96.0.10:80", "10.244.1.5:8080", trace.KindIPVS)
			f.Events[0].To = "10.244.1.5:8080"
			f.DstPod = &trace.PodRef{Namespace: "web", Name: "web-1"}
			return f
		},
		want: "ok: IPVS sent 10.96.0.10:80 from 10.244.2.9:40000 to real server 10.244.1.5:8080 (pod web/web-1) (masq).",
	}, {
		name: "SNAT by an ip6tables rule whose attribution is uncertain",
		f: func() *trace.Flow {
			f := flow("tcp", "[fd00:10:244:1::5]:40000", "[2001:db8::1]:443", "", trace.KindSNAT)
			f.Events[0].To = "2001:db8:ffff::1"
			f.Rule = &trace.Rule{Family: "ip6", Table: "nat", Chain: "POSTROUTING", Text: "-A POSTROUTING -j MASQUERADE", Uncertain: "the rules changed since"}
			f.Conntrack = &trace.Conntrack{Replied: true}
			return f
		},
		want: "ok: [fd00:10:244:1::5]:40000 to [2001:db8::1]:443 leaves with source 2001:db8:ffff::1 (SNAT/MASQUERADE). " +
			"ip6tables rule `-A POSTROUTING -j MASQUERADE` (table nat, chain path POSTROUTING); attribution uncertain: the rules changed since. " +
			"Conntrack entry replied.",
	}, {
		name: "untranslated, nothing else known",
		f:    func() *trace.Flow { return flow("udp", "10.244.1.5:5353", "10.0.0.53:53", "") },
		want: "ok: 10.244.1.5:5353 to 10.0.0.53:53 passed untranslated.",
	}} {
		t.Run(tt.name, func(t *testing.T) {
			r := Diagnose(tt.f(), newEnv())
			if r.Verdict != trace.VerdictOK || r.Explanation != tt.want {
				t.Errorf("got %s: %q\nwant ok: %q", r.Verdict, r.Explanation, tt.want)
			}
		})
	}
}

// FuzzProseJoinsAsSentences: a prose written sentence by sentence says
// exactly what the plain rule for joining parts says (sentencesReference,
// the way sentences was written before it was built on prose).
func FuzzProseJoinsAsSentences(f *testing.F) {
	f.Add("ok: a", " ", "Rule `x`.", "")
	f.Add("", "  b  ", "c.", "d")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		p := newProse()
		for _, s := range []string{a, b, c, d} {
			p.sentence(s)
		}
		if got, want := p.done(), sentencesReference(a, b, c, d); got != want {
			t.Fatalf("prose %q, the joining rule %q", got, want)
		}
	})
}

// sentencesReference joins the non-empty parts, trimmed of spaces, with
// spaces, each ending in a full stop.
func sentencesReference(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(p)
		if !strings.HasSuffix(p, ".") {
			b.WriteByte('.')
		}
	}
	return b.String()
}
