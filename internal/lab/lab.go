// Package lab rebuilds the incidents of ../shared/INCIDENTS.md for real in
// throwaway network namespaces: node namespaces with a cni0 bridge and pods
// made by the real CNI plugins (bridge, host-local, portmap), kube-proxy's
// IPVS-mode state (kube-ipvs0, ipsets, iptables, IPVS virtual servers where
// the kernel has IPVS), Go servers in the pods that answer with the pod's
// name, and Go clients that report what they really saw. The nft-*
// scenarios run the same incidents on nftables nodes: kube-proxy v1.37.2's
// nftables mode and portmap v1.10.0's or v1.8.0's nftables backend, whose
// tables the lab writes in exactly the shape those programs write.
//
// Around every attempt the lab reads what the node did with the node's own
// tools (rule counters, IPVS's connection table, the conntrack tool, SNMP
// counters) into the attempt's Proof. The tracer itself is not part of this
// package: `tracer lab` builds a Scenario, attaches the tracer to
// Built.Observe, runs Built.Traffic and hands the Expectations and the
// tracer's flows to Check, which fails an incident that did not happen, a
// flow that disagrees with the proof, and a problem flow nothing explains.
package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Prefix starts the name of every namespace the lab creates, so Cleanup
// (and the next run) can find what a crashed run left behind.
const Prefix = "trlab"

// stateRoot holds the only files the lab writes outside namespaces: the
// host-local IPAM plugin's allocations (its dataDir).
const stateRoot = "/run/trlab"

// ErrNeedsIPVS is wrapped by Build when the scenario cannot show its
// incident without the kernel's IPVS.
var ErrNeedsIPVS = errors.New("scenario needs IPVS")

// ErrNeedsBridgeNetfilter is wrapped by Build when the kernel does not pass
// bridged traffic through netfilter (br_netfilter not loaded). A
// Kubernetes node always does; without it a pod's reply to another pod on
// its bridge skips conntrack, so the DNATs of portmap's and kube-proxy's
// nftables rules, which masquerade only a pod's traffic to itself, cannot
// be undone and the scenario's connections time out. The lab does not
// load the module.
var ErrNeedsBridgeNetfilter = errors.New("scenario needs br_netfilter (bridged traffic through netfilter, as on every Kubernetes node)")

// Outcomes a client reports.
const (
	OutcomeRefused     = "refused"
	OutcomeReset       = "reset"
	OutcomeTimeout     = "timeout"
	OutcomeUnreachable = "icmp port unreachable"
	OutcomeEchoReply   = "echo reply"
)

// Connected is the outcome of a TCP connection (or UDP exchange) answered
// by the named pod.
func Connected(pod string) string { return "connected to " + pod }

// connectedToOneOf is the outcome of an attempt any of pods may answer,
// until one has.
func connectedToOneOf(pods []string) string { return "connected to one of " + strings.Join(pods, ", ") }

// narrow settles an OneOf attempt's outcome on the pod that answered, if
// it is one of them.
func (e *Expectation) narrow() {
	for _, p := range e.OneOf {
		if e.Saw == Connected(p) {
			e.Outcome = e.Saw
		}
	}
}

// Scenario is one incident rebuilt in namespaces.
type Scenario struct {
	Name  string // stable identifier, e.g. "hostport-hijack-clusterip"
	Title string // one line
	Shows string // what it demonstrates, the seed it comes from, and which kube-proxy mode ran
	// NeedsIPVS: Build wraps ErrNeedsIPVS when the kernel has no IPVS.
	NeedsIPVS bool
	// NoIPVS says how the scenario degrades on a kernel without IPVS.
	NoIPVS string
	// Healthy: the scenario has no incident, only traffic the tracer must
	// call ok (it shows that a healthy path raises no alarm).
	Healthy bool
	Build   func(ctx context.Context, env *Env) (*Built, error)
}

// Built is a scenario standing in its namespaces.
type Built struct {
	Node netlab.Namespace // the namespace the tracer observes
	// Observe lists every namespace whose netfilter hooks must be attached.
	Observe []netlab.Namespace
	// MetadataJSON is shaped like `kubectl get pods,services,endpointslices
	// -A -o json`, with the addresses the CNI plugins really assigned.
	MetadataJSON []byte
	NodeName     string
	// Mode says how kube-proxy's service handling ran: "ipvs", "iptables
	// stand-in for IPVS" (kernel without IPVS), "nftables (kube-proxy
	// v1.37.2)" or "no kube-proxy", and which portmap nftables backend
	// wrote the hostPorts when one did.
	Mode string
	// Planned are the connections Traffic will attempt, in order, known
	// before any is made: what `tracer explain` can be asked about.
	Planned []Planned
	// Traffic makes the scenario's traffic and proves what the node did
	// with each attempt; call it once tracing is attached.
	Traffic func(ctx context.Context) ([]Expectation, error)
	// Close removes everything the scenario created.
	Close func() error

	cluster *cluster
}

