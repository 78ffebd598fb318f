package netlab

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// SNMP reads the namespace's /proc/net/snmp as "Proto:Field" -> value
// ("Tcp:OutRsts", "Icmp:InDestUnreachs") and /proc/net/snmp6 as
// "Icmp6:Field" ("Icmp6:OutDestUnreachs", from its Icmp6OutDestUnreachs):
// the kernel's own count of what the namespace sent and received, for
// tests to compare with. The files are read from a thread switched into
// the namespace (/proc/thread-self/net is the thread's namespace's, where
// /proc/net is the process's); a kernel without IPv6 has no snmp6.
func (n Namespace) SNMP() (map[string]int64, error) {
	var v4, v6 []byte
	err := n.Do(func() error {
		var err error
		if v4, err = os.ReadFile("/proc/thread-self/net/snmp"); err != nil {
			return err
		}
		if v6, err = os.ReadFile("/proc/thread-self/net/snmp6"); errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read snmp counters of %s: %w", n.Name, err)
	}
	m := parseSNMP(string(v4))
	for k, v := range parseSNMP6(string(v6)) {
		m[k] = v
	}
	return m, nil
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

// snmp6Protos are the prefixes of /proc/net/snmp6's "NameValue" lines.
var snmp6Protos = []string{"Icmp6", "Ip6", "Udp6", "UdpLite6"}

// parseSNMP6 reads /proc/net/snmp6's "Icmp6OutDestUnreachs 3" lines as
// "Icmp6:OutDestUnreachs".
func parseSNMP6(out string) map[string]int64 {
	m := map[string]int64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		for _, p := range snmp6Protos {
			if field, ok := strings.CutPrefix(f[0], p); ok && field != "" && field[0] >= 'A' && field[0] <= 'Z' {
				m[p+":"+field] = v
				break
			}
		}
	}
	return m
}
