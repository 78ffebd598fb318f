package trace

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"testing"
	"time"
)

// checkAppendFlow holds AppendFlow to json.Marshal for f: the same bytes,
// or both refusing it.
func checkAppendFlow(t *testing.T, f *Flow) {
	t.Helper()
	want, werr := json.Marshal(f)
	got, gerr := AppendFlow(nil, f)
	if (werr != nil) != (gerr != nil) {
		t.Fatalf("json.Marshal error %v, AppendFlow error %v", werr, gerr)
	}
	if werr == nil && !bytes.Equal(got, want) {
		t.Fatalf("AppendFlow differs from json.Marshal:\n got %s\nwant %s", got, want)
	}
	// Twice with an encoder every check shares: the second time from what
	// it kept, the first often from what other flows left.
	for range 2 {
		got, gerr = sharedEncoder.AppendFlow(nil, f)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("json.Marshal error %v, FlowEncoder error %v", werr, gerr)
		}
		if werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("FlowEncoder differs from json.Marshal:\n got %s\nwant %s", got, want)
		}
	}
}

var sharedEncoder FlowEncoder

// TestFlowEncoderKeeps: flows that share a rule, and times within one
// second, in one zone or another, with and without a fraction, are
// written as json.Marshal writes them by one encoder, in any order.
func TestFlowEncoderKeeps(t *testing.T) {
	shared := &Rule{Table: "nat", Chain: "KUBE-SEP-X", Text: "-A KUBE-SEP-X -j DNAT --to-destination 10.0.0.1:80"}
	other := &Rule{Table: "filter", Chain: "INPUT", Text: "-A INPUT -j REJECT", Owner: &Owner{Pod: &PodRef{Name: "p"}}}
	base := time.Date(2026, 12, 4, 9, 59, 59, 0, time.UTC)
	zones := []*time.Location{time.UTC, time.FixedZone("east", 3600), time.FixedZone("west", -(9*3600 + 1800))}
	var enc FlowEncoder
	for i := range 3000 {
		at := base.Add(time.Duration(i*i%2000) * time.Millisecond / 3).In(zones[i%7%3])
		if i%5 == 0 {
			at = at.Truncate(time.Second)
		}
		f := &Flow{Type: TypeFlow, Time: at, Proto: "tcp", Rule: shared,
			Events: []Event{{Kind: "dnat", Time: at.Add(time.Duration(i%3) * time.Microsecond)}}}
		if i%4 == 0 {
			f.Rule = other
		}
		want, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := enc.AppendFlow(nil, f)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("flow %d (%v): error %v\n got %s\nwant %s", i, at, err, got, want)
		}
	}
	if len(enc.rules) != 2 {
		t.Errorf("%d rules kept for two", len(enc.rules))
	}
}

