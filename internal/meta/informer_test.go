package meta

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// fixtureObjects decodes the kubectl fixture into typed objects, to feed the
// same cluster to the fake clientset.
func fixtureObjects(t testing.TB) []runtime.Object {
	t.Helper()
	data, err := os.ReadFile(incidentsFile)
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Items []json.RawMessage }
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, raw := range list.Items {
		var head typeHead
		if err := json.Unmarshal(raw, &head); err != nil {
			t.Fatal(err)
		}
		var o runtime.Object
		switch head.Kind {
		case "Pod":
			o = &corev1.Pod{}
		case "Service":
			o = &corev1.Service{}
		case "EndpointSlice":
			o = &discoveryv1.EndpointSlice{}
		default:
			t.Fatalf("fixture has kind %s", head.Kind)
		}
		if err := json.Unmarshal(raw, o); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}
	return objs
}

// clock is a settable time source for deletion times and warnings.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time            { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration)       { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }
func newClock(t time.Time) *clock          { return &clock{t: t} }
func startOf(t *testing.T) context.Context { return t.Context() }

// eventually polls cond until it holds or 5 s pass: informers deliver
// asynchronously.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestClientIncidents(t *testing.T) {
	cs := fake.NewClientset(fixtureObjects(t)...)
	idx, err := NewFromClient(startOf(t), cs, "node-2", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !idx.Synced() || len(idx.Warnings()) != 0 {
		t.Fatalf("synced %v, warnings %q; want synced without warnings", idx.Synced(), idx.Warnings())
	}
	checkIncidents(t, idx, fixtureNow, true)
	// Container IDs are kept for node-2's pods only.
	if p, _ := idx.PodByIP(mustAddr("10.244.2.7"), time.Time{}); len(p.ContainerIDs) != 0 {
		t.Errorf("remote pod mysql-a-0 kept container IDs %q", p.ContainerIDs)
	}
}

func testPod(name, node, ip string, created time.Time) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(created),
			Labels:            map[string]string{"app": name},
			Annotations:       map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-28T08:00:00Z"},
			ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}},
		},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.example.com/app:1", Command: []string{"/app", "--serve"},
				Env:   []corev1.EnvVar{{Name: "MODE", Value: "prod"}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			}, {
				Name: "proxy", Image: "registry.example.com/proxy:1",
				Ports: []corev1.ContainerPort{{ContainerPort: 5353, HostPort: 53, Protocol: corev1.ProtocolUDP}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			HostIP:     "192.168.1.12",
			PodIP:      ip,
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "main", ContainerID: "containerd://aaaa", Image: "registry.example.com/app:1", Ready: true},
				{Name: "proxy", ContainerID: "containerd://bbbb", Image: "registry.example.com/proxy:1", Ready: true},
			},
		},
	}
	if ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

