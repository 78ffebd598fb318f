package trace

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fullFlow sets every field of a flow, and of each struct it points to,
// to something other than zero.
func fullFlow() *Flow {
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	client, seen := "10.244.1.10:40000", "192.168.0.5:61000"
	orig := Tuple{Src: client, Dst: "10.96.0.10:80"}
	reply := Tuple{Src: "10.244.2.7:8080", Dst: seen}
	u8 := func(x uint8) *uint8 { return &x }
	ev := Event{Node: "node-1", Kind: "dnat", Time: at, Hook: "nf_nat_setup_info", Via: "kprobe", Proto: "tcp", Netns: 7,
		Packet: &Tuple{Src: client, Dst: "10.96.0.10:80"}, Orig: &orig, Reply: &reply, To: "10.244.2.7:8080", Virtual: "10.96.0.10:80",
		Forward: "masq", NFHook: "PREROUTING", ICMPType: u8(3), ICMPCode: u8(13), Reason: "NETFILTER_DROP", CTStatus: []string{"CONFIRMED", "DST_NAT"},
		CTMark: 0x4000, CTZone: 3, By: "netfilter", NoConntrack: true,
		ConntrackTable: &ConntrackTable{Entries: 10, Max: 20, Drops: 3, InsertFailed: 1}}
	ev2 := ev
	ev2.Time, ev2.Kind, ev2.Packet = at.Add(time.Millisecond), "snat", &Tuple{Src: "10.244.2.7:8080", Dst: seen}
	return &Flow{Type: TypeFlow, Node: "node-1", Nodes: []string{"node-0", "node-1"}, Time: at, Proto: "tcp", Orig: orig, Reply: &reply,
		Events: []Event{ev, ev2},
		Rule: &Rule{Backend: BackendNFTables, Family: "ip", Handle: 29, Element: &RuleElement{Map: "m", Key: "k", Comment: "c"},
			Table: "nat", Chain: "KUBE-SEP-X", EntryChain: "PREROUTING", Path: []string{"PREROUTING", "KUBE-SEP-X"}, Text: "-j DNAT",
			Owner: &Owner{ContainerID: "abc", Pod: &PodRef{Namespace: "o", Name: "owner"}}, Uncertain: "maybe"},
		Conntrack: &Conntrack{State: "ESTABLISHED", Status: []string{"SEEN_REPLY"}, Mark: 1, Replied: true},
		SrcPod:    &PodRef{Namespace: "a", Name: "client"}, DstPod: &PodRef{Namespace: "b", Name: "server"},
		Service: &ServiceRef{Namespace: "b", Name: "svc", Port: "http"}, Verdict: VerdictOK,
		Explanation: "ok: 10.96.0.10:80 from " + client + " was DNAT'd; the server saw " + seen + " (" + client + ")"}
}

