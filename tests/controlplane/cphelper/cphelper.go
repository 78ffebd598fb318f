// Package cphelper runs a real etcd and kube-apiserver on loopback for
// tests: token authentication, RBAC authorization, an admin identity in
// system:masters and a token for the tracer's ServiceAccount identity
// (system:serviceaccount:tracer:tracer). The binaries are built from the
// module in tests/controlplane/build on first use and cached (see
// EnsureBinaries).
//
// There is no kubelet and no controller manager: tests create pods with
// spec.nodeName set, write their status through the status subresource,
// and create EndpointSlices themselves. The ServiceAccount admission plugin
// is disabled, since nothing creates the "default" ServiceAccount of a
// namespace.
package cphelper

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The tracer's identity, as the static token file declares it: the user
// name and groups a ServiceAccount token for tracer/tracer authenticates as.
const (
	TracerUser   = "system:serviceaccount:tracer:tracer"
	tracerGroups = "system:serviceaccounts,system:serviceaccounts:tracer"
	// OnCallUser is a person in the group deploy/user-rbac.yaml binds
	// (tracer-users); PlainUser is a person with no grant at all.
	OnCallUser = "oncall"
	PlainUser  = "plain"
)

// ServiceCIDR is the cluster's Service IP range unless Options.ServiceCIDR
// says otherwise.
const ServiceCIDR = "10.96.0.0/16"

// Options change how Start runs kube-apiserver. The zero value is what
// Start uses.
type Options struct {
	// ServiceCIDR is --service-cluster-ip-range (default ServiceCIDR): one
	// CIDR, or an IPv4 and an IPv6 one separated by a comma for a
	// dual-stack cluster (the API server then makes its default
	// ServiceCIDR object of both, and allocates a RequireDualStack
	// Service a ClusterIP of each family).
	ServiceCIDR string
	// NoEndpointReconciler runs kube-apiserver with
	// --endpoint-reconciler-type=none: it creates the "kubernetes" Service
	// but no Endpoints or EndpointSlice for it, so a test can write one with
	// a fixed port instead of the random one the API server listens on. Not
	// for use with AddAPIServer (nothing maintains the endpoints then).
	NoEndpointReconciler bool
}

// readyTimeout bounds how long a start waits for /readyz: 90 s, and 3
// minutes in a tests/vm guest, where under TCG with a second guest on the
// same 2 cores the first kube-apiserver's rbac/bootstrap-roles was still
// failing after 90 s (5.10, twice).
func readyTimeout() time.Duration {
	if os.Getenv("TRACER_VM") != "" {
		return 3 * time.Minute
	}
	return 90 * time.Second
}

// ControlPlane is one running etcd and kube-apiserver pair.
type ControlPlane struct {
	tb   testing.TB
	dir  string
	bins Binaries
	pki  *pki
	opts Options

	etcdPort, peerPort, apiPort int
	adminToken, tracerToken     string
	onCallToken, plainToken     string
	// advertise is the address the API server puts in the "kubernetes"
	// Service's endpoints; it may not be loopback. Nothing connects to it.
	advertise string
	// replica is set for a second API server sharing etcd: its cleanup
	// leaves etcd alone.
	replica    bool
	tokensFile string

	etcd, api             *exec.Cmd
	etcdExited, apiExited chan struct{}
	starts                int
}

// Start builds the binaries if needed, starts etcd and kube-apiserver on
// free loopback ports and waits until the API server is ready. Everything is
// stopped and removed when the test ends.
func Start(tb testing.TB) *ControlPlane {
	tb.Helper()
	return StartWith(tb, Options{})
}

// StartWith is Start with options.
func StartWith(tb testing.TB, opts Options) *ControlPlane {
	tb.Helper()
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = ServiceCIDR
	}
	t0 := time.Now()
	bins, err := EnsureBinaries(tb.Logf)
	if err != nil {
		tb.Fatalf("build control plane: %v", err)
	}
	if d := time.Since(t0); d > time.Second {
		tb.Logf("cphelper: binaries ready in %s", d.Round(time.Second))
	}
	cp := &ControlPlane{tb: tb, dir: tb.TempDir(), bins: bins, opts: opts, advertise: "192.0.2.1"}
	tb.Cleanup(cp.cleanup)

	if cp.pki, err = writePKI(cp.dir); err != nil {
		tb.Fatalf("control plane keys: %v", err)
	}
	cp.adminToken, cp.tracerToken = randomToken(), randomToken()
	cp.onCallToken, cp.plainToken = randomToken(), randomToken()
	tokens := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n%s,%s,tracer-uid,\"%s\"\n%s,%s,oncall-uid,\"tracer-users\"\n%s,%s,plain-uid\n",
		cp.adminToken, cp.tracerToken, TracerUser, tracerGroups, cp.onCallToken, OnCallUser, cp.plainToken, PlainUser)
	cp.tokensFile = filepath.Join(cp.dir, "tokens.csv")
	if err := os.WriteFile(cp.tokensFile, []byte(tokens), 0o600); err != nil {
		tb.Fatalf("write token file: %v", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		tb.Fatalf("control plane ports: %v", err)
	}
	cp.etcdPort, cp.peerPort, cp.apiPort = ports[0], ports[1], ports[2]

	if err := cp.startEtcd(); err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	cp.Start()
	tb.Logf("cphelper: control plane up at %s in %s (dir %s)", cp.URL(), time.Since(t0).Round(time.Millisecond), cp.dir)
	return cp
}