func TestClientPodLifecycle(t *testing.T) {
	ctx, t0, clk, cs, idx := clockedIndex(t, 0)
	ip := mustAddr("10.244.1.20")
	pods := cs.CoreV1().Pods("default")

	// Scheduled, then given an IP: the update re-indexes it.
	p := testPod("old", "node-2", "", t0.Add(-time.Hour))
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod old in the snapshot", func() bool { ps, _ := idx.Snapshot(); return len(ps) == 1 })
	if _, ok := idx.PodByIP(ip, t0); ok {
		t.Fatal("a pod without IP answers PodByIP")
	}
	p.Status.PodIP, p.Status.PodIPs = ip.String(), []corev1.PodIP{{IP: ip.String()}}
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "old's IP", func() bool { _, ok := idx.PodByIP(ip, t0); return ok })
	if q, ok := idx.PodByHostPort("udp", 53, "node-2"); !ok || q.Name != "old" {
		t.Errorf("PodByHostPort(udp, 53) = %q, %v", q.Name, ok)
	}

	// Deleted at t0+1m: still found for events before that.
	clk.Add(time.Minute)
	if err := pods.Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "old deleted", func() bool { _, ok := idx.PodByIP(ip, t0.Add(2*time.Minute)); return !ok })
	if q, ok := idx.PodByIP(ip, t0.Add(30*time.Second)); !ok || q.Name != "old" || !q.Deleted.Equal(t0.Add(time.Minute)) {
		t.Errorf("PodByIP before the deletion = %+v, %v; want the tombstone of old deleted at %v", q, ok, t0.Add(time.Minute))
	}
	if _, ok := idx.PodByHostPort("udp", 53, "node-2"); ok {
		t.Error("a deleted pod still owns its hostPort")
	}

	// The IP is reused at t0+3m: each event time gets its own pod.
	clk.Add(2 * time.Minute)
	if _, err := pods.Create(ctx, testPod("new", "node-2", ip.String(), t0.Add(3*time.Minute)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new's IP", func() bool { q, ok := idx.PodByIP(ip, t0.Add(4*time.Minute)); return ok && q.Name == "new" })
	if q, ok := idx.PodByIP(ip, t0.Add(30*time.Second)); !ok || q.Name != "old" {
		t.Errorf("PodByIP(30s) after reuse = %q, %v; want old", q.Name, ok)
	}
	if _, ok := idx.PodByIP(ip, t0.Add(2*time.Minute)); ok {
		t.Error("PodByIP found a pod between old's deletion and new's creation")
	}
	// A few seconds before its creation time is clock skew, not another pod.
	if q, ok := idx.PodByIP(ip, t0.Add(3*time.Minute-10*time.Second)); !ok || q.Name != "new" {
		t.Errorf("PodByIP(10s before new's creation) = %q, %v; want new", q.Name, ok)
	}
	if ps, _ := idx.Snapshot(); len(ps) != 2 {
		t.Errorf("snapshot within retention has %d pods, want live new and deleted old", len(ps))
	}

	// After the retention period the tombstone goes (pruned on the next change).
	clk.Add(15 * time.Minute)
	if _, err := pods.Create(ctx, testPod("other", "node-1", "10.244.2.30", t0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "other", func() bool { _, ok := idx.PodByIP(mustAddr("10.244.2.30"), time.Time{}); return ok })
	if q, ok := idx.PodByIP(ip, t0.Add(30*time.Second)); ok && q.Name == "old" {
		t.Error("tombstone of old outlived the retention period")
	}
	if ps, _ := idx.Snapshot(); len(ps) != 2 {
		t.Errorf("snapshot after retention has %d pods, want new and other", len(ps))
	}
}

func TestClientServices(t *testing.T) {
	ctx := startOf(t)
	cs := fake.NewClientset()
	idx, err := NewFromClient(ctx, cs, "node-2", Options{})
	if err != nil {
		t.Fatal(err)
	}
	svcs := cs.CoreV1().Services("shop")
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "front", Namespace: "shop", Annotations: map[string]string{"a": "b"}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.5.5", ClusterIPs: []string{"10.96.5.5"},
			ExternalIPs:           []string{"203.0.113.7"},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Selector:              map[string]string{"app": "front"},
			Ports: []corev1.ServicePort{{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443,
				NodePort: 31443, TargetPort: intstr.FromString("https")}},
		},
	}
	if _, err := svcs.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vip := mustAddr("10.96.5.5")
	eventually(t, "front", func() bool { _, _, ok := idx.ServiceByAddr(vip, 443, "tcp", false, time.Time{}); return ok })
	proxy := corev1.LoadBalancerIPModeProxy
	s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.9", IPMode: &proxy}}
	if _, err := svcs.UpdateStatus(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lb := mustAddr("198.51.100.9")
	eventually(t, "front's LB IP", func() bool { _, _, ok := idx.ServiceByAddr(lb, 443, "tcp", false, time.Time{}); return ok })
	got, sp, _ := idx.ServiceByAddr(lb, 443, "tcp", false, time.Time{})
	if got.LBIngress[0].IPMode != "Proxy" || sp.TargetPort != "https" || got.ExternalTrafficPolicy != "Local" {
		t.Errorf("front = %+v %+v", got, sp)
	}
	node := mustAddr("192.168.1.12")
	for _, c := range []struct {
		a        netip.Addr
		port     uint16
		nodeAddr bool
		want     bool
	}{
		{mustAddr("203.0.113.7"), 443, false, true},
		{node, 31443, true, true},
		{node, 31443, false, false},
		{node, 443, true, false},
		{vip, 31443, false, false},
	} {
		if _, _, ok := idx.ServiceByAddr(c.a, c.port, "tcp", c.nodeAddr, time.Time{}); ok != c.want {
			t.Errorf("ServiceByAddr(%s, %d, nodeAddr %v) = %v, want %v", c.a, c.port, c.nodeAddr, ok, c.want)
		}
	}

	// A changed port re-indexes: the old port and NodePort stop matching.
	s.Spec.Ports[0].Port, s.Spec.Ports[0].NodePort = 8443, 31444
	if _, err := svcs.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "front's new port", func() bool { _, _, ok := idx.ServiceByAddr(vip, 8443, "tcp", false, time.Time{}); return ok })
	if _, _, ok := idx.ServiceByAddr(vip, 443, "tcp", false, time.Time{}); ok {
		t.Error("old port still matches")
	}
	if _, _, ok := idx.ServiceByAddr(node, 31443, "tcp", true, time.Time{}); ok {
		t.Error("old NodePort still matches")
	}

	ready, notReady := true, false
	port, name, node2 := int32(8443), "https", "node-2"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "front-abcde", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "front", "x": "y"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.40"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node2,
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "front-1", UID: "u"}},
			{Addresses: []string{"10.244.2.40"}, Conditions: discoveryv1.EndpointConditions{Ready: &notReady}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("shop").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := ServiceRef{Namespace: "shop", Name: "front"}
	eventually(t, "front's endpoints", func() bool { return len(idx.EndpointsOf(ref)) == 1 })
	if ep := idx.EndpointsOf(ref)[0]; ep.Addr.String() != "10.244.1.40:8443" || ep.Node != "node-2" || ep.Pod == nil || ep.Pod.Name != "front-1" || ep.PortName != "https" {
		t.Errorf("endpoint = %+v", ep)
	}
	if err := cs.DiscoveryV1().EndpointSlices("shop").Delete(ctx, "front-abcde", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "front's endpoints gone", func() bool { return len(idx.EndpointsOf(ref)) == 0 })

	if err := svcs.Delete(ctx, "front", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "front gone", func() bool { _, ok := idx.ServiceByIP(vip, time.Time{}); return !ok })
	if _, _, ok := idx.ServiceByAddr(node, 31444, "tcp", true, time.Time{}); ok {
		t.Error("deleted Service's NodePort still matches")
	}
}