func deepCopy(t *testing.T, f *Flow) *Flow {
	t.Helper()
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	var out Flow
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// mutate changes the n-th leaf of v (a field, an element, or a slice's
// length) and returns its path, or "" when v has fewer leaves.
func mutate(v reflect.Value, path string, n *int) string {
	if v.Type() == reflect.TypeOf(time.Time{}) {
		if *n--; *n < 0 {
			v.Set(reflect.ValueOf(v.Interface().(time.Time).Add(time.Microsecond + time.Nanosecond)))
			return path
		}
		return ""
	}
	switch v.Kind() {
	case reflect.Pointer:
		return mutate(v.Elem(), path, n)
	case reflect.Struct:
		for i := range v.NumField() {
			if p := mutate(v.Field(i), path+"."+v.Type().Field(i).Name, n); p != "" {
				return p
			}
		}
		return ""
	case reflect.Slice:
		for i := range v.Len() {
			if p := mutate(v.Index(i), fmt.Sprintf("%s[%d]", path, i), n); p != "" {
				return p
			}
		}
		if *n--; *n < 0 {
			v.Set(reflect.Append(v, v.Index(0)))
			return path + " (one more)"
		}
		return ""
	}
	if *n--; *n >= 0 {
		return ""
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	default:
		panic("a leaf of kind " + v.Kind().String())
	}
	return path
}

// TestStoreKeepsEveryField stores a flow that sets every field, and for
// every field a copy that differs from it there alone: each must read
// back as it was appended. A field the shape key forgot would make two of
// them share a shape, and one read back as the other.
func TestStoreKeepsEveryField(t *testing.T) {
	base := fullFlow()
	flows := []*Flow{base}
	paths := []string{"(base)"}
	for n := 0; ; n++ {
		f := deepCopy(t, base)
		k := n
		p := mutate(reflect.ValueOf(f), "Flow", &k)
		if p == "" {
			break
		}
		flows, paths = append(flows, f), append(paths, p)
	}
	if len(flows) < 80 {
		t.Fatalf("only %d variants: the walk missed fields", len(flows))
	}
	s := NewStore()
	for _, f := range flows {
		s.Append(f)
		// The store keeps a flow's type and drops its events' (Append).
		f.Type = TypeFlow
		for k := range f.Events {
			f.Events[k].Type = ""
		}
	}
	var whole []string
	for i, f := range flows {
		if got := s.At(i); !reflect.DeepEqual(got, f) {
			t.Errorf("%s: read back %s", paths[i], jsonDiff(got, f))
		}
		if c, j := s.locate(i); c.flows[j].shape.own {
			whole = append(whole, paths[i])
		}
	}
	checkKeys(t, s, flows)
	// Only the variants whose client is no endpoint are stored whole.
	if want := []string{"Flow.Orig.Src", "Flow.Reply.Dst"}; !reflect.DeepEqual(whole, want) {
		t.Errorf("stored whole: %q, want %q", whole, want)
	}
	t.Logf("%d variants, %d shapes", len(flows), len(s.shapes))
}

// jsonDiff shows where got's JSON first differs from want's.
func jsonDiff(got, want *Flow) string {
	a, b := jsonOf(got), jsonOf(want)
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(0, i-60)
	return fmt.Sprintf("...%s..., want ...%s...", a[from:min(len(a), i+60)], b[from:min(len(b), i+60)])
}

// checkKeys fails unless every stored flow's keys hold what KeysOf the
// flow as appended does: the same addresses and ports, in any order.
func checkKeys(t *testing.T, s *Store, flows []*Flow) {
	t.Helper()
	view := s.Snapshot()
	var sf StoredFlow
	for i, f := range flows {
		view.Load(i+view.First(), &sf)
		if got, want := *sf.Keys(), KeysOf(f); !sameKeys(got, want) {
			t.Errorf("flow %d: keys %+v, want %+v", i, got, want)
		}
	}
}

func sameKeys(a, b AddrKeys) bool {
	if a.Complete != b.Complete || !a.Complete {
		return a.Complete == b.Complete
	}
	n := int(a.NAddrs)
	if a.IPv6 {
		n *= 4
	}
	return a.IPv6 == b.IPv6 && a.NAddrs == b.NAddrs && a.NPorts == b.NPorts &&
		sameSet(a.Addrs[:n], b.Addrs[:n], 1+3*btoi(a.IPv6)) && sameSet(a.Ports[:a.NPorts], b.Ports[:b.NPorts], 1)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sameSet: a and b hold the same runs of n words, in any order.
func sameSet[T comparable](a, b []T, n int) bool {
	count := map[string]int{}
	for i := 0; i < len(a); i += n {
		count[fmt.Sprint(a[i:i+n])]++
	}
	for i := 0; i < len(b); i += n {
		count[fmt.Sprint(b[i:i+n])]--
	}
	for _, c := range count {
		if c != 0 {
			return false
		}
	}
	return true
}

func jsonOf(f *Flow) string {
	b, _ := json.Marshal(f)
	return string(b)
}

// TestStoreShapesRepeatedFlows: flows that differ only in their client
// and times share one shape and read back each with its own.
func TestStoreShapesRepeatedFlows(t *testing.T) {
	s := NewStore()
	var want []*Flow
	for i := range 4 * storeChunk {
		f := deepCopy(t, fullFlow())
		client := fmt.Sprintf("10.244.%d.%d:%d", i%3, i%250, 30000+i)
		seen := fmt.Sprintf("192.168.0.5:%d", 40000+i)
		f.Time = f.Time.Add(time.Duration(i) * time.Millisecond)
		for k := range f.Events {
			e := &f.Events[k]
			e.Time = f.Time.Add(time.Duration(k*i) * time.Microsecond)
			for _, tu := range []*Tuple{e.Packet, e.Orig, e.Reply} {
				tu.Src = strings.ReplaceAll(strings.ReplaceAll(tu.Src, "10.244.1.10:40000", client), "192.168.0.5:61000", seen)
				tu.Dst = strings.ReplaceAll(strings.ReplaceAll(tu.Dst, "10.244.1.10:40000", client), "192.168.0.5:61000", seen)
			}
		}
		f.Orig.Src, f.Reply.Dst = client, seen
		f.Explanation = strings.ReplaceAll(strings.ReplaceAll(f.Explanation, "10.244.1.10:40000", client), "192.168.0.5:61000", seen)
		f.SrcPod = &PodRef{Namespace: "a", Name: fmt.Sprint("client-", i%7)}
		want = append(want, f)
		s.Append(f)
	}
	if len(s.shapes) != 1 {
		t.Errorf("%d shapes for flows that differ in their client alone, want 1", len(s.shapes))
	}
	checkKeys(t, s, want)
	for i, f := range want {
		if got := s.At(i); !reflect.DeepEqual(got, f) {
			t.Fatalf("flow %d read back %s", i, jsonDiff(got, f))
		}
	}
	if per := s.Memory() / int64(len(want)); per > 150 {
		t.Errorf("%d bytes a flow by the store's estimate, want at most 150", per)
	}
}

// TestStoreReadsBackOddFlows: endpoints and times the shapes cannot hold
// exactly, or only just, read back as they came.
func TestStoreReadsBackOddFlows(t *testing.T) {
	berlin := time.FixedZone("CET", 3600)
	cases := map[string]func(f *Flow){
		"ipv6":                func(f *Flow) { f.Orig.Src, f.Reply.Dst = "[fd00::1]:40000", "[fd00::1]:40000" },
		"ipv6 zone":           func(f *Flow) { f.Orig.Src = "[fe80::1%eth0]:40000" },
		"ipv4 in ipv6":        func(f *Flow) { f.Orig.Src = "[::ffff:10.0.0.1]:40000" },
		"bare ipv4 (icmp)":    func(f *Flow) { f.Orig.Src, f.Reply.Dst = "10.0.0.1", "10.0.0.1" },
		"bare ipv6":           func(f *Flow) { f.Orig.Src = "fd00::1" },
		"not canonical":       func(f *Flow) { f.Orig.Src = "10.0.0.01:40000" },
		"not an endpoint":     func(f *Flow) { f.Orig.Src = "somewhere" },
		"empty client":        func(f *Flow) { f.Orig.Src = "" },
		"placeholder in text": func(f *Flow) { f.Explanation += "\x00\x01" },
		"placeholder tuple":   func(f *Flow) { f.Orig.Dst = slotClient },
		"zero time":           func(f *Flow) { f.Time = time.Time{} },
		"event zero time":     func(f *Flow) { f.Events[1].Time = time.Time{} },
		"other location":      func(f *Flow) { f.Time = f.Time.In(berlin); f.Events[0].Time = f.Events[0].Time.In(berlin) },
		"mixed locations":     func(f *Flow) { f.Events[0].Time = f.Events[0].Time.In(berlin) },
		"no reply":            func(f *Flow) { f.Reply = nil },
		"reply to the client": func(f *Flow) { f.Reply.Dst = f.Orig.Src },
		"client is a prefix":  func(f *Flow) { f.Orig.Src, f.Reply.Dst = "10.0.0.1:80", "10.0.0.1:8080" },
		"hairpin":             func(f *Flow) { f.Orig.Dst = f.Orig.Src },
		"no events":           func(f *Flow) { f.Events = nil },
		"many events":         func(f *Flow) { f.Events = append(f.Events, f.Events...) },
	}
	s := NewStore()
	var names []string
	var want []*Flow
	cases["all ipv6"] = nil
	for name, change := range cases {
		f := fullFlow()
		if change == nil {
			f = ipv6Flow(t)
		} else {
			change(f)
		}
		names, want = append(names, name), append(want, f)
		s.Append(f)
	}
	checkKeys(t, s, want)
	for i, f := range want {
		got := s.At(i)
		if !reflect.DeepEqual(got, f) && !(timesEqual(got, f) && jsonOf(got) == jsonOf(f)) {
			t.Errorf("%s: read back %s", names[i], jsonDiff(got, f))
		}
	}
}

// ipv6Flow is fullFlow with every address an IPv6 one.
func ipv6Flow(t *testing.T) *Flow {
	b, err := json.Marshal(fullFlow())
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer("10.244.1.10:40000", "[fd00::a]:40000", "192.168.0.5:61000", "[fd00::5]:61000",
		"10.96.0.10:80", "[fd00:96::a]:80", "10.244.2.7:8080", "[fd00:244::7]:8080").Replace(string(b))
	var f Flow
	if err := json.Unmarshal([]byte(text), &f); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text, "10.") {
		t.Fatalf("an IPv4 address is left: %s", text)
	}
	return &f
}

// timesEqual: the flows' times are the same instants in the same
// location (a location read back may be an equal one).
func timesEqual(a, b *Flow) bool {
	if !a.Time.Equal(b.Time) || a.Time.Location().String() != b.Time.Location().String() || len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		if !a.Events[i].Time.Equal(b.Events[i].Time) {
			return false
		}
	}
	return true
}

