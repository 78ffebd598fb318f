package trace

// Verdict identifiers (SPEC.md "Verdicts"). They are stable: filters,
// scripts and recorded traces name them.
const (
	VerdictOK                 = "ok"
	VerdictHostportHijack     = "hostport-hijack"
	VerdictIPVSFilterReject   = "ipvs-filter-reject"
	VerdictClusterIPReject    = "clusterip-reject"
	VerdictIPVSNoEndpoint     = "ipvs-no-endpoint"
	VerdictServiceNoEndpoint  = "service-no-endpoint"
	VerdictReturnPathMismatch = "return-path-mismatch"
	VerdictConntrackTableFull = "conntrack-table-full"
	VerdictRejected           = "rejected"
	VerdictReset              = "reset"
	VerdictDropped            = "dropped"
)

// Verdicts lists every verdict, problems first in the order an on-call
// engineer looks for them, ok last. Adding a verdict means adding it here.
var Verdicts = []string{
	VerdictHostportHijack,
	VerdictIPVSFilterReject,
	VerdictClusterIPReject,
	VerdictIPVSNoEndpoint,
	VerdictServiceNoEndpoint,
	VerdictReturnPathMismatch,
	VerdictRejected,
	VerdictReset,
	VerdictDropped,
	VerdictConntrackTableFull,
	VerdictOK,
}

// KnownVerdict reports whether v is one of Verdicts.
func KnownVerdict(v string) bool {
	for _, k := range Verdicts {
		if k == v {
			return true
		}
	}
	return false
}

// Event kinds (Event.Kind).
const (
	KindDNAT       = "dnat"
	KindSNAT       = "snat"
	KindIPVS       = "ipvs"
	KindIPVSNoDest = "ipvs-no-dest"
	KindReject     = "reject"
	KindReset      = "reset"
	KindDrop       = "drop"
)

// Who sent a reset (Event.By).
const (
	ResetByNetfilter = "netfilter" // REJECT --reject-with tcp-reset
	ResetByStack     = "stack"     // the TCP stack
)

// Kinds lists every event kind.
var Kinds = []string{KindDNAT, KindSNAT, KindIPVS, KindIPVSNoDest, KindReject, KindReset, KindDrop}

// KnownKind reports whether k is one of Kinds.
func KnownKind(k string) bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}