func TestClientTransformStrips(t *testing.T) {
	ctx := startOf(t)
	now := time.Now()
	local, remote := testPod("local", "node-2", "10.244.1.21", now), testPod("remote", "node-1", "10.244.2.21", now)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "default", Annotations: map[string]string{"a": "b"}, Labels: map[string]string{"l": "m"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.9.9", ClusterIPs: []string{"10.96.9.9"}, Selector: map[string]string{"app": "s"},
			SessionAffinity: corev1.ServiceAffinityClientIP, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	cs := fake.NewClientset(local, remote, svc)
	idx, err := NewFromClient(ctx, cs, "node-2", Options{})
	if err != nil {
		t.Fatal(err)
	}
	ci := idx.(*clientIndex)
	stored := map[string]*cached{}
	for kind, inf := range ci.informers {
		for _, o := range inf.GetStore().List() {
			c, ok := o.(*cached)
			if !ok {
				t.Fatalf("%s informer stores a %T, want the converted form", kind, o)
			}
			stored[c.Name] = c
		}
	}
	for name, c := range stored {
		if c.ManagedFields != nil || c.Annotations != nil || c.Labels != nil || c.OwnerReferences != nil || c.err != nil {
			t.Errorf("stored %s keeps metadata the index does not use: %+v", name, c.ObjectMeta)
		}
	}
	if l := stored["local"]; l == nil || l.pod == nil || len(l.pod.ContainerIDs) != 2 || l.pod.ContainerIDs[0] != "aaaa" ||
		len(l.pod.HostPorts) != 1 || l.pod.HostPorts[0] != (HostPort{Proto: "udp", HostPort: 53, ContainerPort: 5353}) {
		t.Errorf("local pod = %+v, want its container IDs and its hostPort", l)
	}
	if r := stored["remote"]; r == nil || r.pod == nil || r.pod.ContainerIDs != nil || r.pod.Node != "node-1" || len(r.pod.IPs) != 1 {
		t.Errorf("remote pod = %+v, want name, node and IPs without container IDs", r)
	}
	if s := stored["s"]; s == nil || s.svc == nil || len(s.svc.Ports) != 1 {
		t.Errorf("stored service = %+v", s)
	}
	// Stripped or not, the answers are those of the full objects.
	if p, ok := idx.PodByIP(mustAddr("10.244.1.21"), time.Time{}); !ok || len(p.ContainerIDs) != 2 || p.ContainerIDs[1] != "bbbb" || len(p.HostPorts) != 1 {
		t.Errorf("local pod = %+v, %v", p, ok)
	}
	if _, sp, ok := idx.ServiceByAddr(mustAddr("10.96.9.9"), 80, "TCP", false, time.Time{}); !ok || sp.TargetPort != "8080" || sp.Proto != "tcp" {
		t.Errorf("service port = %+v, %v", sp, ok)
	}
	// The transform is idempotent, as informers require, and its copies
	// are deep where they are mutable.
	strip := stripper("node-2")
	once, _ := strip(local.DeepCopy())
	twice, _ := strip(once)
	if once != twice {
		t.Error("transform of a converted object converted it again")
	}
	cp := once.(*cached).DeepCopyObject().(*cached)
	if cp.pod != once.(*cached).pod || cp.Name != "local" {
		t.Errorf("DeepCopyObject = %+v", cp)
	}
	if other, _ := strip("not an API object"); other != "not an API object" {
		t.Errorf("transform changed an unknown type: %v", other)
	}
}

var errRefused = errors.New("dial tcp 10.96.0.1:443: connect: connection refused")

// outage makes the fake API server refuse lists and watches of resource
// while down is set; stop ends the watches already open, as a dropped
// connection does.
type outage struct {
	down    atomic.Bool
	mu      sync.Mutex
	watches []watch.Interface
}

func (o *outage) stop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, w := range o.watches {
		w.Stop()
	}
	o.watches = nil
}

