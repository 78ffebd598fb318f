package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/internal/tui"
)

// Soak parameters. TRACER_SOAK sets the duration (make soak: 60m); the
// short form runs in make test. TRACER_SOAK_REPORT names a file for the
// samples and the figures, in Markdown.
const (
	soakShort    = 30 * time.Second
	soakServices = 8
	soakBackends = 4
	soakRate     = 40 // new connections a second
	soakChurn    = 2 * time.Second
	soakPoll     = 2 * time.Second // the node watcher's (node.WatchOptions)
)

// soakNode is the node under churn: Services as DNAT rules in a chain that
// is rewritten whole every soakChurn with iptables-restore, as kube-proxy
// rewrites its chains, one Service's backend moving or the Service going
// away and coming back each time.
type soakNode struct {
	ns netlab.Namespace

	mu      sync.Mutex
	gen     int
	backend map[int]int // service -> backend; absent: no rule
	changes []soakChange
}

// soakChange is a rewrite: when it was in force, and the rule of the
// Service it changed before and after ("" when there was none).
type soakChange struct {
	at            time.Time
	service       int
	before, after string
}

func soakVIP(i int) string         { return fmt.Sprintf("10.96.90.%d:80", i+1) }
func soakBackendAddr(b int) string { return fmt.Sprintf("10.78.0.%d:8080", b+1) }

func soakRule(service, backend int) string {
	return fmt.Sprintf("-A SOAK-SERVICES -d 10.96.90.%d/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination %s", service+1, soakBackendAddr(backend))
}

func (n *soakNode) restore() error {
	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:SOAK-SERVICES - [0:0]\n-A OUTPUT -j SOAK-SERVICES\n")
	for i := 0; i < soakServices; i++ {
		if be, ok := n.backend[i]; ok {
			b.WriteString(soakRule(i, be) + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	cmd := exec.Command("iptables-restore")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore: %v: %s", err, out)
	}
	return nil
}

// churn changes one Service and rewrites the chain.
func (n *soakNode) churn() (soakChange, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gen++
	s := n.gen % soakServices
	c := soakChange{service: s}
	if be, ok := n.backend[s]; ok {
		c.before = soakRule(s, be)
	}
	switch be, ok := n.backend[s]; {
	case ok && n.gen%3 == 0:
		delete(n.backend, s)
	case ok:
		n.backend[s] = (be + 1) % soakBackends
	default:
		n.backend[s] = n.gen % soakBackends
	}
	if be, ok := n.backend[s]; ok {
		c.after = soakRule(s, be)
	}
	if err := n.ns.Do(n.restore); err != nil {
		return c, err
	}
	c.at = time.Now()
	n.changes = append(n.changes, c)
	return c, nil
}

// pick is a Service that has a rule now.
func (n *soakNode) pick(r *rand.Rand) (int, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.backend) == 0 {
		return 0, false
	}
	for {
		if s := r.Intn(soakServices); hasKey(n.backend, s) {
			return s, true
		}
	}
}

func hasKey(m map[int]int, k int) bool { _, ok := m[k]; return ok }

// connLog is what happened, by client address (the soak and the
// rule-in-force test use it): a client's source port
// comes round again within an hour, so each entry has its time, and a
// connection is matched within connMatch of it.
type connLog[T any] struct {
	mu sync.Mutex
	by map[string][]connEntry[T]
}

type connEntry[T any] struct {
	at time.Time
	v  T
}

const connMatch = 2 * time.Second

func (l *connLog[T]) add(client string, at time.Time, v T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[string][]connEntry[T]{}
	}
	l.by[client] = append(l.by[client], connEntry[T]{at, v})
}

func (l *connLog[T]) near(client string, at time.Time) (T, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.by[client] {
		if d := e.at.Sub(at); d > -connMatch && d < connMatch {
			return e.v, true
		}
	}
	var zero T
	return zero, false
}

func (l *connLog[T]) each(fn func(client string, at time.Time, v T)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c, es := range l.by {
		for _, e := range es {
			fn(c, e.at, e.v)
		}
	}
}

// acceptLog listens on each backend address in ns and logs which one
// accepted each client, when.
func acceptLog(t *testing.T, ns netlab.Namespace, log *connLog[string], addrs ...string) {
	t.Helper()
	for _, a := range addrs {
		var ln net.Listener
		if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", a); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
				log.add(c.RemoteAddr().String(), time.Now(), a)
				c.Close()
			}
		}()
	}
}

// inLag reports whether a decision at t on service s fell between a
// change of s and the watcher's next poll, when the tracer still held the
// rules before it: the rule then attributed is the one before the change.
func (n *soakNode) inLag(s int, t time.Time, rule string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.changes {
		if c.service == s && !t.Before(c.at.Add(-time.Second)) && t.Before(c.at.Add(soakPoll+time.Second)) && (rule == c.before || rule == "") {
			return true
		}
	}
	return false
}

