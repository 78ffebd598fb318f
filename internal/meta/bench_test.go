package meta

import (
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
)

const (
	benchPods     = 5000
	benchServices = 1000
	benchNodes    = 100
)

func benchPodIP(i int) string     { return fmt.Sprintf("10.%d.%d.%d", 64+i/65536, (i/256)%256, i%256) }
func benchServiceIP(i int) string { return fmt.Sprintf("10.96.%d.%d", i/256, i%256) }

// managedFields as the API server keeps them for a pod written by a
// controller and the kubelet: the bulk of a pod's memory that the index never
// reads.
var benchManaged = []metav1.ManagedFieldsEntry{
	{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"5b908388-7ca5-a073-d414-e132a64979c2\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:env":{".":{},"k:{\"name\":\"MODE\"}":{".":{},"f:name":{},"f:value":{}}},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:ports":{".":{},"k:{\"containerPort\":8080,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:name":{},"f:protocol":{}}},"f:readinessProbe":{".":{},"f:httpGet":{".":{},"f:path":{},"f:port":{},"f:scheme":{}}},"f:resources":{".":{},"f:limits":{".":{},"f:memory":{}},"f:requests":{".":{},"f:cpu":{},"f:memory":{}}},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{},"f:volumeMounts":{".":{},"k:{\"mountPath\":\"/etc/app\"}":{".":{},"f:mountPath":{},"f:name":{}}}}},"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:terminationGracePeriodSeconds":{},"f:volumes":{".":{},"k:{\"name\":\"config\"}":{".":{},"f:configMap":{".":{},"f:defaultMode":{},"f:name":{}},"f:name":{}}}}}`)}},
	{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Subresource: "status",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"ContainersReady\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Initialized\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"PodReadyToStartContainers\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Ready\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}}},"f:containerStatuses":{},"f:hostIP":{},"f:hostIPs":{},"f:phase":{},"f:podIP":{},"f:podIPs":{".":{},"k:{\"ip\":\"10.64.0.1\"}":{".":{},"f:ip":{}}},"f:startTime":{}}}`)}},
}

// benchPod is a pod as a Deployment and the kubelet leave it.
func benchPod(i int) *corev1.Pod {
	name := fmt.Sprintf("app-%d-5d8f7c9b4-%05d", i/50, i)
	node := fmt.Sprintf("node-%d", i%benchNodes)
	created := metav1.NewTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second))
	ip := benchPodIP(i)
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080), Scheme: "HTTP"}},
		TimeoutSeconds: 1, PeriodSeconds: 10, SuccessThreshold: 1, FailureThreshold: 3}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: fmt.Sprintf("team-%d", i%40), GenerateName: name[:len(name)-5],
			UID: types.UID(fmt.Sprintf("bd2da9ef-3984-4557-9665-%012d", i)), ResourceVersion: fmt.Sprint(100000 + i),
			CreationTimestamp: created,
			Labels:            map[string]string{"app": fmt.Sprintf("app-%d", i/50), "pod-template-hash": "5d8f7c9b4", "team": fmt.Sprintf("team-%d", i%40)},
			Annotations:       map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-01T00:00:00Z", "prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
			OwnerReferences:   []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name[:len(name)-6], UID: "5b908388-7ca5-a073-d414-e132a64979c2"}},
			ManagedFields:     benchManaged,
		},
		Spec: corev1.PodSpec{
			NodeName: node, ServiceAccountName: "default", SchedulerName: "default-scheduler", DNSPolicy: corev1.DNSClusterFirst,
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.example.com/app:1.14.2", ImagePullPolicy: corev1.PullIfNotPresent,
				Env:   []corev1.EnvVar{{Name: "MODE", Value: "prod"}, {Name: "LOG_LEVEL", Value: "info"}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
				ReadinessProbe: probe, LivenessProbe: probe,
				VolumeMounts:             []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}, {Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
				TerminationMessagePath:   "/dev/termination-log",
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}}}},
				{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				}}}},
			},
			Tolerations: []corev1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
			},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: "192.168.1.12", HostIPs: []corev1.HostIP{{IP: "192.168.1.12"}},
			PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &created, QOSClass: corev1.PodQOSBurstable,
			Conditions: []corev1.PodCondition{
				{Type: "PodReadyToStartContainers", Status: "True", LastTransitionTime: created},
				{Type: corev1.PodInitialized, Status: "True", LastTransitionTime: created},
				{Type: corev1.PodReady, Status: "True", LastTransitionTime: created},
				{Type: corev1.ContainersReady, Status: "True", LastTransitionTime: created},
				{Type: corev1.PodScheduled, Status: "True", LastTransitionTime: created},
			},
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "app", Image: "registry.example.com/app:1.14.2", ImageID: "registry.example.com/app@sha256:" + strings.Repeat("ab", 32),
				ContainerID: fmt.Sprintf("containerd://%064x", i), Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: created}},
			}},
		},
	}
	if i%50 == 0 {
		p.Spec.Containers[0].Ports[0].HostPort = 18080
	}
	return p
}

