package kubeproxy

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netns"
)

// NetnsPrefix starts the name of every network namespace this package
// creates.
const NetnsPrefix = "trkp-"

// newNetnsName is NetnsPrefix and 8 random hex digits.
func newNetnsName() string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("read random netns name: %v", err))
	}
	return NetnsPrefix + hex.EncodeToString(b)
}

// run runs a command and returns its standard output; the error carries
// standard error.
func run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// listenIn opens a TCP listener on addr inside the named network namespace.
// The socket stays in that namespace for its whole life, whichever thread
// later accepts on it; only its creation needs a thread switched into the
// namespace. The switch happens on a goroutine of its own, locked to its
// thread: if switching back fails, the goroutine returns still locked and
// the Go runtime discards that thread instead of reusing it in the wrong
// namespace.
func listenIn(name, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("open own network namespace: %w", err)}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(name)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("open network namespace %s: %w", name, err)}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("enter network namespace %s: %w", name, err)}
			return
		}
		l, lerr := net.Listen("tcp", addr)
		if err := netns.Set(orig); err != nil {
			if l != nil {
				l.Close()
			}
			ch <- result{err: fmt.Errorf("return from network namespace %s: %w", name, err)}
			return // still locked: the runtime ends this thread
		}
		runtime.UnlockOSThread()
		if lerr != nil {
			ch <- result{err: fmt.Errorf("listen on %s in %s: %w", addr, name, lerr)}
			return
		}
		ch <- result{l: l}
	}()
	r := <-ch
	return r.l, r.err
}

// forwarder accepts connections on a listener inside the kube-proxy
// namespace and relays each to an address the test process reaches from
// its own namespace (the API server on the host's loopback). The bytes are
// relayed as they are: TLS runs end to end between kube-proxy and
// kube-apiserver.
type forwarder struct {
	l      net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func newForwarder(l net.Listener, target string) *forwarder {
	f := &forwarder{l: l, target: target, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return f
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go f.relay(c)
	}
}

func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) relay(in net.Conn) {
	defer f.wg.Done()
	if !f.track(in) {
		return
	}
	out, err := net.Dial("tcp", f.target)
	if err != nil {
		in.Close()
		return
	}
	if !f.track(out) {
		in.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
	in.Close()
	out.Close()
	f.mu.Lock()
	delete(f.conns, in)
	delete(f.conns, out)
	f.mu.Unlock()
}

// Close stops accepting, cuts every relayed connection and waits for the
// relays to end.
func (f *forwarder) Close() error {
	f.mu.Lock()
	f.closed = true
	err := f.l.Close()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