type soakSample struct {
	at                   time.Duration
	rssKiB, fds, threads int
	// goroutines and heapKiB are the test process's: the UI store and
	// model, and the soak's own logs of every connection.
	goroutines, heapKiB    int
	storeKiB               int
	flows, stored, changes int
}

// TestSoak runs `tracer trace -o json --record --kubeconfig` on a node
// whose rules are rewritten every 2 s, and whose pods and Services change
// on a real API server as often (a backend's pod replaced by a new one on
// the same IP, a Service created or deleted with its rule), while clients
// make 40 new DNAT'd connections a second; it feeds the flows to the UI's
// store and model (headless), for TRACER_SOAK (default 30 s; make soak:
// an hour). It samples the tracer's resident memory, open files and
// threads, and the UI side's goroutines and heap, and checks: no event
// lost, one flow per connection a backend accepted, each attributed to the
// rule in force when the kernel decided (the backend confirms it) and
// naming the pod and Service the API server had when it was made, live
// and replayed from the recording; except decisions in a change's window
// (the rules' poll, the watch's delivery), which must carry the state
// before or after it; open files and goroutines flat after the first
// quarter; the tracer's memory bounded.
func TestSoak(t *testing.T) {
	requirePriv(t)
	skipInVM(t)
	dur := soakShort
	if s := os.Getenv("TRACER_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("TRACER_SOAK=%q: %v", s, err)
		}
		dur = d
	}
	every := max(dur/60, 2*time.Second)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	lab, err := netlab.New("trsoak")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	ns, err := lab.Namespace("n")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "route", "add", "10.96.90.0/24", "dev", "lo"}} {
		if _, err := ns.Run(args[0], args[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	var backends []string
	for b := 0; b < soakBackends; b++ {
		if _, err := ns.Run("ip", "addr", "add", fmt.Sprintf("10.78.0.%d/32", b+1), "dev", "lo"); err != nil {
			t.Fatal(err)
		}
		backends = append(backends, soakBackendAddr(b))
	}
	var accepted connLog[string]
	acceptLog(t, ns, &accepted, backends...)
	node := &soakNode{ns: ns, backend: map[int]int{}}
	for i := 0; i < soakServices; i++ {
		node.backend[i] = i % soakBackends
	}
	if err := ns.Do(node.restore); err != nil {
		t.Fatal(err)
	}
	cluster := startSoakCluster(t)
	for i := 0; i < soakServices; i++ {
		if err := cluster.setService(context.Background(), i, true); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	ready, rec := filepath.Join(dir, "ready"), filepath.Join(dir, "soak.ndjson")
	cmd := exec.Command(exe, "trace", "-o", "json", "--netns", ns.Path(), "--ready-file", ready, "--record", rec, "--linger", "300ms", "--filter", "port:80",
		"--kubeconfig", cluster.kubeconfig, "--node", soakNodeName)
	cmd.Env = append(os.Environ(), asTracerEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })

	// The UI side: every flow into a capped store, a headless frame per
	// sample.
	caps := trace.Caps{Flows: 20000, Memory: 64 << 20}
	store := trace.NewCappedStore(caps)
	var flows connLog[soakFlow]
	var nflows atomic.Int64
	var sum trace.Summary
	read := make(chan error, 1)
	go func() { read <- readSoakStream(stdout, store, &flows, &nflows, &sum) }()
	waitReady(t, ready, &stderr)
	model := tui.New(tui.Source{Header: trace.Header{Node: "soak"}, Title: "soak", Store: store, Live: true}, tui.Options{})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var dialed connLog[soakDial]
	var refused atomic.Int64
	wg.Add(2)
	go func() { // churn
		defer wg.Done()
		tick := time.NewTicker(soakChurn)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				c, err := node.churn()
				if err == nil {
					err = cluster.churn(c, node.gen)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	go func() { // load
		defer wg.Done()
		r := rand.New(rand.NewSource(1))
		tick := time.NewTicker(time.Second / soakRate)
		defer tick.Stop()
		// Source ports go round 40,000 of them: left to the kernel, a
		// port comes back within the same second for another VIP, and the
		// backends could not tell the two connections apart.
		for port := 0; ; port = (port + 1) % 40000 {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			s, ok := node.pick(r)
			if !ok {
				continue
			}
			ns.Do(func() error {
				at := time.Now()
				d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{Port: 20000 + port}}
				c, err := d.Dial("tcp", soakVIP(s))
				if errors.Is(err, syscall.EADDRINUSE) {
					return nil
				}
				if err != nil {
					refused.Add(1) // the Service went away in between
					return nil
				}
				dialed.add(c.LocalAddr().String(), at, soakDial{service: s, done: time.Now()})
				c.Close()
				return nil
			})
		}
	}()

	start := time.Now()
	var samples []soakSample
	sample := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		rss, threads := procStatus(t, cmd.Process.Pid)
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
		n := int(nflows.Load())
		model.Frame(160, 48)
		node.mu.Lock()
		changes := len(node.changes)
		node.mu.Unlock()
		samples = append(samples, soakSample{at: time.Since(start), rssKiB: rss, fds: len(fds), threads: threads,
			goroutines: runtime.NumGoroutine(), heapKiB: int(ms.HeapInuse >> 10), storeKiB: int(store.Memory() >> 10),
			flows: n, stored: store.Retained(), changes: changes})
	}
	for time.Since(start) < dur {
		sample()
		time.Sleep(every)
	}
	sample()
	close(stop)
	wg.Wait()
	time.Sleep(time.Second) // the last flows' linger
	cmd.Process.Signal(syscall.SIGINT)
	if err := <-read; err != nil {
		t.Errorf("reading the trace stream: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tracer trace: %v; stderr %s", err, stderr.String())
	}

	// Every connection a backend accepted has its flow, with the rule in
	// force at its decision and the pod and Service the API server had
	// then; the recording, replayed, says the same.
	replayed := replaySoak(t, exe, rec)
	live, again := &soakTally{}, &soakTally{}
	dialed.each(func(client string, at time.Time, d soakDial) {
		be, ok := accepted.near(client, at)
		if !ok {
			return // the connection never reached a backend
		}
		live.check(node, cluster, &flows, client, at, d, be)
		again.check(node, cluster, replayed, client, at, d, be)
	})
	report := soakReport(dur, samples, live, again, int(refused.Load()), sum, stderr.String())
	t.Log(report)
	if path := os.Getenv("TRACER_SOAK_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, tl := range []struct {
		what string
		t    *soakTally
	}{{"live", live}, {"replayed", again}} {
		if tl.t.missing != 0 || tl.t.rules.wrong+tl.t.pods.wrong+tl.t.services.wrong != 0 {
			t.Errorf("%s: %d connections without a flow; wrong: %d rules, %d pods, %d Services: %q", tl.what, tl.t.missing,
				tl.t.rules.wrong, tl.t.pods.wrong, tl.t.services.wrong, tl.t.examples)
		}
	}
	if live.pods.right == 0 || live.services.right == 0 {
		t.Errorf("no flow named its pod (%d) or Service (%d) right: the metadata is not checked", live.pods.right, live.services.right)
	}
	if live.conns < int(dur.Seconds())*soakRate/2 {
		t.Errorf("only %d connections reached a backend in %s", live.conns, dur)
	}
	if sum.LostEvents != 0 || sum.StateChanges == 0 {
		t.Errorf("summary %+v: want no lost event and the rewrites recorded", sum)
	}
	q := len(samples) / 4
	first, last := samples[q], samples[len(samples)-1]
	if last.fds > first.fds+2 || last.goroutines > first.goroutines+8 || last.threads > first.threads+4 {
		t.Errorf("growing after the first quarter: fds %d -> %d, goroutines %d -> %d, threads %d -> %d",
			first.fds, last.fds, first.goroutines, last.goroutines, first.threads, last.threads)
	}
	if st, mem := maxOf(samples, func(s soakSample) int { return s.stored }), maxOf(samples, func(s soakSample) int { return s.storeKiB }); st > caps.Flows || int64(mem)<<10 > caps.Memory {
		t.Errorf("the UI store held up to %d flows and %d KiB, over its caps %+v", st, mem, caps)
	}
	if maxRSS := maxOf(samples, func(s soakSample) int { return s.rssKiB }); maxRSS > 200<<10 {
		t.Errorf("the tracer's resident memory reached %d MiB", maxRSS>>10)
	}
	if _, err := trace.ReadFile(rec); err != nil {
		t.Errorf("the recording: %v", err)
	}
}

type soakFlow struct {
	client, to, rule string
	// uncertain is the attribution's own doubt: set when the rule it
	// found disagrees with the kernel's NAT.
	uncertain bool
	time      time.Time
	// pod and service are the names the flow gives where it went.
	pod, service string
}

// readSoakStream reads the NDJSON stream of the tracer: each flow to the
// VIPs into flows and the store, the summary into sum.
func readSoakStream(r interface{ Read([]byte) (int, error) }, store *trace.Store, flows *connLog[soakFlow], n *atomic.Int64, sum *trace.Summary) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		var probe struct{ Type string }
		if err := json.Unmarshal(sc.Bytes(), &probe); err != nil {
			return err
		}
		switch probe.Type {
		case trace.TypeFlow:
			f := new(trace.Flow)
			if err := json.Unmarshal(sc.Bytes(), f); err != nil {
				return err
			}
			store.Append(f)
			sf := soakFlow{client: f.Orig.Src, time: f.Time}
			sf.fill(f)
			flows.add(sf.client, sf.time, sf)
			n.Add(1)
		case trace.TypeSummary:
			if err := json.Unmarshal(sc.Bytes(), sum); err != nil {
				return err
			}
		}
	}
	return sc.Err()
}

