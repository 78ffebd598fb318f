package enrich_test

// Helpers of the privileged tests (TestPrivServiceNoEndpoint,
// TestPrivPortmapNFTHijack): namespaces, real connections from a known
// endpoint, and the live pipeline observing the node's namespace.

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// The nodes of these tests share their addressing: a pod-like client "c"
// on the node's cni0, the node "n", and an uplink "u" on the node's eth0.
//
//	c 10.0.0.2 --- 10.0.0.1 n 192.168.0.2 --- 192.168.0.1 u
const (
	clientAddr = "10.0.0.2"
	nodeAddr   = "192.168.0.2"
)

// requirePrivileged skips without root or in -short mode, and fails when
// ip or one of the test's own tools is missing: a privileged run must not
// pass by testing nothing.
func requirePrivileged(t *testing.T, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged test: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged test: needs root (network namespaces, netfilter rules, CAP_BPF)")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("privileged test needs %s installed: %v", tool, err)
		}
	}
}

// newLab creates the named namespaces under prefix, removed when the test
// ends.
func newLab(t *testing.T, prefix string, names ...string) (*netlab.Lab, map[string]netlab.Namespace) {
	t.Helper()
	lab, err := netlab.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("remove namespaces: %v", err)
		}
	})
	nss := map[string]netlab.Namespace{}
	for _, name := range names {
		if nss[name], err = lab.Namespace(name); err != nil {
			t.Fatal(err)
		}
	}
	return lab, nss
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, ns netlab.Namespace, args ...string) string {
	t.Helper()
	out, err := ns.Run(args[0], args[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dial connects from ns to addr from a fixed local port, so a refused
// connection still names its five-tuple; it returns the local endpoint.
func dial(ns netlab.Namespace, from, addr string, timeout time.Duration) (string, error) {
	return dialThen(ns, from, addr, timeout, nil)
}

// dialThen is dial that hands the connection to use (when not nil) before
// closing it.
func dialThen(ns netlab.Namespace, from, addr string, timeout time.Duration, use func(net.Conn) error) (string, error) {
	var local *net.TCPAddr
	var err error
	// Another port when an earlier connection's TIME_WAIT holds this one.
	for range 5 {
		local = &net.TCPAddr{IP: net.ParseIP(from), Port: 20000 + rand.IntN(20000)}
		err = ns.Do(func() error {
			d := net.Dialer{Timeout: timeout, LocalAddr: local}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			if use != nil {
				return use(c)
			}
			return nil
		})
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return local.String(), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
