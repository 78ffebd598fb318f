package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Scale of TestScale's cluster, and its targets for the metadata index.
const (
	scalePods       = 5000
	scaleServices   = 1000
	scaleNamespaces = 20
	podsPerService  = scalePods / scaleServices
	localEvery      = 50 // one pod in localEvery runs on this node
	maxSync         = 10 * time.Second
	maxHeap         = 100 << 20
)

func scalePodIP(i int) string   { return fmt.Sprintf("10.200.%d.%d", i/250, i%250+1) }
func scaleNS(i int) string      { return fmt.Sprintf("scale-%d", (i/podsPerService)%scaleNamespaces) }
func scaleLBIP(j int) string    { return fmt.Sprintf("198.51.100.%d", j/50+1) }
func scaleNodePort(j int) int32 { return int32(30000 + j) }
func scalePodNode(i int) string {
	if i%localEvery == 0 {
		return thisNode
	}
	return fmt.Sprintf("node-%d", i%97+1)
}

// TestScale fills a real API server with 5,000 pods (most on other nodes),
// 1,000 Services and their EndpointSlices, then measures how long the
// tracer's metadata index takes to sync and how much memory it holds, and
// checks it resolves every pod and Service.
func TestScale(t *testing.T) {
	c := startCluster(t, 5000)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	fill := time.Now()
	for n := range scaleNamespaces {
		if err := createNamespace(ctx, c.admin, fmt.Sprintf("scale-%d", n)); err != nil {
			t.Fatal(err)
		}
	}
	pods := make([]*corev1.Pod, scalePods)
	parallel(t, scalePods, 64, func(i int) error {
		node := scalePodNode(i)
		p, err := runPod(ctx, c.admin, scaleNS(i), fmt.Sprintf("pod-%d", i), node, "172.19.0."+strconv.Itoa(i%97+1), scalePodIP(i))
		pods[i] = p
		return err
	})
	t.Logf("scale: %d pods created and given a status in %s", scalePods, time.Since(fill).Round(time.Millisecond))
	svcStart := time.Now()
	svcs := make([]*corev1.Service, scaleServices)
	parallel(t, scaleServices, 64, func(j int) error {
		ns := scaleNS(j * podsPerService)
		name := fmt.Sprintf("svc-%d", j)
		var err error
		switch {
		case j%50 == 0:
			svcs[j], err = createService(ctx, c.admin, service(ns, name, corev1.ServiceTypeLoadBalancer, tcpPort("http", 80, 8080, scaleNodePort(j))), scaleLBIP(j))
		case j%10 == 0:
			svcs[j], err = createService(ctx, c.admin, service(ns, name, corev1.ServiceTypeNodePort, tcpPort("http", 80, 8080, scaleNodePort(j))))
		default:
			svcs[j], err = createService(ctx, c.admin, service(ns, name, corev1.ServiceTypeClusterIP, tcpPort("http", 80, 8080, 0)))
		}
		if err != nil {
			return err
		}
		return createSlice(ctx, c.admin, svcs[j], "http", 8080, pods[j*podsPerService:(j+1)*podsPerService]...)
	})
	t.Logf("scale: %d Services and EndpointSlices created in %s (whole fill %s)",
		scaleServices, time.Since(svcStart).Round(time.Millisecond), time.Since(fill).Round(time.Millisecond))

	// Baseline: this process without the index.
	runtime.GC()
	debug.FreeOSMemory()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rssBefore := procStatus(t, "VmRSS")

	start := time.Now()
	idx := newIndex(t, c.tracerKubeconfig, 2*time.Minute)
	syncTime := time.Since(start)
	if !idx.Synced() {
		t.Fatalf("index not synced %s after start: %q", syncTime, idx.Warnings())
	}

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapInuse) - int64(before.HeapInuse)
	rssAfter := procStatus(t, "VmRSS")
	t.Logf("scale: metadata index synced %d pods, %d Services, %d EndpointSlices in %s (target < %s)",
		scalePods, scaleServices, scaleServices, syncTime.Round(time.Millisecond), maxSync)
	t.Logf("scale: heap in use +%.1f MiB (target < %d MiB); process RSS %.1f -> %.1f MiB (+%.1f), peak RSS %.1f MiB",
		mib(heap), maxHeap>>20, mib(rssBefore), mib(rssAfter), mib(rssAfter-rssBefore), mib(procStatus(t, "VmHWM")))
	if syncTime > maxSync {
		t.Errorf("sync took %s, want < %s", syncTime, maxSync)
	}
	if heap > maxHeap {
		t.Errorf("index holds %.1f MiB of heap, want < %d MiB", mib(heap), maxHeap>>20)
	}

	// Every pod and Service answers, as it should.
	lookups := time.Now()
	for i := range scalePods {
		p, ok := idx.PodByIP(netip.MustParseAddr(scalePodIP(i)), time.Now())
		if want := scaleNS(i) + "/pod-" + strconv.Itoa(i); !ok || p.Key() != want || p.Node != scalePodNode(i) {
			t.Fatalf("PodByIP(%s) = %s on %q (found %v), want %s on %s", scalePodIP(i), p.Key(), p.Node, ok, want, scalePodNode(i))
		}
		// Only this node's pods keep their container IDs.
		if local := p.Node == thisNode; local != (len(p.ContainerIDs) == 1) {
			t.Fatalf("pod %s on %s has container IDs %q", p.Key(), p.Node, p.ContainerIDs)
		}
	}
	nodeAddr := netip.MustParseAddr("172.19.0.1")
	for j := range scaleServices {
		want := fmt.Sprintf("svc-%d", j)
		s, _, ok := idx.ServiceByAddr(netip.MustParseAddr(svcs[j].Spec.ClusterIP), 80, "tcp", false, time.Time{})
		if !ok || s.Name != want {
			t.Fatalf("ServiceByAddr(ClusterIP of %s) = %s (found %v)", want, s.Name, ok)
		}
		if j%10 == 0 {
			if s, _, ok := idx.ServiceByAddr(nodeAddr, uint16(scaleNodePort(j)), "tcp", true, time.Time{}); !ok || s.Name != want {
				t.Fatalf("ServiceByAddr(NodePort %d) = %s (found %v), want %s", scaleNodePort(j), s.Name, ok, want)
			}
		}
		if j%50 == 0 {
			if s, _, ok := idx.ServiceByAddr(netip.MustParseAddr(scaleLBIP(j)), 80, "tcp", false, time.Time{}); !ok || s.Name != want {
				t.Fatalf("ServiceByAddr(LB %s) = %s (found %v), want %s", scaleLBIP(j), s.Name, ok, want)
			}
		}
		if eps := idx.EndpointsOf(s.Key()); len(eps) != podsPerService {
			t.Fatalf("EndpointsOf(%s) has %d endpoints, want %d", want, len(eps), podsPerService)
		}
	}
	t.Logf("scale: %d pod and %d Service lookups in %s", scalePods, scaleServices, time.Since(lookups).Round(time.Millisecond))
	snapPods, snapSvcs := idx.Snapshot()
	if len(snapPods) != scalePods || len(snapSvcs) != scaleServices+1 {
		t.Errorf("Snapshot: %d pods, %d Services; want %d and %d (with default/kubernetes)", len(snapPods), len(snapSvcs), scalePods, scaleServices+1)
	}
	runtime.KeepAlive(idx)
}

// parallel runs do(0..n-1) on workers goroutines; the first error fails the
// test after the others finish.
func parallel(t *testing.T, n, workers int, do func(i int) error) {
	t.Helper()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		next     = make(chan int)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := do(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
}

// procStatus reads a size field of /proc/self/status, in bytes.
func procStatus(t testing.TB, field string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatalf("read process status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("parse %s %q: %v", field, val, err)
		}
		return kb << 10
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
