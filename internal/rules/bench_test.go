package rules

import "testing"

// BenchmarkEvaluate walks the portmap + kube-proxy (IPVS) rule set of
// testdata/appended.save for the packets of the incidents.
func BenchmarkEvaluate(b *testing.B) {
	rs := loadSave(b, "appended.save")
	n := testNode(b)
	cases := []struct {
		name, table, chain string
		pkt                Packet
	}{
		{"hijack-nat-PREROUTING", "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.96.0.20:3306")},
		{"service-nat-PREROUTING", "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.96.0.20:80")},
		{"ping-reject-filter-INPUT", "filter", "INPUT", ping("10.244.1.7", "10.96.0.20")},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, err := rs.Evaluate(c.table, c.chain, c.pkt, n)
				if err != nil || res.Uncertain {
					b.Fatal(err, res.Reasons)
				}
			}
		})
	}
}

func BenchmarkAttribute(b *testing.B) {
	rs := loadSave(b, "appended.save")
	n := testNode(b)
	pkt := tcp("10.244.2.9:40000", "10.96.0.20:3306")
	act := dnatTo("PREROUTING", "10.244.1.5:3306")
	b.ReportAllocs()
	for b.Loop() {
		at, err := rs.Attribute(pkt, n, act)
		if err != nil || at.Uncertain {
			b.Fatal(err, at.Reasons)
		}
	}
}

func BenchmarkParseSave(b *testing.B) {
	text := readTestdata(b, "appended.save")
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := ParseSaveString(text, IPv4); err != nil {
			b.Fatal(err)
		}
	}
}