// flowLines are the flow lines of the recorded incident trace.
func flowLines(t testing.TB) [][]byte {
	data, err := os.ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, l := range bytes.Split(data, []byte("\n")) {
		if bytes.Contains(l, []byte(`"type":"flow"`)) {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		t.Fatal("no flow in " + incidentTrace)
	}
	return out
}

func TestAppendFlowMatchesMarshal(t *testing.T) {
	for _, l := range flowLines(t) {
		var f Flow
		if err := json.Unmarshal(l, &f); err != nil {
			t.Fatal(err)
		}
		checkAppendFlow(t, &f)
	}
	icmp, code := uint8(3), uint8(3)
	odd := &Flow{Type: TypeFlow, Node: "node-\"2\"", Time: time.Date(2026, 12, 1, 9, 0, 0, 1, time.FixedZone("x", 5*3600+1800)), Proto: "tcp",
		Orig: Tuple{Src: "[fd00::1]:1", Dst: "<b>&\"\\\n\t\x01\u2028é\xff"},
		Events: []Event{{Type: "event", Kind: "reject", ICMPType: &icmp, ICMPCode: &code, CTStatus: []string{}, CTMark: 7, CTZone: 2, Netns: 9,
			Packet: &Tuple{}, Orig: &Tuple{Src: "a"}, Reply: &Tuple{Dst: "b"}, To: "t", Virtual: "v", Forward: "f", NFHook: "n", Reason: "r", By: "s"}},
		Rule: &Rule{Backend: BackendNFTables, Family: "ip", Handle: 3, Element: &RuleElement{Key: "k", Comment: "c"}, Path: []string{"a", "b"},
			Owner: &Owner{Pod: &PodRef{Name: "p"}}, Uncertain: "u"},
		Conntrack: &Conntrack{Status: []string{"ASSURED"}, Mark: 1},
		SrcPod:    &PodRef{}, DstPod: &PodRef{Namespace: "n", Name: "m"}, Service: &ServiceRef{Port: "http"},
		Verdict: "ok", Explanation: "fine",
	}
	checkAppendFlow(t, odd)
	checkAppendFlow(t, &Flow{})
	// One character that needs escaping in an otherwise plain string.
	for _, c := range []string{"<", ">", "&", `"`, `\`, "\n", "\x7f", "\x00", "é", "\u2028", "\xff"} {
		checkAppendFlow(t, &Flow{Verdict: "a" + c + "b", Explanation: c})
	}
	checkAppendFlow(t, &Flow{Events: []Event{}, Rule: &Rule{Element: &RuleElement{Map: "m"}, Owner: &Owner{ContainerID: "c"}}, Conntrack: &Conntrack{}})
	checkAppendFlow(t, &Flow{Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	checkAppendFlow(t, &Flow{Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 25*3600))})
}

// TestAppendFlowWritesEveryField: a flow with every field set, down to the
// events' and the rule's, is written as json.Marshal writes it, so a field
// added to the format but not to the encoder fails here.
func TestAppendFlowWritesEveryField(t *testing.T) {
	var f Flow
	fillAll(reflect.ValueOf(&f).Elem())
	f.Time = time.Date(2026, 12, 2, 10, 0, 0, 5, time.UTC)
	for i := range f.Events {
		f.Events[i].Time = f.Time
	}
	checkAppendFlow(t, &f)
	got, _ := AppendFlow(nil, &f)
	for _, key := range []string{`"no_conntrack":true`, `"conntrack_table":{`, `"insert_failed":`} {
		if !bytes.Contains(got, []byte(key)) {
			t.Errorf("the filled flow lacks %s: %s", key, got)
		}
	}
}

// fillAll sets every field of v to a value other than its zero.
func fillAll(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillAll(v.Elem())
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillAll(v.Index(0))
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillAll(v.Field(i))
			}
		}
	}
}

// FuzzAppendFlow: any flow a trace line can hold is written by AppendFlow
// exactly as json.Marshal writes it.
func FuzzAppendFlow(f *testing.F) {
	for _, l := range flowLines(f) {
		f.Add(l)
	}
	f.Add([]byte(`{"type":"flow","orig":{"src":"<\u2028>","dst":"\u0000"},"events":[],"rule":{"owner":{}},"conntrack":{"status":[]}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		var fl Flow
		if json.Unmarshal(in, &fl) != nil {
			return
		}
		checkAppendFlow(t, &fl)
	})
}

// FuzzAppendString: the fast quoting writes what encoding/json writes,
// whatever the string, on either side of its eight-byte steps.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain ascii rule text -A KUBE-SEP", "12345678\"", "1234567<", "tab\there", "ünïcode and more", "\u2028", "\xff\xfe", "abcdefgh&ijklmnop", "A\x7fB",
		"\b\f\n\r\t\x00\x1f<>&\"\\", "\u2029 and \xc3 cut", `-A KUBE-SVC-X -m comment --comment "default/web:http -> 10.244.1.5:8080" -j KUBE-SEP-Y`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendString(nil, s); string(got) != string(want) {
			t.Errorf("appendString(%q) = %s, encoding/json writes %s", s, got, want)
		}
	})
}

// BenchmarkAppendString quotes two explanations: one with nothing to
// escape (a hostPort rule's), and one quoting a kube-proxy rule, whose
// comment is in double quotes, as every iptables and nftables rule
// kube-proxy writes has one.
func BenchmarkAppendString(b *testing.B) {
	for _, c := range []struct{ name, s string }{
		{"plain", "ok: 172.18.0.2:80 from 10.244.1.10:10000 was DNAT'd to 10.244.1.6:80 (pod ns-w/web). a hostPort used as intended: nothing else owns that address and port. Rule `-A CNI-DN-2a43db1cddb367fe221a2 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.1.6:80` (table nat, chain path PREROUTING \u2192 CNI-HOSTPORT-DNAT \u2192 CNI-DN-2a43db1cddb367fe221a2)."},
		{"quoted", "ok: 10.96.0.10:80 from 10.244.1.10:10000 was DNAT'd to 10.244.1.6:8080 (pod ns-w/web) by Service default/web. Rule `-A KUBE-SEP-ABCDEFGHIJKLMNOP -p tcp -m comment --comment \"default/web:http\" -m tcp -j DNAT --to-destination 10.244.1.6:8080` (table nat, chain path PREROUTING \u2192 KUBE-SERVICES \u2192 KUBE-SVC-X \u2192 KUBE-SEP-ABCDEFGHIJKLMNOP)."},
	} {
		b.Run(c.name, func(b *testing.B) {
			buf := make([]byte, 0, 1024)
			b.SetBytes(int64(len(c.s)))
			b.ReportAllocs()
			for b.Loop() {
				buf = appendString(buf[:0], c.s)
			}
		})
	}
}
