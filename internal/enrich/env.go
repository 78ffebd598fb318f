// Package enrich is the stage after the join (internal/join): it finds
// the rule that made each flow's decision, names the pods and the
// Service, and asks internal/diagnose for the verdict. The same Enrich
// step re-diagnoses a recorded flow against a trace's snapshot.
package enrich

import (
	"net/netip"
	"time"

	"github.com/tracer-dev/tracer/internal/diagnose"
	"github.com/tracer-dev/tracer/internal/nft"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Env is everything enrichment consults besides the flow: node state (rules,
// ipsets, addresses, IPVS, listeners) and cluster metadata. The live
// pipeline builds it from the node watcher and the metadata index; replay
// builds it from a trace header's snapshot.
type Env interface {
	diagnose.Env
	// NodeState answers the rule evaluator's questions (LOCAL addresses,
	// ipset membership).
	rules.NodeState
	// Ruleset is the node's iptables rules of one family, or nil when
	// they are unknown (then attribution is skipped, never guessed).
	Ruleset(f rules.Family) *rules.Ruleset
	// NFTRuleset is the node's native nftables tables: nil when there are
	// none (or nft could not be asked), an error when the ruleset was read
	// but could not be understood.
	NFTRuleset() (*nft.Ruleset, error)
	// PodByIP names the pod that held address a at time at.
	PodByIP(a netip.Addr, at time.Time) (trace.PodRef, bool)
	// ServiceByAddr names the Service a client addressed at a:port
	// (ClusterIP, externalIP, LB IP, or a NodePort on a node address).
	ServiceByAddr(a netip.Addr, port uint16, proto string, at time.Time) (trace.ServiceRef, bool)
}
