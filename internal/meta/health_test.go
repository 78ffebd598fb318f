package meta

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

type stubRT func(*http.Request) (*http.Response, error)

func (f stubRT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type brokenReader struct{}

func (brokenReader) Read([]byte) (int, error) {
	return 0, errors.New("read tcp: connection reset by peer")
}

func TestConnHealth(t *testing.T) {
	clk := newClock(time.Date(2026, 11, 28, 12, 0, 3, 0, time.UTC))
	h := newConnHealth(clk.Now)
	var next func() (*http.Response, error)
	rt := h.wrap(stubRT(func(*http.Request) (*http.Response, error) { return next() }))
	get := func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://api/api/v1/pods?watch=true", nil)
		return rt.RoundTrip(req)
	}
	answer := func(code int, body io.Reader) func() (*http.Response, error) {
		return func() (*http.Response, error) {
			return &http.Response{StatusCode: code, Status: http.StatusText(code), Body: io.NopCloser(body)}, nil
		}
	}
	if _, _, bad := h.state(); bad {
		t.Fatal("failing before any request")
	}
	next = func() (*http.Response, error) {
		return nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
	}
	get(t.Context())
	clk.Add(5 * time.Second)
	get(t.Context())
	since, err, bad := h.state()
	if !bad || !since.Equal(time.Date(2026, 11, 28, 12, 0, 3, 0, time.UTC)) || !strings.Contains(err, "connection refused") {
		t.Errorf("after refused: since %v err %q failing %v; want the first failure's time", since, err, bad)
	}
	next = answer(200, strings.NewReader("{}"))
	get(t.Context())
	if _, _, bad := h.state(); bad {
		t.Error("still failing after a successful request")
	}
	next = answer(503, strings.NewReader(""))
	get(t.Context())
	if _, err, bad := h.state(); !bad || !strings.Contains(err, "Service Unavailable") {
		t.Errorf("after 503: %q %v", err, bad)
	}
	// A watch stream that breaks after a good start.
	next = answer(200, brokenReader{})
	resp, _ := get(t.Context())
	if _, _, bad := h.state(); bad {
		t.Error("a watch that started fine counts as failing")
	}
	io.ReadAll(resp.Body)
	if _, err, bad := h.state(); !bad || !strings.Contains(err, "connection reset") {
		t.Errorf("after a broken watch: %q %v", err, bad)
	}
	// Requests the informers cancel themselves are no failure.
	h.ok()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	next = func() (*http.Response, error) { return nil, context.Canceled }
	get(ctx)
	if _, err, bad := h.state(); bad {
		t.Errorf("cancelled request counted as failure: %q", err)
	}
}
