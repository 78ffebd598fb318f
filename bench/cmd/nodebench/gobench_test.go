package main

import "testing"

// A benchmark's rate is its rate column even when another custom metric
// sorts before it, as allocs/event does before events/s.
func TestParseGoBenchRate(t *testing.T) {
	out := "goos: linux\n" +
		"BenchmarkPipeline \t 1500000\t      3486 ns/op\t         5.953 allocs/event\t    286872 events/s\t         0.6873 flows/event\t    1595 B/op\t       5 allocs/op\n" +
		"BenchmarkStoreAppend-1 \t 100\t 50 ns/op\t 2000000 flows/s\n" +
		"BenchmarkJoin \t 100\t 70 ns/op\t 0.5 flows/event\n" +
		"PASS\n"
	got := parseGoBench(out)
	if len(got) != 3 {
		t.Fatalf("%d benchmarks: %+v", len(got), got)
	}
	p := got[0]
	if p.Name != "BenchmarkPipeline" || p.NsOp != 3486 || p.Unit != "events/s" || p.Metric != 286872 || p.Allocs != 5 || p.BytesOp != 1595 ||
		p.Extra["allocs/event"] != 5.953 || p.Extra["flows/event"] != 0.6873 {
		t.Errorf("pipeline %+v", p)
	}
	if s := got[1]; s.Name != "BenchmarkStoreAppend" || s.Unit != "flows/s" || s.Metric != 2e6 {
		t.Errorf("store %+v", s)
	}
	if j := got[2]; j.Unit != "flows/event" || j.Metric != 0.5 {
		t.Errorf("a benchmark with no rate keeps its first metric: %+v", j)
	}
}

// The live pipeline's stages, run with -cpu 1,2, are told apart by the
// suffix of the two-core run, and compared in the per-stage sentence.
func TestStagesOnOneCoreAndTwo(t *testing.T) {
	out := "BenchmarkStages \t 1000000\t      3500 ns/op\t    285714 events/s\t     353 B/op\t       0 allocs/op\n" +
		"BenchmarkStages-2 \t 1000000\t      2800 ns/op\t    357142 events/s\t     353 B/op\t       0 allocs/op\n"
	r := &report{stages: parseGoBench(out)}
	want := " BenchmarkStages is that pipeline as live.Run wires it, the join on one goroutine and the enrichment, diagnosis and writing on another:" +
		" 3500 ns per event on one core, 2800 on two (GOMAXPROCS=2), 1.25x the events a second."
	if got := r.stagesRelation(); got != want {
		t.Errorf("stagesRelation:\n got %q\nwant %q", got, want)
	}
	r.stages = r.stages[:1]
	if got := r.stagesRelation(); got != "" {
		t.Errorf("without the two-core run: %q, want nothing", got)
	}
}