// AddAPIServer starts a second kube-apiserver on the same etcd, with the
// same keys and tokens, as in a highly available control plane: with it,
// a test can change the cluster while the first API server is stopped.
// Call it from the test goroutine.
func (cp *ControlPlane) AddAPIServer() *ControlPlane {
	cp.tb.Helper()
	ports, err := freePorts(1)
	if err != nil {
		cp.tb.Fatalf("second kube-apiserver port: %v", err)
	}
	r := &ControlPlane{
		tb: cp.tb, dir: cp.tb.TempDir(), bins: cp.bins, pki: cp.pki, opts: cp.opts,
		etcdPort: cp.etcdPort, peerPort: cp.peerPort, apiPort: ports[0],
		adminToken: cp.adminToken, tracerToken: cp.tracerToken,
		onCallToken: cp.onCallToken, plainToken: cp.plainToken,
		advertise: "192.0.2.2", replica: true,
		tokensFile: cp.tokensFile,
	}
	cp.tb.Cleanup(r.cleanup)
	r.Start()
	return r
}

// URL is the API server's address.
func (cp *ControlPlane) URL() string { return "https://127.0.0.1:" + strconv.Itoa(cp.apiPort) }

// Port is the API server's port on 127.0.0.1.
func (cp *ControlPlane) Port() int { return cp.apiPort }

// ServiceCIDR is the API server's --service-cluster-ip-range.
func (cp *ControlPlane) ServiceCIDR() string { return cp.opts.ServiceCIDR }

// Binaries are the programs this control plane runs, and kube-proxy.
func (cp *ControlPlane) Binaries() Binaries { return cp.bins }

// AdminToken authenticates as user admin in group system:masters.
func (cp *ControlPlane) AdminToken() string { return cp.adminToken }

// TracerToken authenticates as system:serviceaccount:tracer:tracer.
func (cp *ControlPlane) TracerToken() string { return cp.tracerToken }

// OnCallToken authenticates as OnCallUser, in group tracer-users.
func (cp *ControlPlane) OnCallToken() string { return cp.onCallToken }

// PlainToken authenticates as PlainUser, granted nothing.
func (cp *ControlPlane) PlainToken() string { return cp.plainToken }

// AdminConfig is a client configuration with cluster-admin rights. Raise
// its QPS and Burst for bulk work.
func (cp *ControlPlane) AdminConfig() *rest.Config { return cp.ConfigFor(cp.adminToken) }

// ConfigFor is a client configuration authenticating with token.
func (cp *ControlPlane) ConfigFor(token string) *rest.Config {
	return &rest.Config{
		Host:            cp.URL(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), cp.pki.caPEM...)},
	}
}

// KubeconfigFor writes a kubeconfig file authenticating with token and
// returns its path.
func (cp *ControlPlane) KubeconfigFor(token string) string {
	cp.tb.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.URL(), CertificateAuthorityData: cp.pki.caPEM}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "user"}
	cfg.CurrentContext = "test"
	f, err := os.CreateTemp(cp.dir, "kubeconfig-*")
	if err != nil {
		cp.tb.Fatalf("create kubeconfig: %v", err)
	}
	path := f.Name()
	f.Close()
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		cp.tb.Fatalf("write kubeconfig: %v", err)
	}
	return path
}

// Stop kills kube-apiserver (etcd keeps the data) to simulate an outage of
// the API server. Call it from the test goroutine.
func (cp *ControlPlane) Stop() {
	cp.tb.Helper()
	if cp.api == nil {
		cp.tb.Fatalf("stop kube-apiserver: not running")
	}
	stopProcess(cp.api, cp.apiExited)
	cp.api = nil
}

