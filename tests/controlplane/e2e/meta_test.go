package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tracer-dev/tracer/internal/meta"
)

// maxWarnDelay bounds how long the index may serve without a warning while
// its API server is down.
const maxWarnDelay = 30 * time.Second

// TestMetadata runs the tracer's metadata index with its own ServiceAccount
// against a real API server: it names pods and Services, remembers a
// deleted pod, keeps serving through an API server outage with a warning,
// and catches up afterwards without being recreated.
func TestMetadata(t *testing.T) {
	c := startCluster(t, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns = "shop"
	const nodeIP = "172.18.0.10" // node-a's address, where NodePorts answer
	if err := createNamespace(ctx, c.admin, ns); err != nil {
		t.Fatal(err)
	}
	web1, err := runPod(ctx, c.admin, ns, "web-1", thisNode, nodeIP, "10.244.1.11", "fd00:10:244:1::11")
	if err != nil {
		t.Fatal(err)
	}
	web2, err := runPod(ctx, c.admin, ns, "web-2", "node-b", "172.18.0.11", "10.244.2.12")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runPod(ctx, c.admin, ns, "db-1", "node-b", "172.18.0.11", "10.244.2.13"); err != nil {
		t.Fatal(err)
	}
	web, err := createService(ctx, c.admin, service(ns, "web", corev1.ServiceTypeClusterIP, tcpPort("http", 80, 8080, 0)))
	if err != nil {
		t.Fatal(err)
	}
	np, err := createService(ctx, c.admin, service(ns, "web-np", corev1.ServiceTypeNodePort, tcpPort("http", 80, 8080, 30080)))
	if err != nil {
		t.Fatal(err)
	}
	lb, err := createService(ctx, c.admin, service(ns, "web-lb", corev1.ServiceTypeLoadBalancer, tcpPort("https", 443, 8443, 0)), "203.0.113.10")
	if err != nil {
		t.Fatal(err)
	}
	if err := createSlice(ctx, c.admin, web, "http", 8080, web1, web2); err != nil {
		t.Fatal(err)
	}
	lbNodePort := uint16(lb.Spec.Ports[0].NodePort)
	if lbNodePort == 0 {
		t.Fatalf("LoadBalancer Service got no nodePort: %+v", lb.Spec.Ports)
	}

	start := time.Now()
	idx := newIndex(t, c.tracerKubeconfig, time.Minute)
	if !idx.Synced() {
		t.Fatalf("index not synced after start-up: warnings %q", idx.Warnings())
	}
	t.Logf("metadata index synced in %s", time.Since(start).Round(time.Millisecond))
	if w := idx.Warnings(); len(w) != 0 {
		t.Fatalf("warnings with a healthy API server: %q", w)
	}

	t.Run("pods", func(t *testing.T) {
		for _, tc := range []struct{ ip, key, node string }{
			{"10.244.1.11", "shop/web-1", thisNode},
			{"fd00:10:244:1::11", "shop/web-1", thisNode},
			{"10.244.2.12", "shop/web-2", "node-b"},
			{"10.244.2.13", "shop/db-1", "node-b"},
		} {
			p, ok := idx.PodByIP(netip.MustParseAddr(tc.ip), time.Now())
			if !ok || p.Key() != tc.key || p.Node != tc.node {
				t.Errorf("PodByIP(%s) = %s on %q (found %v), want %s on %s", tc.ip, p.Key(), p.Node, ok, tc.key, tc.node)
			}
		}
		p, _ := idx.PodByIP(netip.MustParseAddr("10.244.1.11"), time.Now())
		if want := strings.TrimPrefix(containerID(ns, "web-1"), "containerd://"); !slices.Equal(p.ContainerIDs, []string{want}) {
			t.Errorf("local pod web-1 container IDs = %q, want [%s]", p.ContainerIDs, want)
		}
		if p.UID != string(web1.UID) || !p.Created.Equal(web1.CreationTimestamp.Time) {
			t.Errorf("web-1 UID %s created %s, want %s created %s", p.UID, p.Created, web1.UID, web1.CreationTimestamp)
		}
		if p, ok := idx.PodByIP(netip.MustParseAddr("10.244.9.9"), time.Now()); ok {
			t.Errorf("PodByIP(unused 10.244.9.9) = %s, want none", p.Key())
		}
	})

	t.Run("services", func(t *testing.T) {
		clusterIP := netip.MustParseAddr(web.Spec.ClusterIP)
		for _, tc := range []struct {
			what     string
			addr     netip.Addr
			port     uint16
			proto    string
			nodeAddr bool
			svc      string
			portName string
		}{
			{"ClusterIP", clusterIP, 80, "tcp", false, "web", "http"},
			{"ClusterIP, proto in upper case", clusterIP, 80, "TCP", false, "web", "http"},
			{"NodePort on this node", netip.MustParseAddr(nodeIP), 30080, "tcp", true, "web-np", "http"},
			{"NodePort of the LoadBalancer", netip.MustParseAddr(nodeIP), lbNodePort, "tcp", true, "web-lb", "https"},
			{"NodePort's ClusterIP", netip.MustParseAddr(np.Spec.ClusterIP), 80, "tcp", false, "web-np", "http"},
			{"LoadBalancer ingress IP", netip.MustParseAddr("203.0.113.10"), 443, "tcp", false, "web-lb", "https"},
			{"the API server's own Service", netip.MustParseAddr("10.96.0.1"), 443, "tcp", false, "kubernetes", "https"},
		} {
			s, p, ok := idx.ServiceByAddr(tc.addr, tc.port, tc.proto, tc.nodeAddr, time.Time{})
			if !ok || s.Name != tc.svc || p.Name != tc.portName {
				t.Errorf("%s: ServiceByAddr(%s, %d, %s, %v) = %s port %q (found %v), want %s port %q",
					tc.what, tc.addr, tc.port, tc.proto, tc.nodeAddr, s.Name, p.Name, ok, tc.svc, tc.portName)
			}
		}
		if s, _, ok := idx.ServiceByAddr(clusterIP, 81, "tcp", false, time.Time{}); ok {
			t.Errorf("ServiceByAddr(ClusterIP, unused port 81) = %s, want none", s.Name)
		}
		if s, _, ok := idx.ServiceByAddr(netip.MustParseAddr(nodeIP), 30080, "tcp", false, time.Time{}); ok {
			t.Errorf("NodePort on an address that is not the node's = %s, want none", s.Name)
		}
		if s, ok := idx.ServiceByIP(clusterIP, time.Time{}); !ok || s.Name != "web" {
			t.Errorf("ServiceByIP(ClusterIP of web) = %s (found %v), want web", s.Name, ok)
		}
		eps := idx.EndpointsOf(meta.ServiceRef{Namespace: ns, Name: "web"})
		var got []string
		for _, e := range eps {
			pod := ""
			if e.Pod != nil {
				pod = e.Pod.Namespace + "/" + e.Pod.Name
			}
			got = append(got, fmt.Sprintf("%s %s %s", e.Addr, e.Node, pod))
		}
		want := []string{"10.244.1.11:8080 node-a shop/web-1", "10.244.2.12:8080 node-b shop/web-2"}
		if !slices.Equal(got, want) {
			t.Errorf("EndpointsOf(shop/web) = %q, want %q", got, want)
		}
		pods, svcs := idx.Snapshot()
		if len(pods) != 3 || len(svcs) != 4 {
			t.Errorf("Snapshot: %d pods and %d Services, want 3 and 4 (web, web-np, web-lb, kubernetes)", len(pods), len(svcs))
		}
	})

	t.Run("deleted pod", func(t *testing.T) {
		ip := netip.MustParseAddr("10.244.2.12")
		before := time.Now()
		// No kubelet confirms a graceful deletion: delete at once, as a
		// force delete or a kubelet's final confirmation does.
		if err := c.admin.CoreV1().Pods(ns).Delete(ctx, "web-2", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
			t.Fatalf("delete pod web-2: %v", err)
		}
		eventually(t, 30*time.Second, "deletion of web-2 seen", func() string {
			if p, ok := idx.PodByIP(ip, time.Now()); ok {
				return fmt.Sprintf("PodByIP(%s, now) still %s (deleted %v)", ip, p.Key(), p.Deleted)
			}
			return ""
		})
		p, ok := idx.PodByIP(ip, before)
		if !ok || p.Key() != "shop/web-2" || p.Deleted.IsZero() || p.Deleted.Before(before) {
			t.Errorf("PodByIP(%s, before its deletion) = %s deleted %v (found %v), want shop/web-2 deleted after %v",
				ip, p.Key(), p.Deleted, ok, before)
		}
		if !slices.ContainsFunc(snapshotPods(idx), func(k string) bool { return k == "shop/web-2" }) {
			t.Errorf("Snapshot lost web-2 within the retention period: %q", snapshotPods(idx))
		}
	})

	t.Run("outage", func(t *testing.T) {
		// A second API server on the same etcd: the cluster changes
		// while the tracer's API server is down.
		other := c.cp.AddAPIServer()
		otherCfg := other.AdminConfig()
		otherCfg.QPS, otherCfg.Burst = 100, 100
		admin2, err := kubernetes.NewForConfig(otherCfg)
		if err != nil {
			t.Fatalf("second admin client: %v", err)
		}

		c.cp.Stop()
		down := time.Now()
		// The tracer shows a warning soon; the checks below go on without
		// one, to learn what else holds.
		warnAfter, missing := poll(maxWarnDelay, func() string {
			if len(idx.Warnings()) == 0 {
				return "Warnings() empty"
			}
			return ""
		})
		if missing != "" {
			t.Errorf("API server down for %s: %s, want a warning", warnAfter.Round(time.Second), missing)
		} else {
			t.Logf("outage: warning after %s: %q", warnAfter.Round(time.Millisecond), idx.Warnings())
		}

		// Stale but serving.
		if p, ok := idx.PodByIP(netip.MustParseAddr("10.244.1.11"), time.Now()); !ok || p.Key() != "shop/web-1" {
			t.Errorf("during the outage PodByIP(10.244.1.11) = %s (found %v), want shop/web-1", p.Key(), ok)
		}
		if s, _, ok := idx.ServiceByAddr(netip.MustParseAddr("203.0.113.10"), 443, "tcp", false, time.Time{}); !ok || s.Name != "web-lb" {
			t.Errorf("during the outage the LoadBalancer IP = %s (found %v), want web-lb", s.Name, ok)
		}
		late, err := runPod(ctx, admin2, ns, "late", "node-b", "172.18.0.11", "10.244.2.99")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := createService(ctx, admin2, service(ns, "late", corev1.ServiceTypeClusterIP, tcpPort("http", 8080, 8080, 0))); err != nil {
			t.Fatal(err)
		}
		if err := admin2.CoreV1().Pods(ns).Delete(ctx, "db-1", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
			t.Fatalf("delete pod db-1 during the outage: %v", err)
		}
		// Stay down long enough for the informers' retries to back off.
		time.Sleep(10 * time.Second)
		if _, ok := idx.PodByIP(netip.MustParseAddr("10.244.2.99"), time.Now()); ok {
			t.Fatalf("pod created during the outage resolved while the tracer's API server is down")
		}
		if w := idx.Warnings(); len(w) == 0 {
			t.Errorf("no warning %s into the outage", time.Since(down).Round(time.Second))
		}

		c.cp.Start()
		up := time.Now()
		t.Logf("outage: API server down for %s", up.Sub(down).Round(time.Millisecond))
		caughtUp := eventually(t, 2*time.Minute, "pod created during the outage resolved", func() string {
			p, ok := idx.PodByIP(netip.MustParseAddr("10.244.2.99"), time.Now())
			if !ok || p.Key() != "shop/late" || p.UID != string(late.UID) {
				return fmt.Sprintf("PodByIP(10.244.2.99) = %s (found %v)", p.Key(), ok)
			}
			return ""
		})
		t.Logf("outage: pod created during the outage resolved %s after the restart", caughtUp.Round(time.Millisecond))
		lateIP := netip.MustParseAddr(mustService(ctx, t, admin2, ns, "late").Spec.ClusterIP)
		eventually(t, 2*time.Minute, "Service created during the outage resolved", func() string {
			if s, ok := idx.ServiceByIP(lateIP, time.Time{}); !ok || s.Name != "late" {
				return "ServiceByIP(ClusterIP of late) not found"
			}
			return ""
		})
		eventually(t, 2*time.Minute, "pod deleted during the outage gone", func() string {
			if p, ok := idx.PodByIP(netip.MustParseAddr("10.244.2.13"), time.Now()); ok {
				return fmt.Sprintf("PodByIP(10.244.2.13, now) = %s", p.Key())
			}
			return ""
		})
		if p, ok := idx.PodByIP(netip.MustParseAddr("10.244.2.13"), down); !ok || p.Key() != "shop/db-1" {
			t.Errorf("PodByIP(10.244.2.13) before the outage = %s (found %v), want shop/db-1, deleted during the outage", p.Key(), ok)
		}
		cleared := eventually(t, 3*time.Minute, "outage warning cleared", func() string {
			if w := idx.Warnings(); len(w) != 0 {
				return fmt.Sprintf("Warnings() = %q", w)
			}
			return ""
		})
		t.Logf("outage: warning cleared %s after the pod was resolved", cleared.Round(time.Millisecond))
		if !idx.Synced() {
			t.Errorf("index not synced after the outage")
		}
	})
}

func snapshotPods(idx meta.Index) []string {
	pods, _ := idx.Snapshot()
	var keys []string
	for _, p := range pods {
		keys = append(keys, p.Namespace+"/"+p.Name)
	}
	return keys
}

func mustService(ctx context.Context, t testing.TB, cs kubernetes.Interface, ns, name string) *corev1.Service {
	t.Helper()
	s, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get service %s/%s: %v", ns, name, err)
	}
	return s
}
