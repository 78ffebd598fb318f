package live

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/event/eventtest"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/tests/vm/guest"
)

// mixStages runs the generated mix through stages as Run does, writing
// to tw; Feed takes one raw record, st.stop ends them.
type mixStages struct {
	mix.Feeder
	st *stages
	tw *trace.Writer
}

func newMixStages(t testing.TB, w io.Writer) *mixStages {
	env, err := mix.Env()
	if err != nil {
		t.Fatal(err)
	}
	tw, err := trace.NewWriter(w, trace.Header{Node: mix.Node})
	if err != nil {
		t.Fatal(err)
	}
	m := &mixStages{tw: tw}
	sink := Sink{Flow: func(f *trace.Flow) {
		if err := tw.WriteFlow(f); err != nil {
			m.Errors++
		}
	}}
	m.st = newStages(&join.Joiner{Linger: join.DefaultLinger, Names: mix.Names{}, ReuseFlows: true},
		&enrich.Enricher{Env: func(time.Time) enrich.Env { return env }}, sink, func() {})
	return m
}

func BenchmarkStages(b *testing.B) {
	const gap = 10 * time.Microsecond
	replay := mix.NewReplay(mix.Records(200_000, gap), gap)
	m := newMixStages(b, io.Discard)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		m.Feed(replay.Next(), m.st)
	}
	m.st.stop()
	b.StopTimer()
	b.ReportMetric(float64(m.Events)/b.Elapsed().Seconds(), "events/s")
}

// The stages on two goroutines write the mix byte for byte as the join
// and the enricher on one do (bench/mix's Pipeline, enrich.Stages): the
// same flows, in the same order, with the same attribution and
// diagnosis, while the join reuses the records the writer is done with.
func TestStagesWriteWhatOneGoroutineWrites(t *testing.T) {
	guest.SkipKernelIndependent(t)
	const n, gap = 40_000, 10 * time.Microsecond
	recs := mix.Records(n, gap)
	env, err := mix.Env()
	if err != nil {
		t.Fatal(err)
	}
	var one, two bytes.Buffer
	p, err := mix.NewPipeline(&one, env)
	if err != nil {
		t.Fatal(err)
	}
	m := newMixStages(t, &two)
	for _, r := range recs {
		p.Feed(r)
		m.Feed(r, m.st)
	}
	p.Finish()
	flows, _ := m.st.stop()
	if err := errors.Join(p.W.Close(), m.tw.Close()); err != nil {
		t.Fatal(err)
	}
	if p.Errors != 0 || m.Errors != 0 || flows != p.Flows || flows == 0 {
		t.Fatalf("errors %d and %d; flows %d on one goroutine, %d on two", p.Errors, m.Errors, p.Flows, flows)
	}
	lines := func(b *bytes.Buffer) [][]byte {
		return bytes.Split(bytes.TrimSuffix(b.Bytes(), []byte("\n")), []byte("\n"))
	}
	a, b := lines(&one), lines(&two)
	if len(a) != len(b) {
		t.Fatalf("%d lines on one goroutine, %d on two", len(a), len(b))
	}
	for i := 1; i < len(a)-1; i++ { // the header's and summary's times differ
		if !bytes.Equal(a[i], b[i]) {
			t.Fatalf("line %d of %d differs:\none goroutine: %s\ntwo:           %s", i, len(a), a[i], b[i])
		}
	}
}

// A flow whose rule is uncertain is held by the presenter across rounds
// while the join goes on: the flows finishing meanwhile leave in order,
// in records the join reuses, and the held one leaves, settled by the
// next reading, as it was held, its record not reused.
func TestStagesHoldAFlowAcrossRounds(t *testing.T) {
	guest.SkipKernelIndependent(t)
	inForce, certain := vipEnv(t, "10.0.0.1:80"), vipEnv(t, "10.0.0.2:80")
	env := inForce
	var next enrich.Env
	var out []string
	flushed := make(chan struct{})
	sink := Sink{Flow: func(f *trace.Flow) {
		b, err := json.Marshal(f)
		if err != nil {
			t.Error(err)
		}
		out = append(out, string(b))
	}, Flush: func() { flushed <- struct{}{} }}
	e := &enrich.Enricher{HoldFor: 3 * time.Second,
		Env: func(time.Time) enrich.Env { return env }, EnvAfter: func(time.Time) enrich.Env { return next }}
	st := newStages(&join.Joiner{Linger: time.Second, ReuseFlows: true}, e, sink, func() {})
	// round expires the join at at and waits for the presenter's round:
	// what the sink was handed is then safe to read.
	round := func(at time.Time) {
		st.Expire(at)
		<-flushed
	}
	t0 := time.Unix(1700000000, 0)
	st.Add(dnatAt("10.1.0.9:40000", t0), t0)
	round(t0.Add(1100 * time.Millisecond))
	if len(out) != 0 {
		t.Fatalf("%d flows out: the uncertain flow was not held", len(out))
	}
	env = certain
	for i := range 5 {
		at := t0.Add(time.Duration(2+i) * 100 * time.Millisecond)
		st.Add(dnatAt(fmt.Sprintf("10.1.0.%d:%d", 10+i, 41000+i), at), at)
		round(at.Add(1100 * time.Millisecond))
	}
	if len(out) != 5 {
		t.Fatalf("%d flows out; want the 5 certain ones", len(out))
	}
	next = certain
	round(t0.Add(3 * time.Second))
	if len(out) != 6 {
		t.Fatalf("%d flows out in the round after the next reading; want the held one too, 6", len(out))
	}
	go func() {
		for range flushed {
		}
	}()
	st.stop()
	close(flushed)
	if len(out) != 6 {
		t.Fatalf("%d flows out after the next reading; want 6", len(out))
	}
	for i, s := range out[:5] {
		if !strings.Contains(s, fmt.Sprintf(`"src":"10.1.0.%d:%d"`, 10+i, 41000+i)) {
			t.Errorf("flow %d reads %s", i, s)
		}
	}
	held := out[5]
	if !strings.Contains(held, `"src":"10.1.0.9:40000"`) || strings.Count(held, `"kind":"dnat"`) != 1 ||
		!strings.Contains(held, "--to-destination 10.0.0.2:80") || strings.Contains(held, `"uncertain"`) {
		t.Errorf("the held flow left as %s; want its own event, with the next reading's rule, certain", held)
	}
}

func dnatAt(src string, at time.Time) event.Event {
	ev := eventtest.DNAT(src, "10.96.0.1:80", "10.0.0.2:80")
	ev.Time = at
	return ev
}

func vipEnv(t *testing.T, backend string) enrich.Env {
	t.Helper()
	rules := "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n" +
		"-A PREROUTING -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination " + backend + "\nCOMMIT\n"
	env, err := enrich.NewNodeEnv("node-1", &trace.Snapshot{Rules: map[string]string{"nat": rules}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return env
}