// Start (re)starts kube-apiserver on the same port with the same keys and
// waits until it is ready. Call it from the test goroutine.
func (cp *ControlPlane) Start() {
	cp.tb.Helper()
	if cp.api != nil {
		cp.tb.Fatalf("start kube-apiserver: already running")
	}
	cp.starts++
	reconciler := "lease" // two API servers may share one etcd (AddAPIServer)
	if cp.opts.NoEndpointReconciler {
		reconciler = "none"
	}
	args := []string{
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(cp.etcdPort),
		"--secure-port=" + strconv.Itoa(cp.apiPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=" + cp.advertise,
		"--cert-dir=" + filepath.Join(cp.dir, "certs"),
		"--endpoint-reconciler-type=" + reconciler,
		"--tls-cert-file=" + cp.pki.certFile,
		"--tls-private-key-file=" + cp.pki.keyFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + cp.pki.saPubFile,
		"--service-account-signing-key-file=" + cp.pki.saKeyFile,
		"--token-auth-file=" + cp.tokensFile,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=" + cp.opts.ServiceCIDR,
		"--disable-admission-plugins=ServiceAccount",
	}
	logName := fmt.Sprintf("kube-apiserver.%d.log", cp.starts)
	cmd, exited, err := startProcess(cp.bins.APIServer, args, filepath.Join(cp.dir, logName))
	if err != nil {
		cp.tb.Fatalf("start kube-apiserver: %v", err)
	}
	cp.api, cp.apiExited = cmd, exited
	if err := cp.waitReady(exited, logName); err != nil {
		cp.tb.Fatalf("start kube-apiserver: %v", err)
	}
}

func (cp *ControlPlane) startEtcd() error {
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(cp.etcdPort)
	args := []string{
		"--name=tracer-test",
		"--data-dir=" + filepath.Join(cp.dir, "etcd"),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=http://127.0.0.1:" + strconv.Itoa(cp.peerPort),
		"--initial-advertise-peer-urls=http://127.0.0.1:" + strconv.Itoa(cp.peerPort),
		"--initial-cluster=tracer-test=http://127.0.0.1:" + strconv.Itoa(cp.peerPort),
		"--log-level=warn",
		// Test data: durability is not worth an fsync per write.
		"--unsafe-no-fsync",
	}
	cmd, exited, err := startProcess(cp.bins.Etcd, args, filepath.Join(cp.dir, "etcd.log"))
	if err != nil {
		return err
	}
	cp.etcd, cp.etcdExited = cmd, exited
	// kube-apiserver retries its etcd connection, but fail fast and
	// clearly when etcd itself does not come up.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(etcdURL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("etcd exited: %s", tail(filepath.Join(cp.dir, "etcd.log")))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not healthy after 30s: %s", tail(filepath.Join(cp.dir, "etcd.log")))
		}
	}
}

// waitReady polls /readyz with the admin token.
func (cp *ControlPlane) waitReady(exited <-chan struct{}, logName string) error {
	rt, err := rest.TransportFor(cp.AdminConfig())
	if err != nil {
		return fmt.Errorf("admin transport: %w", err)
	}
	client := &http.Client{Transport: rt, Timeout: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout())
	defer cancel()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.URL()+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("readyz request: %w", err)
		}
		resp, err := client.Do(req)
		if err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("status %d: %s", resp.StatusCode, body.String())
		} else {
			last = err.Error()
		}
		select {
		case <-exited:
			return fmt.Errorf("kube-apiserver exited: %s", tail(filepath.Join(cp.dir, logName)))
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s (last: %s): %s", readyTimeout(), last, tail(filepath.Join(cp.dir, logName)))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (cp *ControlPlane) cleanup() {
	if cp.api != nil {
		stopProcess(cp.api, cp.apiExited)
	}
	if cp.etcd != nil {
		stopProcess(cp.etcd, cp.etcdExited)
	}
	if cp.tb.Failed() {
		logs := []string{fmt.Sprintf("kube-apiserver.%d.log", cp.starts)}
		if !cp.replica {
			logs = append(logs, "etcd.log")
		}
		for _, name := range logs {
			cp.tb.Logf("cphelper: tail of %s:\n%s", name, tail(filepath.Join(cp.dir, name)))
		}
	}
}

// startProcess runs bin with its output in logPath; the returned channel is
// closed when it exits. The child is killed if the test process dies.
func startProcess(bin string, args []string, logPath string) (*exec.Cmd, chan struct{}, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, nil, fmt.Errorf("create log: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, fmt.Errorf("exec %s: %w", filepath.Base(bin), err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	return cmd, exited, nil
}

// stopProcess sends SIGTERM, then SIGKILL after 10 s, and waits for exit.
func stopProcess(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen on a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomToken() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("read random token: %v", err))
	}
	return hex.EncodeToString(b)
}

// tail is the end of a log file, for failure messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "(no log)"
		}
		return fmt.Sprintf("(read log: %v)", err)
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(string(b))
}
