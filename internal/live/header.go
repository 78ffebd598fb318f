package live

import (
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/trace"
)

// HookRecords turns the attach plan into the trace header's hook list: the
// method each hook uses and, in words, why better ones failed.
func HookRecords(p loader.Plan) []trace.Hook {
	out := make([]trace.Hook, 0, len(p))
	for _, h := range p {
		rec := trace.Hook{Hook: h.Hook.String(), Via: h.Via.String(), Target: h.Target}
		var why, plain []string
		for _, a := range h.Attempts {
			ar := trace.Attempt{Via: a.Via.String(), Target: a.Target}
			if a.Err != nil {
				ar.Error = a.Err.Error()
				e := h.Explain(a)
				why = append(why, a.Via.String()+": "+e)
				plain = append(plain, e)
			}
			rec.Attempts = append(rec.Attempts, ar)
		}
		if len(dedup(plain)) == 1 {
			why = plain[:1] // every method failed for the same reason
		}
		rec.Error = strings.Join(dedup(why), "; ")
		if h.Hook == event.HookCTDestroy && h.Via == event.ViaNone && !h.NotAsked {
			rec.Error += "; conntrack trackers subscribe to ctnetlink's DESTROY events instead"
		}
		out = append(out, rec)
	}
	return out
}

func dedup(s []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// KernelRelease is uname -r.
func KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}