func failing(cs *fake.Clientset, resource string, o *outage) {
	cs.PrependReactor("list", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		if o.down.Load() {
			return true, nil, errRefused
		}
		return false, nil, nil
	})
	cs.PrependWatchReactor(resource, func(a k8stesting.Action) (bool, watch.Interface, error) {
		if o.down.Load() {
			return true, nil, errRefused
		}
		wa := a.(k8stesting.WatchActionImpl)
		w, err := cs.Tracker().Watch(wa.GetResource(), wa.GetNamespace(), metav1.ListOptions{ResourceVersion: wa.WatchRestrictions.ResourceVersion})
		if err == nil {
			o.mu.Lock()
			o.watches = append(o.watches, w)
			o.mu.Unlock()
		}
		return true, w, err
	})
}

func TestClientWatchErrorWarning(t *testing.T) {
	ctx := startOf(t)
	cs := fake.NewClientset(testPod("a", "node-2", "10.244.1.50", time.Now()))
	o := &outage{}
	failing(cs, "pods", o)
	idx, err := NewFromClient(ctx, cs, "node-2", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !idx.Synced() || len(idx.Warnings()) != 0 {
		t.Fatalf("synced %v warnings %q", idx.Synced(), idx.Warnings())
	}
	// The API server goes away: the open watch ends and cannot restart.
	o.down.Store(true)
	o.stop()
	eventually(t, "an unreachable warning", func() bool {
		w := idx.Warnings()
		return len(w) == 1 && strings.Contains(w[0], "API server unreachable since") && strings.Contains(w[0], "pods: ") && strings.Contains(w[0], errRefused.Error())
	})
	// The last known state keeps answering.
	if _, ok := idx.PodByIP(mustAddr("10.244.1.50"), time.Time{}); !ok {
		t.Error("pod a forgotten during the outage")
	}
	// It comes back: the reflector re-lists, the warning goes.
	o.down.Store(false)
	if err := cs.Tracker().Add(testPod("c", "node-2", "10.244.1.52", time.Now())); err != nil {
		t.Fatal(err)
	}
	eventually(t, "recovery", func() bool {
		_, ok := idx.PodByIP(mustAddr("10.244.1.52"), time.Time{})
		return ok && len(idx.Warnings()) == 0
	})
}

func TestClientUnreachableAtStart(t *testing.T) {
	ctx := startOf(t)
	cs := fake.NewClientset(testPod("a", "node-2", "10.244.1.50", time.Now()))
	o := &outage{}
	o.down.Store(true)
	for _, r := range []string{"pods", "services", "endpointslices"} {
		failing(cs, r, o)
	}
	start := time.Now()
	idx, err := NewFromClient(ctx, cs, "node-2", Options{SyncTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("NewFromClient blocked %v with the API server down", d)
	}
	if idx.Synced() {
		t.Error("Synced with the API server down")
	}
	w := strings.Join(idx.Warnings(), "\n")
	if !strings.Contains(w, "metadata incomplete: pods, services, endpointslices not listed") || !strings.Contains(w, "API server unreachable since") {
		t.Errorf("warnings = %q", w)
	}
	if _, ok := idx.PodByIP(mustAddr("10.244.1.50"), time.Time{}); ok {
		t.Error("found a pod that was never listed")
	}
	o.down.Store(false)
	eventually(t, "sync after the API server returns", func() bool {
		_, ok := idx.PodByIP(mustAddr("10.244.1.50"), time.Time{})
		return ok && idx.Synced() && !strings.Contains(strings.Join(idx.Warnings(), "\n"), "metadata incomplete")
	})
}

func TestClientCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewFromClient(ctx, fake.NewClientset(), "n", Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("NewFromClient(cancelled) = %v, want context.Canceled", err)
	}
}

// An address reused within a second: the new pod's creationTimestamp has
// whole seconds, so it looks created before a connection made while the
// old pod, deleted later, still held the address. The old pod held it.
// Each change is told to OnChange with the time the index took it.
func TestPodByIPReuseWithinTheSecond(t *testing.T) {
	ctx, t0, clk, cs, idx := clockedIndex(t, 800*time.Millisecond)
	var mu sync.Mutex
	var changes []time.Time
	var deltas []*trace.MetadataChange
	idx.OnChange(func(at time.Time, d *trace.MetadataChange) {
		mu.Lock()
		changes, deltas = append(changes, at), append(deltas, d)
		mu.Unlock()
	})
	ip := mustAddr("10.244.1.20")
	pods := cs.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, testPod("old", "node-2", ip.String(), t0.Add(-time.Hour)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "old", func() bool { _, ok := idx.PodByIP(ip, t0); return ok })
	if err := pods.Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, testPod("new", "node-2", ip.String(), t0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new", func() bool { q, ok := idx.PodByIP(ip, time.Time{}); return ok && q.Name == "new" })
	if q, ok := idx.PodByIP(ip, t0.Add(500*time.Millisecond)); !ok || q.Name != "old" {
		t.Errorf("at +0.5s, before old's deletion at +0.8s: %q, %v; want old", q.Name, ok)
	}
	if q, ok := idx.PodByIP(ip, t0.Add(900*time.Millisecond)); !ok || q.Name != "new" {
		t.Errorf("at +0.9s, after old's deletion: %q, %v; want new", q.Name, ok)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 3 || !changes[2].Equal(clk.Now()) {
		t.Fatalf("OnChange told %v, want three changes at %s", changes, clk.Now())
	}
	// The deletion: the live old gone, its tombstone, deleted now, new.
	if d := deltas[1]; len(d.PodsGone) != 1 || d.PodsGone[0] != (trace.ObjectRef{Namespace: "default", Name: "old"}) ||
		len(d.Pods) != 1 || !d.Pods[0].Deleted.Equal(clk.Now()) || d.Pods[0].IPs[0] != ip.String() {
		t.Errorf("the deletion told as %+v", d)
	}
	if d := deltas[2]; len(d.Pods) != 1 || d.Pods[0].Name != "new" || !d.Pods[0].Deleted.IsZero() {
		t.Errorf("the creation told as %+v", d)
	}
}

// TestPodByIPBetweenPods: a connection made after the index saw a pod's
// deletion and before it saw the next pod on the address (created in the
// same second: its creationTimestamp cannot place it before) names the
// pod that held the address last; made after the index saw the next pod,
// that one. The soak found this: the check's truth was the old pod.
func TestPodByIPBetweenPods(t *testing.T) {
	ctx, t0, clk, cs, idx := clockedIndex(t, 800*time.Millisecond)
	ip := mustAddr("10.244.1.21")
	pods := cs.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, testPod("old", "node-2", ip.String(), t0.Add(-time.Hour)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "old", func() bool { _, ok := idx.PodByIP(ip, t0); return ok })
	if err := pods.Delete(ctx, "old", metav1.DeleteOptions{}); err != nil { // seen at +0.8s
		t.Fatal(err)
	}
	eventually(t, "old's deletion", func() bool {
		q, ok := idx.PodByIP(ip, t0.Add(900*time.Millisecond))
		return !ok || q.Name != "old" || !q.Deleted.IsZero()
	})
	clk.Add(3 * time.Second)
	if _, err := pods.Create(ctx, testPod("new", "node-2", ip.String(), t0), metav1.CreateOptions{}); err != nil { // seen at +3.8s
		t.Fatal(err)
	}
	eventually(t, "new", func() bool { q, ok := idx.PodByIP(ip, time.Time{}); return ok && q.Name == "new" })
	for _, c := range []struct {
		at   time.Duration
		want string
	}{
		{500 * time.Millisecond, "old"}, // before old's deletion
		{900 * time.Millisecond, "old"}, // between the two: old held it last
		// Longer after old let go, a pod seen only after the connection
		// is the one: it had its IP before the API server said so.
		{800*time.Millisecond + 2*HandOver, "new"},
		{3900 * time.Millisecond, "new"},
	} {
		if q, ok := idx.PodByIP(ip, t0.Add(c.at)); !ok || q.Name != c.want {
			t.Errorf("at +%s: %q, %v; want %s", c.at, q.Name, ok, c.want)
		}
	}
}

// A Service deleted after a connection was made still names it, as a
// flow is named when its linger ends; a connection made after the
// deletion finds none, and a Service that took the address since is found
// from then on.
func TestServiceDeletedAfterTheConnection(t *testing.T) {
	ctx, t0, clk, cs, idx := clockedIndex(t, 0)
	vip := mustAddr("10.96.50.1")
	svc := func(name string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: vip.String(), ClusterIPs: []string{vip.String()}, Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}}}
	}
	services := cs.CoreV1().Services("default")
	if _, err := services.Create(ctx, svc("old"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "old", func() bool { _, _, ok := idx.ServiceByAddr(vip, 80, "tcp", false, time.Time{}); return ok })
	clk.Add(time.Second)
	if err := services.Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "old deleted", func() bool { _, ok := idx.ServiceByIP(vip, time.Time{}); return !ok })
	if s, _, ok := idx.ServiceByAddr(vip, 80, "tcp", false, t0.Add(500*time.Millisecond)); !ok || s.Name != "old" {
		t.Errorf("a connection before the deletion: %q, %v; want old", s.Name, ok)
	}
	if s, ok := idx.ServiceByIP(vip, t0.Add(500*time.Millisecond)); !ok || s.Name != "old" {
		t.Errorf("ServiceByIP before the deletion: %q, %v; want old", s.Name, ok)
	}
	if _, _, ok := idx.ServiceByAddr(vip, 80, "tcp", false, t0.Add(2*time.Second)); ok {
		t.Error("a connection after the deletion found the deleted Service")
	}
	clk.Add(time.Second)
	if _, err := services.Create(ctx, svc("new"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new", func() bool { _, _, ok := idx.ServiceByAddr(vip, 80, "tcp", false, time.Time{}); return ok })
	if s, _, ok := idx.ServiceByAddr(vip, 80, "tcp", false, t0.Add(3*time.Second)); !ok || s.Name != "new" {
		t.Errorf("after the new Service took the address: %q, %v; want new", s.Name, ok)
	}
	if s, _, ok := idx.ServiceByAddr(vip, 80, "tcp", false, t0.Add(500*time.Millisecond)); !ok || s.Name != "old" {
		t.Errorf("before the old one's deletion, with the new one live: %q, %v; want old", s.Name, ok)
	}
	// Both deleted now: each still names the connections of its time.
	clk.Add(time.Second)
	if err := services.Delete(ctx, "new", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new deleted", func() bool { _, ok := idx.ServiceByIP(vip, time.Time{}); return !ok })
	for _, c := range []struct {
		at   time.Duration
		want string
	}{{500 * time.Millisecond, "old"}, {2500 * time.Millisecond, "new"}} {
		if s, _, ok := idx.ServiceByAddr(vip, 80, "tcp", false, t0.Add(c.at)); !ok || s.Name != c.want {
			t.Errorf("at +%s, both deleted since: %q, %v; want %s", c.at, s.Name, ok, c.want)
		}
	}
}

// clockedIndex is an index of a fake clientset on node-2, with a clock
// that starts at t0 plus start and moves only when the test moves it,
// and a 10-minute retention.
func clockedIndex(t *testing.T, start time.Duration) (context.Context, time.Time, *clock, *fake.Clientset, Index) {
	t.Helper()
	ctx := startOf(t)
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	clk := newClock(t0.Add(start))
	cs := fake.NewClientset()
	idx, err := NewFromClient(ctx, cs, "node-2", Options{Now: clk.Now, Retention: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, t0, clk, cs, idx
}

// A dual-stack pod is found by either of its addresses, and a dual-stack
// Service by either ClusterIP, on its port, as the flows of each family
// address them.
func TestDualStackPodAndService(t *testing.T) {
	ctx, t0, _, cs, idx := clockedIndex(t, 0)
	p := testPod("web", "node-2", "10.244.1.30", t0.Add(-time.Hour))
	p.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.30"}, {IP: "fd44:1::30"}}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.7.7", ClusterIPs: []string{"10.96.7.7", "fd96::7"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}}}
	if _, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web", func() bool {
		_, ok := idx.PodByIP(mustAddr("fd44:1::30"), t0)
		_, _, sok := idx.ServiceByAddr(mustAddr("fd96::7"), 80, "tcp", false, time.Time{})
		return ok && sok
	})
	for _, a := range []string{"10.244.1.30", "fd44:1::30", "::ffff:10.244.1.30"} {
		if q, ok := idx.PodByIP(mustAddr(a), t0); !ok || q.Name != "web" {
			t.Errorf("PodByIP(%s) = %q, %v; want web", a, q.Name, ok)
		}
	}
	for _, a := range []string{"10.96.7.7", "fd96::7"} {
		if s, sp, ok := idx.ServiceByAddr(mustAddr(a), 80, "tcp", false, time.Time{}); !ok || s.Name != "web" || sp.Name != "http" {
			t.Errorf("ServiceByAddr(%s, 80) = %q port %q, %v; want web http", a, s.Name, sp.Name, ok)
		}
	}
	if _, ok := idx.ServiceByIP(mustAddr("fd96::8"), time.Time{}); ok {
		t.Error("ServiceByIP found a Service at an address it does not have")
	}
}
