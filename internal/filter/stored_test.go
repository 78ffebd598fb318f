package filter

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// TestMatcherSearchesTheExplanationAroundTheClient: the Store keeps one
// explanation for flows that differ only in their client, with the
// client left out, so a free word that runs across the client's address
// is found only by searching around it. Every substring of one stored
// flow's explanation that reaches into its client (and a few that are
// nowhere) must get the same answer from the Matcher as from Match, for
// every flow of the shape.
func TestMatcherSearchesTheExplanationAroundTheClient(t *testing.T) {
	store := trace.NewStore()
	var flows []*trace.Flow
	for i := range 40 {
		client := fmt.Sprintf("10.244.%d.%d:%d", i%3, 10+i, 40000+i)
		seen := fmt.Sprintf("192.168.0.5:%d", 61000+i)
		f := &trace.Flow{Time: time.Date(2026, 12, 1, 0, 0, i, 0, time.UTC), Proto: "tcp", Orig: trace.Tuple{Src: client, Dst: "10.96.0.10:80"},
			Reply:   &trace.Tuple{Src: "10.244.9.9:8080", Dst: seen},
			Verdict: trace.VerdictOK, SrcPod: &trace.PodRef{Namespace: "a", Name: "client"},
			Explanation: "ok: 10.96.0.10:80 from " + client + " was DNAT'd to 10.244.9.9:8080 and masqueraded to " + seen + "(" + client + ")."}
		flows = append(flows, f)
		store.Append(f)
	}
	text := flows[7].Explanation
	words := map[string]bool{"nowhere": true, "DNAT'D": true, "from": true}
	for _, end := range []string{flows[7].Orig.Src, flows[7].Reply.Dst} {
		at := strings.Index(text, end)
		for lo := at - 6; lo < at+len(end); lo++ {
			for hi := max(lo+1, at+1); hi <= at+len(end)+6; hi++ {
				if w := strings.TrimSpace(text[lo:hi]); w != "" && !strings.Contains(w, " ") {
					words[strings.ToLower(w)] = true
				}
			}
		}
	}
	view := store.Snapshot()
	var sf trace.StoredFlow
	for i := range view.Len() {
		view.Load(i, &sf)
		if _, exact := sf.SharedExplanation(); exact {
			t.Fatalf("flow %d: the store keeps its explanation whole, not one template for all", i)
		}
	}
	found := 0
	for w := range words {
		f := MustParse(w)
		m := f.Matcher()
		for i := range view.Len() {
			view.Load(i, &sf)
			want := f.Match(flows[i])
			if got := m.Match(&sf); got != want {
				t.Errorf("%q, flow %d: Matcher %v, Match %v", w, i, got, want)
			}
			if want && i == 7 {
				found++
			}
		}
	}
	if found != len(words)-1 {
		t.Errorf("%d of %d words found in flow 7, want all but %q", found, len(words), "nowhere")
	}
	t.Logf("%d words", len(words))
}