// FuzzStoreRoundTrip: whatever a flow's client, the other endpoint and
// the text, it reads back as it came, alone or beside a flow of the same
// shape.
func FuzzStoreRoundTrip(f *testing.F) {
	f.Add("10.0.0.1:80", "10.0.0.1:8080", "from 10.0.0.1:80 to 10.0.0.1:8080", int64(0))
	f.Add("[fd00::1]:1", "fd00::1", "x\x00y", int64(-1))
	f.Add("1.2.3.4", "1.2.3.4", "1.2.3.41.2.3.4", int64(1<<62))
	f.Fuzz(func(t *testing.T, client, seen, text string, at int64) {
		s := NewStore()
		var want []*Flow
		for i := range 2 {
			fl := fullFlow()
			fl.Orig.Src, fl.Reply.Dst = client, seen
			fl.Events[0].Packet.Src = client
			fl.Explanation = text + fmt.Sprint(i%1)
			fl.Time = time.Unix(0, at).UTC()
			fl.Events[0].Time = fl.Time
			want = append(want, fl)
			s.Append(fl)
		}
		for i, fl := range want {
			if got := s.At(i); !reflect.DeepEqual(got, fl) {
				t.Fatalf("read back %s", jsonDiff(got, fl))
			}
		}
		checkKeys(t, s, want)
	})
}