// Planned is one connection attempt before it is made: its protocol, the
// client's address (its port is not chosen yet) and the destination as
// Expectation.Dst will have it.
type Planned struct {
	Proto string
	Src   string
	Dst   string
}

// Expectation is one connection attempt of Traffic: what the client should
// see, how the node must have handled it (Mechanism), what the lab read from
// the node to prove it (Proof), and the verdict the tracer must give it.
type Expectation struct {
	Proto   string `json:"proto"` // tcp, udp, icmp
	Src     string `json:"src"`   // as the client sent it: "IP:PORT" (ICMP: "IP")
	Dst     string `json:"dst"`
	Verdict string `json:"verdict"`
	Outcome string `json:"outcome"` // what the client should see if the incident is reproduced
	// OneOf are the pods any of which may answer (a Service whose kube-proxy
	// picks an endpoint at random): Outcome becomes the one that did.
	OneOf []string `json:"one_of,omitempty"`
	Saw   string   `json:"saw"`            // what the client really saw
	Note  string   `json:"note,omitempty"` // one line: why this outcome
	// Mechanism is how the node must have handled the attempt.
	Mechanism Mechanism `json:"mechanism"`
	Proof     Proof     `json:"proof"`
	// Unproven lists what Mechanism needs that the node did not show.
	Unproven []string `json:"unproven,omitempty"`
}

// Reproduced says whether the incident (or the healthy baseline) really
// happened: the client saw what the scenario intends, and the node's own
// counters and tables show the mechanism.
func (e Expectation) Reproduced() bool { return e.Saw == e.Outcome && len(e.Unproven) == 0 }

// Baseline says the attempt is the scenario's healthy traffic: the tracer
// must call it ok.
func (e Expectation) Baseline() bool { return e.Verdict == trace.VerdictOK }

// NoFlow says the kernel makes no decision the tracer reports for this
// attempt, so no flow is required (one that is reported must be ok).
func (e Expectation) NoFlow() bool { return e.Mechanism == NoDecision }

// Env is what Build needs to know about the machine.
type Env struct {
	CNIPath string // directory of the CNI plugins
	IPVS    bool   // the kernel has IPVS (ip_vs loaded)
	// IPVSReason says why IPVS is not available.
	IPVSReason string
	// Dummy: the kernel has the dummy link driver kube-proxy uses for
	// kube-ipvs0; otherwise a bridge left down stands in.
	Dummy bool
}

// NewEnv probes the machine once: it tries `modprobe ip_vs` and whether a
// dummy link can be created inside a throwaway namespace.
func NewEnv() (*Env, error) {
	env := &Env{CNIPath: "/usr/lib/cni"}
	for _, tool := range []string{"ip", "iptables", "iptables-save", "iptables-restore", "ipset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("lab needs %s: %w (install iptables, ipset, iproute2)", tool, err)
		}
	}
	for _, p := range []string{"bridge", "host-local", "portmap"} {
		if _, err := os.Stat(env.CNIPath + "/" + p); err != nil {
			return nil, fmt.Errorf("lab needs the CNI plugin %s: %w (install containernetworking-plugins)", p, err)
		}
	}
	env.IPVS, env.IPVSReason = probeIPVS()
	dummy, err := probeDummy()
	if err != nil {
		return nil, err
	}
	env.Dummy = dummy
	return env, nil
}

// probeIPVS loads ip_vs once; /proc/net/ip_vs exists once it is loaded
// (or built in).
func probeIPVS() (bool, string) {
	out, modErr := exec.Command("modprobe", "ip_vs").CombinedOutput()
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		if _, err := exec.LookPath("ipvsadm"); err != nil {
			return false, "ipvsadm is not installed"
		}
		return true, ""
	}
	reason := "this kernel has no IPVS"
	if modErr != nil {
		reason += ": modprobe ip_vs: " + strings.TrimSpace(string(out))
	}
	return false, reason
}

// probeName names the throwaway namespace of probeDummy.
const probeName = "probe"

// probeDummy tries a dummy link in a throwaway namespace, so the host's own
// namespace is never touched.
func probeDummy() (bool, error) {
	l, err := netlab.New(Prefix + "-" + probeName)
	if err != nil {
		return false, fmt.Errorf("probe dummy driver: %w", err)
	}
	defer l.Close()
	ns, err := l.Namespace("dummy")
	if err != nil {
		return false, fmt.Errorf("probe dummy driver: %w", err)
	}
	_, err = ns.Run("ip", "link", "add", "probe0", "type", "dummy")
	return err == nil, nil
}

// Cleanup removes every leftover of every scenario: the namespaces named
// with Prefix and the IPAM state directory.
func Cleanup() error {
	errs := []error{netlab.Cleanup(Prefix)}
	if err := os.RemoveAll(stateRoot); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", stateRoot, err))
	}
	return errors.Join(errs...)
}

// Lookup finds a scenario by name.
func Lookup(name string) (Scenario, bool) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}
