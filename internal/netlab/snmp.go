package netlab

import (
	"fmt"
	"strconv"
	"strings"
)

// SNMP reads the namespace's /proc/net/snmp as "Proto:Field" -> value
// ("Tcp:OutRsts", "Icmp:InDestUnreachs"): the kernel's own count of what
// the namespace sent and received, for tests to compare with.
func (n Namespace) SNMP() (map[string]int64, error) {
	out, err := n.Run("cat", "/proc/net/snmp")
	if err != nil {
		return nil, fmt.Errorf("read snmp counters of %s: %w", n.Name, err)
	}
	return parseSNMP(out), nil
}

func parseSNMP(out string) map[string]int64 {
	m := map[string]int64{}
	names := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		proto := f[0]
		if hdr, ok := names[proto]; ok {
			for i := 1; i < len(f) && i < len(hdr); i++ {
				if v, err := strconv.ParseInt(f[i], 10, 64); err == nil {
					m[strings.TrimSuffix(proto, ":")+":"+hdr[i]] = v
				}
			}
			delete(names, proto)
			continue
		}
		names[proto] = f
	}
	return m
}
