package mix

import (
	"encoding/binary"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

func TestEncodeDecodes(t *testing.T) {
	for i := range Shapes {
		for _, e := range Flow(i) {
			got, err := event.Decode(Encode(nil, e, 5), event.Clock{})
			if err != nil {
				t.Fatalf("flow %d: %v", i, err)
			}
			e.Time = got.Time
			if e.Kind != event.KindIPVS {
				got.To.MaxAddr, got.To.MaxPort = e.To.MaxAddr, e.To.MaxPort
			}
			if !reflect.DeepEqual(got, e) {
				t.Errorf("flow %d:\n got %+v\nwant %+v", i, got, e)
			}
		}
	}
}

func TestPipelineVerdicts(t *testing.T) {
	env, err := Env()
	if err != nil {
		t.Fatal(err)
	}
	var flows []*trace.Flow
	p, err := NewPipeline(io.Discard, env)
	if err != nil {
		t.Fatal(err)
	}
	emit := p.J.Emit
	p.J.Emit = func(f *trace.Flow) { flows = append(flows, f); emit(f) }
	for _, r := range Records(Shapes*3, time.Millisecond) {
		p.Feed(r)
	}
	p.Finish()
	if p.Errors != 0 || p.Events != 3*EventsPerCycle || len(flows) != 3*Shapes {
		t.Fatalf("errors %d events %d flows %d", p.Errors, p.Events, len(flows))
	}
	verdicts := map[string]int{}
	rules := 0
	for _, f := range flows {
		verdicts[f.Verdict]++
		if f.Rule != nil {
			rules++
		}
	}
	t.Logf("verdicts %v, %d of %d flows attributed to a rule", verdicts, rules, len(flows))
	if len(verdicts) < 3 || rules == 0 {
		t.Errorf("the mix should diagnose several verdicts and attribute rules: %v, %d rules", verdicts, rules)
	}
}

// BenchmarkPipeline is decode -> trace form -> join -> enrich/diagnose ->
// encode (to io.Discard) per event, on one goroutine: what the live
// pipeline does per ring buffer record. Events arrive 10 µs apart in the
// events' clock (100,000 events/s), so about 60,000 flows are open at once.
func BenchmarkPipeline(b *testing.B) {
	env, err := Env()
	if err != nil {
		b.Fatal(err)
	}
	const gap = 10 * time.Microsecond
	recs := Records(200_000, gap)
	p, err := NewPipeline(io.Discard, env)
	if err != nil {
		b.Fatal(err)
	}
	ts := uint64(time.Second)
	i := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r := recs[i]
		binary.LittleEndian.PutUint64(r[event.OffTsNs:], ts)
		p.Feed(r)
		ts += uint64(gap)
		if i++; i == len(recs) {
			i = 0
		}
	}
	b.StopTimer()
	if p.Errors != 0 {
		b.Fatalf("%d errors", p.Errors)
	}
	b.ReportMetric(float64(p.Events)/b.Elapsed().Seconds(), "events/s")
}
