package event

import (
	"slices"
	"testing"
)

func TestCTStatusNames(t *testing.T) {
	const status = 1<<1 | 1<<3 | 1<<5 | 1<<20 // SEEN_REPLY, CONFIRMED, DST_NAT and an unknown bit
	want := []string{"SEEN_REPLY", "CONFIRMED", "DST_NAT"}
	first := CTStatusNames(status)
	if !slices.Equal(first, want) {
		t.Fatalf("CTStatusNames = %q, want %q", first, want)
	}
	// The list is shared: one caller's append must not reach another's.
	mine := append(CTStatusNames(status), "MINE")
	_ = append(CTStatusNames(status), "THEIRS")
	if !slices.Equal(mine, append(want, "MINE")) {
		t.Errorf("after another caller's append: %q, want %q", mine, append(want, "MINE"))
	}
	if got := CTStatusNames(0); len(got) != 0 {
		t.Errorf("CTStatusNames(0) = %q, want none", got)
	}
}