// TestStoreSharesParsedOffsets: a trace written at +05:30 and replayed
// where that is not the local offset parses each time into a location of
// its own; its flows still share a shape, and read back alike.
func TestStoreSharesParsedOffsets(t *testing.T) {
	s := NewStore()
	var want []*Flow
	for i := range 20 {
		f := fullFlow()
		f.Orig.Src = fmt.Sprintf("10.244.1.10:%d", 40000+i)
		f.Events[0].Packet.Src, f.Explanation = f.Orig.Src, "ok: from "+f.Orig.Src
		f.Events[0].Orig, f.Events[1].Orig = &f.Orig, &f.Orig
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "Z\"", "+05:30\"")
		var g Flow
		if err := json.Unmarshal([]byte(text), &g); err != nil {
			t.Fatal(err)
		}
		if _, off := g.Time.Zone(); off != 19800 {
			t.Fatalf("fixture: offset %d", off)
		}
		want = append(want, &g)
		s.Append(&g)
	}
	if len(s.shapes) != 1 {
		t.Errorf("%d shapes for flows that differ in their client and their times' location objects, want 1", len(s.shapes))
	}
	for i, f := range want {
		got := s.At(i)
		if !reflect.DeepEqual(got, f) {
			t.Errorf("flow %d read back %s", i, jsonDiff(got, f))
		}
		if c, j := s.locate(i); c.flows[j].shape.own {
			t.Errorf("flow %d stored whole", i)
		}
	}
}