func benchService(i int) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("svc-%d", i), Namespace: fmt.Sprintf("team-%d", i%40), UID: types.UID(fmt.Sprintf("svc-%d", i)),
			ResourceVersion: fmt.Sprint(200000 + i),
			Labels:          map[string]string{"app": fmt.Sprintf("app-%d", i)},
			Annotations:     map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 600)},
		},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: benchServiceIP(i), ClusterIPs: []string{benchServiceIP(i)},
			Selector: map[string]string{"app": fmt.Sprintf("app-%d", i)},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090, TargetPort: intstr.FromString("metrics")},
			},
		},
	}
	if i%10 == 0 {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		s.Spec.Ports[0].NodePort = int32(30000 + i)
	}
	return s
}

func benchSlice(i int) *discoveryv1.EndpointSlice {
	port, name, ready := int32(8080), "http", true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d-abcde", i), Namespace: fmt.Sprintf("team-%d", i%40),
			Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%d", i), "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}
	for j := range 5 {
		node := fmt.Sprintf("node-%d", (5*i+j)%benchNodes)
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{benchPodIP((5*i + j) % benchPods)}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: es.Namespace, Name: fmt.Sprintf("pod-%d", 5*i+j), UID: "u"},
		})
	}
	return es
}

func benchObjects() []k8sruntime.Object {
	var objs []k8sruntime.Object
	for i := range benchPods {
		objs = append(objs, benchPod(i))
	}
	for i := range benchServices {
		objs = append(objs, benchService(i), benchSlice(i))
	}
	return objs
}

func benchIndex(b *testing.B) Index {
	st := newStore(0, nil)
	for i := range benchPods {
		info, err := podInfo(benchPod(i))
		if err != nil {
			b.Fatal(err)
		}
		st.upsertPod(info)
	}
	for i := range benchServices {
		info, err := serviceInfo(benchService(i))
		if err != nil {
			b.Fatal(err)
		}
		st.upsertService(info)
	}
	return &fileIndex{store: st}
}

func BenchmarkPodByIP(b *testing.B) {
	idx := benchIndex(b)
	addrs := make([]netip.Addr, 1024)
	for i := range addrs {
		addrs[i] = netip.MustParseAddr(benchPodIP(i * 7 % benchPods))
	}
	at := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, ok := idx.PodByIP(addrs[i%len(addrs)], at); !ok {
			b.Fatal("miss")
		}
	}
}

func BenchmarkServiceByAddr(b *testing.B) {
	idx := benchIndex(b)
	node := netip.MustParseAddr("192.168.1.12")
	for _, c := range []struct {
		name     string
		addr     func(i int) netip.Addr
		port     uint16
		nodeAddr bool
		hit      bool
	}{
		{"clusterIP", func(i int) netip.Addr { return netip.MustParseAddr(benchServiceIP(i)) }, 9090, false, true},
		{"nodePort", func(int) netip.Addr { return node }, 30010, true, true},
		{"miss", func(i int) netip.Addr { return netip.MustParseAddr(benchPodIP(i)) }, 80, true, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			addrs := make([]netip.Addr, 1000)
			for i := range addrs {
				addrs[i] = c.addr(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, _, ok := idx.ServiceByAddr(addrs[i%len(addrs)], c.port, "tcp", c.nodeAddr, time.Time{}); ok != c.hit {
					b.Fatalf("%s: ok %v", c.name, ok)
				}
			}
		})
	}
}

// heapAfterSync loads the bench cluster through the fake clientset's
// informers and returns the heap they (and the index) hold.
func heapAfterSync(t *testing.T, strip bool) (uint64, Index) {
	cs := fake.NewClientset(benchObjects()...)
	before := heapInuse()
	idx, err := newClientIndex(t.Context(), cs, "node-2", Options{SyncTimeout: time.Minute, keepAll: !strip}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !idx.Synced() {
		t.Fatal("not synced")
	}
	after := heapInuse()
	runtime.KeepAlive(cs)
	return after - min(before, after), idx
}

func heapInuse() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestInformerMemory measures what the informers and the index hold for
// 5,000 pods, 1,000 Services and their EndpointSlices, with and without the
// transform, and fails if stripping stops paying off.
func TestInformerMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("loads 7,000 objects")
	}
	stripped, idx := heapAfterSync(t, true)
	if _, ok := idx.PodByIP(netip.MustParseAddr(benchPodIP(4321)), time.Time{}); !ok {
		t.Fatal("bench pod missing")
	}
	full, _ := heapAfterSync(t, false)
	t.Logf("heap in use after sync: %.1f MiB converted (%d B per pod, Services and slices included), %.1f MiB unstripped",
		float64(stripped)/(1<<20), stripped/benchPods, float64(full)/(1<<20))
	if stripped*3 > full {
		t.Errorf("stripped informers hold %d B, unstripped %d B: want at least 3x less", stripped, full)
	}
}