func backendIndex(addr string) int {
	ip, _, _ := strings.Cut(addr, ":")
	n, _ := strconv.Atoi(ip[strings.LastIndexByte(ip, '.')+1:])
	return n - 1
}

// procStatus reads VmRSS (KiB) and Threads of a process.
func procStatus(t *testing.T, pid int) (rssKiB, threads int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			rssKiB, _ = strconv.Atoi(fields[0])
		case "Threads":
			threads, _ = strconv.Atoi(fields[0])
		}
	}
	return rssKiB, threads
}

func maxOf(samples []soakSample, f func(soakSample) int) int {
	m := 0
	for _, s := range samples {
		m = max(m, f(s))
	}
	return m
}

// slope is the least-squares slope of y over the samples after the first
// quarter, per hour.
func slope(samples []soakSample, y func(soakSample) int) float64 {
	s := samples[len(samples)/4:]
	if len(s) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for _, p := range s {
		x, v := p.at.Hours(), float64(y(p))
		sx, sy, sxx, sxy = sx+x, sy+v, sxx+x*x, sxy+x*v
	}
	n := float64(len(s))
	if d := n*sxx - sx*sx; d != 0 {
		return (n*sxy - sx*sy) / d
	}
	return 0
}

func soakReport(dur time.Duration, samples []soakSample, live, replayed *soakTally, refused int, sum trace.Summary, stderr string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Soak: %s, %d new DNAT'd connections/s; every %s a Service's rule rewritten (its Service object created or deleted with it) and a backend's pod replaced by a new pod on the same IP, on a real API server\n\n", dur, soakRate, soakChurn)
	fmt.Fprintf(&b, "connections accepted by a backend: %d (refused: %d, their Service removed as they dialed)\n\n", live.conns, refused)
	b.WriteString("| checked against the truth | flows missing | right | in a change's window (the state before or after it) | wrong |\n|---|---|---|---|---|\n")
	for _, row := range []struct {
		what string
		t    *soakTally
	}{{"live", live}, {"replayed from --record", replayed}} {
		for _, c := range []struct {
			what string
			n    soakCount
		}{{"rule (the backend that accepted)", row.t.rules}, {"pod (the API server's, by IP)", row.t.pods}, {"Service (the API server's, by ClusterIP)", row.t.services}} {
			fmt.Fprintf(&b, "| %s: %s | %d | %d | %d | %d |\n", row.what, c.what, row.t.missing, c.n.right, c.n.lag, c.n.wrong)
		}
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "summary: %d flows, %d events, %d lost, %d state changes, %d conntrack overruns\n", sum.Flows, sum.Events, sum.LostEvents, sum.StateChanges, sum.ConntrackOverruns)
	fmt.Fprintf(&b, "slopes after the first quarter (per hour): tracer RSS %+.1f MiB, fds %+.1f, threads %+.1f; UI store %+.1f MiB; test process goroutines %+.1f\n",
		slope(samples, func(s soakSample) int { return s.rssKiB })/1024, slope(samples, func(s soakSample) int { return s.fds }),
		slope(samples, func(s soakSample) int { return s.threads }), slope(samples, func(s soakSample) int { return s.storeKiB })/1024,
		slope(samples, func(s soakSample) int { return s.goroutines }))
	b.WriteString("(the test process's heap holds the UI store and model and the soak's own log of every connection, which grows by design)\n\n")
	b.WriteString("| t | tracer RSS MiB | fds | threads | UI store MiB | flows in store | test goroutines | test heap MiB | flows | rewrites |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "| %s | %.1f | %d | %d | %.1f | %d | %d | %.1f | %d | %d |\n", s.at.Round(time.Second), float64(s.rssKiB)/1024, s.fds, s.threads,
			float64(s.storeKiB)/1024, s.stored, s.goroutines, float64(s.heapKiB)/1024, s.flows, s.changes)
	}
	if stderr != "" {
		fmt.Fprintf(&b, "\ntracer stderr: %s\n", stderr)
	}
	return b.String()
}
