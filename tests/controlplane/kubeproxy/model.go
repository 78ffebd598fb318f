package kubeproxy

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Model is a normalised structural view of the state kube-proxy (or a
// stand-in for it) leaves on a node, in the terms the tracer reads it:
// Facts are single things (a chain's hook, a set's type, an element's
// verdict, an IPVS real server), keyed by what they are; Chains are the
// rules of each chain in their order. Names derived from hashes are
// replaced by the Service port or endpoint they belong to (Idents), so a
// difference names the Service, and a wrong hash is a difference of its
// own.
type Model struct {
	Facts  map[string]string
	Chains map[string][]string
}

func newModel() *Model {
	return &Model{Facts: map[string]string{}, Chains: map[string][]string{}}
}

// Difference is one way two models differ: Where names the chain, rule,
// set or fact, What says how.
type Difference struct {
	Where, What string
}

func (d Difference) String() string { return d.Where + ": " + d.What }

// Diff lists every difference between real (what kube-proxy wrote) and
// got (the stand-in), sorted by Where.
func Diff(real, got *Model) []Difference {
	var out []Difference
	for _, k := range unionKeys(real.Facts, got.Facts) {
		r, inReal := real.Facts[k]
		g, inGot := got.Facts[k]
		switch {
		case !inGot:
			out = append(out, Difference{k, "only in kube-proxy: " + r})
		case !inReal:
			out = append(out, Difference{k, "only in the stand-in: " + g})
		case r != g:
			out = append(out, Difference{k, fmt.Sprintf("kube-proxy %q, stand-in %q", r, g)})
		}
	}
	for _, k := range unionKeys(real.Chains, got.Chains) {
		r, inReal := real.Chains[k]
		g, inGot := got.Chains[k]
		switch {
		case !inGot:
			out = append(out, Difference{"chain " + k, fmt.Sprintf("only in kube-proxy (%d rules)", len(r))})
		case !inReal:
			out = append(out, Difference{"chain " + k, fmt.Sprintf("only in the stand-in (%d rules)", len(g))})
		default:
			out = append(out, ruleDiff("chain "+k, r, g)...)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Where < out[j].Where })
	return out
}

func unionKeys[V any](a, b map[string]V) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// ruleDiff aligns two chains' rules (longest common subsequence, since
// rule order matters) and names each rule only one side has, by its
// position on that side; a rule replaced at the same place is one
// difference saying which parts differ.
func ruleDiff(where string, real, got []string) []Difference {
	lcs := make([][]int, len(real)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(got)+1)
	}
	for i := len(real) - 1; i >= 0; i-- {
		for j := len(got) - 1; j >= 0; j-- {
			if real[i] == got[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []Difference
	i, j := 0, 0
	for i < len(real) || j < len(got) {
		switch {
		case i < len(real) && j < len(got) && real[i] == got[j]:
			i, j = i+1, j+1
		case i < len(real) && j < len(got) && lcs[i+1][j+1] == lcs[i][j]:
			out = append(out, Difference{fmt.Sprintf("%s rule %d", where, i+1),
				fmt.Sprintf("kube-proxy %q, stand-in %q (%s)", real[i], got[j], partsDiff(real[i], got[j]))})
			i, j = i+1, j+1
		case j == len(got) || i < len(real) && lcs[i+1][j] >= lcs[i][j+1]:
			out = append(out, Difference{fmt.Sprintf("%s rule %d", where, i+1), "only in kube-proxy: " + real[i]})
			i++
		default:
			out = append(out, Difference{fmt.Sprintf("%s rule %d", where, j+1), "only in the stand-in: " + got[j]})
			j++
		}
	}
	return out
}

// partsDiff names the words of a rule only one side has.
func partsDiff(real, got string) string {
	r, g := strings.Fields(real), strings.Fields(got)
	var onlyR, onlyG []string
	for _, w := range r {
		if !slices.Contains(g, w) {
			onlyR = append(onlyR, w)
		}
	}
	for _, w := range g {
		if !slices.Contains(r, w) {
			onlyG = append(onlyG, w)
		}
	}
	if len(onlyR)+len(onlyG) == 0 {
		return "same words, another order"
	}
	return fmt.Sprintf("kube-proxy has %q, stand-in has %q", strings.Join(onlyR, " "), strings.Join(onlyG, " "))
}

// KnownDifference is a difference the stand-in has on purpose, matched
// exactly (Difference.String()), with why.
type KnownDifference struct {
	Difference string
	Reason     string
}

// Unexplained returns the differences no known one matches, and the known
// ones that did not occur (a list that no longer describes the stand-in
// must be corrected, not kept).
func Unexplained(diffs []Difference, known []KnownDifference) (unexplained []Difference, unused []KnownDifference) {
	used := make([]bool, len(known))
	for _, d := range diffs {
		i := slices.IndexFunc(known, func(k KnownDifference) bool { return k.Difference == d.String() })
		if i < 0 {
			unexplained = append(unexplained, d)
			continue
		}
		used[i] = true
	}
	for i, k := range known {
		if !used[i] {
			unused = append(unused, k)
		}
	}
	return unexplained, unused
}

// Idents maps the hash-derived chain names of kube-proxy's iptables and
// nftables modes to the Service port or endpoint they belong to.
type Idents struct {
	names map[string]string
}

// ServicePortID is one Service port, as kube-proxy names it, and its
// endpoints ("ip:port").
type ServicePortID struct {
	Namespace, Name, Port, Proto string
	Endpoints                    []string
}

// PortName is kube-proxy's ServicePortName.String(): "ns/name:port".
func (p ServicePortID) PortName() string { return p.Namespace + "/" + p.Name + ":" + p.Port }

// NewIdents computes, for every Service port, the iptables-mode chain
// names (pkg/proxy/iptables portProtoHash and
// servicePortEndpointChainName, v1.37.2).
func NewIdents(ports []ServicePortID) *Idents {
	id := &Idents{names: map[string]string{}}
	for _, p := range ports {
		name := p.PortName()
		h := b32sha(name + p.Proto)[:16]
		for _, prefix := range []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-"} {
			id.names[prefix+h] = prefix + "{" + name + "}"
		}
		for _, ep := range p.Endpoints {
			id.names["KUBE-SEP-"+b32sha(name + p.Proto + ep)[:16]] = "KUBE-SEP-{" + name + " " + ep + "}"
		}
	}
	return id
}

func b32sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])
}

