package meta

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// connHealth watches every request the informers make to the API server.
// It is needed besides the informers' watch error handlers because client-go
// retries a refused connection inside the reflector without calling them:
// an API server that is down would otherwise go unnoticed.
type connHealth struct {
	now func() time.Time

	mu      sync.Mutex
	failing bool
	since   time.Time // first failure of the current outage
	err     string    // latest failure
}

func newConnHealth(now func() time.Time) *connHealth {
	if now == nil {
		now = time.Now
	}
	return &connHealth{now: now}
}

// wrap is a rest.Config.Wrap transport wrapper.
func (h *connHealth) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper{h: h, next: rt}
}

func (h *connHealth) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing {
		h.failing, h.since = true, h.now()
	}
	h.err = err.Error()
}

func (h *connHealth) ok() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failing, h.err = false, ""
}

// state returns since when requests fail and the latest error, or ok false.
func (h *connHealth) state() (since time.Time, err string, failing bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.since, h.err, h.failing
}

type roundTripper struct {
	h    *connHealth
	next http.RoundTripper
}

func (rt roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.next.RoundTrip(req)
	switch {
	case err != nil:
		// A request the informers cancelled (shutdown) says nothing
		// about the server.
		if req.Context().Err() == nil {
			rt.h.fail(err)
		}
		return resp, err
	case resp.StatusCode >= 500:
		// 503 while the API server starts or shuts down, 504 from a
		// proxy: the metadata is not being refreshed.
		rt.h.fail(errors.New("API server answered " + resp.Status))
	default:
		rt.h.ok()
	}
	// A watch's answer is a stream: a connection that breaks later is
	// seen only while reading it.
	resp.Body = &watchedBody{ReadCloser: resp.Body, h: rt.h, ctx: req.Context()}
	return resp, nil
}

type watchedBody struct {
	io.ReadCloser
	h   *connHealth
	ctx context.Context
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && b.ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		b.h.fail(err)
	}
	return n, err
}