var (
	iptHashed = regexp.MustCompile(`\bKUBE-(SVC|SVL|EXT|FW|SEP)-[A-Z2-7]{16}\b`)
	// nftHashed is kube-proxy nftables mode's hashAndTruncate names:
	// "service-HASH-ns/name/proto/port" and the like.
	nftHashed = regexp.MustCompile(`\b(service|external|local|firewall|endpoint)-([A-Z2-7]{8})-([^\s,;}]+)`)
)

// IPTables replaces every hash-named chain in s by its identity; a name no
// Service port has stays as it is (and so differs).
func (id *Idents) IPTables(s string) string {
	return iptHashed.ReplaceAllStringFunc(s, func(name string) string {
		if n, ok := id.names[name]; ok {
			return n
		}
		return name
	})
}

// NFTIdent replaces "service-HASH-rest" by "service-{rest}" where HASH is
// kube-proxy's hash of rest, and by "service-{rest}#HASH-is-not-its-hash"
// otherwise, so a wrong hash differs.
func NFTIdent(s string) string {
	return nftHashed.ReplaceAllStringFunc(s, func(name string) string {
		m := nftHashed.FindStringSubmatch(name)
		if b32sha(m[3])[:8] == m[2] {
			return m[1] + "-{" + m[3] + "}"
		}
		return m[1] + "-{" + m[3] + "}#" + m[2] + "-is-not-its-hash"
	})
}
